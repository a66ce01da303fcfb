"""What the node builds from its parameters, shared by the node and the offline replay.

Keeping it in one place guarantees that ``replay`` evaluates exactly the configuration the node
would run: the same policy checks and the same observation-assembler settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oxygen_ros.ros.observation import AssemblerConfig

if TYPE_CHECKING:
    from oxygen_ros.core.policy import Pi05Policy
    from oxygen_ros.ros.node_params import NodeConfig


def load_policy(cfg: "NodeConfig", model: str | None = None) -> "Pi05Policy":
    """Load the node's policy (``model`` overrides ``cfg.model``) and check it fits the robot.

    Raises:
        ValueError: a configured camera has no model image slot, or the joint count differs from
            the checkpoint's state/action dimension (the message names the parameter).
        Exception: checkpoint loading errors (``CheckpointError``, ``ConfigError``, ``OSError``).
    """
    import torch

    from oxygen_ros.core.policy import Pi05Policy

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    dtype = getattr(torch, cfg.dtype) if cfg.dtype else None
    policy = Pi05Policy.from_pretrained(model or cfg.model, device=cfg.device or None, dtype=dtype,
                                        robot_dim=len(cfg.joint_names))
    check_policy(cfg, policy)
    return policy


def check_policy(cfg: "NodeConfig", policy: "Pi05Policy") -> None:
    """Raise ``ValueError`` when ``policy`` does not fit the cameras and joints of ``cfg``."""
    slots = tuple(policy.cfg.image_slots)
    unknown = sorted(set(cfg.cameras) - set(slots))
    if unknown:
        raise ValueError(f'cameras.{unknown[0]}.topic: the model has no image slot '
                         f'{unknown[0]!r} (slots: {list(slots)})')
    for what, dim in (('state', policy.normalizer.state_dim), ('action', policy.normalizer.action_dim)):
        if dim != len(cfg.joint_names):
            raise ValueError(f'joint_names has {len(cfg.joint_names)} names but the model '
                             f'{what} dimension is {dim}')


def assembler_config(cfg: "NodeConfig", slots: tuple[str, ...]) -> AssemblerConfig:
    """Observation-assembler settings from the node parameters."""
    return AssemblerConfig(
        slots=slots, cameras=tuple(s for s in slots if s in cfg.cameras),
        state_tolerance_s=cfg.state_tolerance_s, camera_max_age_s=cfg.camera_max_age_s,
        time_jump_s=cfg.time_jump_s, labels={s: t for s, (t, _) in cfg.cameras.items()})
