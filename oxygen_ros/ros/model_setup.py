"""What the node builds from its parameters, shared by the node and the offline replay.

Keeping it in one place guarantees that ``replay`` evaluates exactly the configuration the node
would run: the same policy checks and the same observation-assembler settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from oxygen_ros.core.action_space import ActionSpace, check_against_checkpoint, checkpoint_convention

from oxygen_ros.ros.observation import AssemblerConfig

if TYPE_CHECKING:
    from oxygen_ros.core.policy import Pi05Policy
    from oxygen_ros.ros.params.node_config import NodeConfig


def load_policy(cfg: "NodeConfig", model: str | None = None) -> "Pi05Policy":
    """Load the node's policy (``model`` overrides ``cfg.model``) and check it fits the robot.

    Raises:
        ValueError: a configured camera has no model image slot, the joint count differs from
            the checkpoint's state/action dimension, or the action space contradicts the
            checkpoint (:func:`action_space`; the message names the parameter).
        Exception: checkpoint loading errors (``CheckpointError``, ``ConfigError``, ``OSError``).
    """
    import torch

    from oxygen_ros.core.policy import Pi05Policy

    action_space(cfg, model)  # the parameter file against the checkpoint's own convention, first
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    dtype = getattr(torch, cfg.dtype) if cfg.dtype else None
    policy = Pi05Policy.from_pretrained(model or cfg.model, device=cfg.device or None, dtype=dtype,
                                        robot_dim=len(cfg.joint_names))
    check_policy(cfg, policy)
    return policy


def action_space(cfg: "NodeConfig", model: str | None = None) -> ActionSpace:
    """The configured action space bound to ``joint_names``, checked against what the checkpoint
    folder says about its own actions (LeRobot ``use_relative_actions``; presets state nothing).

    Raises:
        ValueError: a listed joint not in ``joint_names``, or a kind/mask that contradicts the
            checkpoint's config (the message names the parameter and the checkpoint's setting).
    """
    space = ActionSpace(cfg.action_space, cfg.joint_names, cfg.state_joint_names or cfg.joint_names)
    folder = Path(str(model or cfg.model)).expanduser()
    if folder.is_dir():
        raw = _json(folder / 'config.json')
        steps = _json(folder / 'policy_preprocessor.json').get('steps', [])
        check_against_checkpoint(space, checkpoint_convention(raw, steps if isinstance(steps, list) else []),
                                 str(folder / 'config.json'))
    return space


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding='utf-8')) if path.is_file() else {}
    except (OSError, ValueError):
        return {}  # the loader reports unreadable checkpoint files
    return data if isinstance(data, dict) else {}


def check_policy(cfg: "NodeConfig", policy: "Pi05Policy") -> None:
    """Raise ``ValueError`` when ``policy`` does not fit the cameras and joints of ``cfg``."""
    slots = tuple(policy.cfg.image_slots)
    unknown = sorted(set(cfg.cameras) - set(slots))
    if unknown:
        raise ValueError(f'cameras.{unknown[0]}.topic: the model has no image slot '
                         f'{unknown[0]!r} (slots: {list(slots)})')
    state_names = cfg.state_joint_names or cfg.joint_names
    for what, dim, param, names in (('state', policy.normalizer.state_dim, 'state_joint_names' if cfg.state_joint_names
                                     and cfg.state_joint_names != cfg.joint_names else 'joint_names', state_names),
                                    ('action', policy.normalizer.action_dim, 'joint_names', cfg.joint_names)):
        if dim != len(names):
            raise ValueError(f'{param} has {len(names)} names but the model {what} dimension is {dim}')


def assembler_config(cfg: "NodeConfig", slots: tuple[str, ...]) -> AssemblerConfig:
    """Observation-assembler settings from the node parameters."""
    return AssemblerConfig(
        slots=slots, cameras=tuple(s for s in slots if s in cfg.cameras),
        state_tolerance_s=cfg.state_tolerance_s, camera_max_age_s=cfg.camera_max_age_s,
        time_jump_s=cfg.time_jump_s, labels={s: t for s, (t, _) in cfg.cameras.items()})
