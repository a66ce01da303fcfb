"""What the node builds from its parameters, shared by the node and the offline replay.

Keeping it in one place guarantees that ``replay`` evaluates exactly the configuration the node
would run: the same policy checks and the same observation-assembler settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from oxygen_ros.core.action_space import ActionSpace, check_against_checkpoint, checkpoint_convention
from oxygen_ros.core.model.ckpt_files import action_convention_files
from oxygen_ros.ros.params.model_access import confine_model
from oxygen_ros.streams.observation import AssemblerConfig

if TYPE_CHECKING:
    import torch

    from oxygen_ros.core.policy import Pi05Policy
    from oxygen_ros.ros.params.node_config import NodeConfig


def load_policy(cfg: NodeConfig, model: str | None = None) -> Pi05Policy:
    """Load the node's policy (``model`` overrides ``cfg.model``) and check it fits the robot.

    Raises:
        ValueError: a configured camera has no model image slot, the joint count differs from
            the checkpoint's state/action dimension, or the action space contradicts the
            checkpoint (:func:`action_space`; the message names the parameter), or the checkpoint
            lies outside ``model_folders`` (:func:`~oxygen_ros.ros.params.model_access.confine_model`).
        Exception: checkpoint loading errors (``CheckpointError`` naming the file, ``ConfigError``,
            ``OSError``); a ``device`` the machine does not have (:func:`resolve_device`).
    """
    import torch

    from oxygen_ros.core.policy import Pi05Policy

    action_space(cfg, model)  # the parameter file against the checkpoint's own convention, first
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    dtype = getattr(torch, cfg.dtype) if cfg.dtype else None
    source = confine_model(model or cfg.model, cfg.model_folders)  # checked again right before loading
    policy = Pi05Policy.from_pretrained(
        source, device=resolve_device(cfg.device), dtype=dtype, robot_dim=len(cfg.joint_names), weights=cfg.weights
    )
    check_policy(cfg, policy)
    return policy


def action_space(cfg: NodeConfig, model: str | None = None) -> ActionSpace:
    """The configured action space bound to ``joint_names``, checked against what the checkpoint
    folder says about its own actions (LeRobot ``use_relative_actions``; presets state nothing).

    Raises:
        ValueError: a listed joint not in ``joint_names``, or a kind/mask that contradicts the
            checkpoint's config (the message names the parameter and the checkpoint's setting), or
            the checkpoint lies outside ``model_folders`` (checked before any file is read).
    """
    space = ActionSpace(cfg.action_space, cfg.joint_names, cfg.state_joint_names or cfg.joint_names)
    folder = Path(confine_model(str(model or cfg.model), cfg.model_folders)).expanduser()
    if folder.is_dir():
        raw, steps = action_convention_files(folder)  # CheckpointError naming a malformed file / field
        check_against_checkpoint(space, checkpoint_convention(raw, steps), str(folder / "config.json"))
    return space


def resolve_device(device: str) -> torch.device:
    """The torch device the ``device`` parameter names (``''``: CUDA if available, else the CPU).

    Raises:
        ValueError: naming the ``device`` parameter and the devices this machine has: not a device
            name, CUDA without CUDA (no GPU visible, or a CPU-only torch), ``cuda:N`` beyond the
            device count, or a device type the node does not run on.
    """
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    have = ["cpu"] + (["cuda"] + [f"cuda:{i}" for i in range(n)] if n else []) + (["mps"] if mps else [])
    hint = f"; this machine has {have} (device:='' picks CUDA when present, else the CPU)"
    if not device:
        return torch.device("cuda" if n else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"parameter device={device!r} is not a torch device name" + hint) from None
    if dev.type == "cuda" and not n:
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise ValueError(f"parameter device={device!r}: {why}" + hint)
    if dev.type == "cuda" and dev.index is not None and dev.index >= n:
        names = ", ".join(f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(n))
        raise ValueError(f"parameter device={device!r}: there are {n} CUDA device(s) ({names})" + hint)
    if dev.type not in ("cpu", "cuda", "mps") or (dev.type == "mps" and not mps) or (dev.type == "cpu" and dev.index):
        raise ValueError(f"parameter device={device!r}: not a device the node runs on" + hint)
    return dev


def check_policy(cfg: NodeConfig, policy: Pi05Policy) -> None:
    """Raise ``ValueError`` when ``policy`` does not fit the cameras and joints of ``cfg``."""
    slots = tuple(policy.cfg.image_slots)
    unknown = sorted(set(cfg.cameras) - set(slots))
    if unknown:
        raise ValueError(
            f"cameras.{unknown[0]}.topic: the model has no image slot {unknown[0]!r} (slots: {list(slots)})"
        )
    width = policy.cfg.action_dim
    if len(cfg.joint_names) > width:
        raise ValueError(
            f"joint_names has {len(cfg.joint_names)} joints but pi0.5 actions are at most {width} wide "
            f"(the model's padded action dimension): command at most {width} joints with this "
            "policy and leave the rest (e.g. legs) to their own controllers"
        )
    state_names = cfg.state_joint_names or cfg.joint_names
    for what, dim, param, names in (
        (
            "state",
            policy.normalizer.state_dim,
            "state_joint_names"
            if cfg.state_joint_names and cfg.state_joint_names != cfg.joint_names
            else "joint_names",
            state_names,
        ),
        ("action", policy.normalizer.action_dim, "joint_names", cfg.joint_names),
    ):
        if dim != len(names):
            raise ValueError(f"{param} has {len(names)} names but the model {what} dimension is {dim}")


def assembler_config(cfg: NodeConfig, slots: tuple[str, ...]) -> AssemblerConfig:
    """Observation-assembler settings from the node parameters."""
    return AssemblerConfig(
        slots=slots,
        cameras=tuple(s for s in slots if s in cfg.cameras),
        state_tolerance_s=cfg.state_tolerance_s,
        camera_max_age_s=cfg.camera_max_age_s,
        time_jump_s=cfg.time_jump_s,
        labels={s: t for s, (t, _) in cfg.cameras.items()},
    )
