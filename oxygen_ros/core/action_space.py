"""Action spaces: what a checkpoint's action dimensions mean, and how they become robot commands.

A π0.5 checkpoint outputs (after unnormalisation) whatever its training data held. The public
families differ (openpi ``src/openpi/training/config.py``, ``policies/{aloha,droid}_policy.py``,
``transforms.py``; LeRobot ``processor/relative_action_processor.py``):

* **absolute** — joint positions, sent as they are (LeRobot default; openpi ``pi05_libero``'s
  outputs pass through untransformed, see ``ee_delta``);
* **delta** — joint positions relative to the state at observation time, per-joint mask: openpi
  ``DeltaActions`` / ``AbsoluteActions`` (``make_bool_mask(6, -1, 6, -1)`` for ALOHA: arm joints
  relative, grippers absolute), LeRobot ``use_relative_actions`` with ``relative_exclude_joints``;
* **velocity** — joint velocities (openpi ``pi05_droid``: 7 joint velocities + 1 gripper
  position), never sent as positions;
* **ee_delta** — end-effector displacement commands (LIBERO: ``[dx, dy, dz, droll, dpitch, dyaw,
  gripper]``), passed to an end-effector controller unchanged, never as joint positions.

``absolute_joints`` names the joints whose action is an absolute position whatever the kind (the
ALOHA grippers in a delta space, the DROID gripper in a velocity space). openpi's ALOHA policy
also flips joint signs and converts the gripper between the robot's linear units and π0's
angular space (``adapt_to_pi``); these are ``flip_joints`` and ``gripper_conversion: aloha``.

Order of the conversions, as openpi applies them: state (robot) → flip → gripper to angular →
*model-space state* (normalised, prompted). Actions: unnormalise → delta dims ``+= model-space
state`` → flip → gripper from angular → robot command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import ConfigError

KINDS: tuple[str, ...] = ("absolute", "delta", "velocity", "ee_delta")
GRIPPER_CONVERSIONS: tuple[str, ...] = ("none", "aloha")


def _norm(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return (x - lo) / (hi - lo)


def _unnorm(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return x * (hi - lo) + lo


def aloha_gripper_to_angular(value: np.ndarray) -> np.ndarray:
    """ALOHA gripper state (linear, normalised) → π0 angular space (openpi ``_gripper_to_angular``).

    Linear position in metres from PUPPET_GRIPPER_POSITION_{CLOSED,OPEN} = (0.01844, 0.05800), the
    inverse of Interbotix's angle→linear map (arm 0.036 m, horn 0.022 m), normalised over the
    radian range (0.5476, 1.6296) of π0's gripper encoder counts.
    """
    lin = _unnorm(np.asarray(value, np.float64), 0.01844, 0.05800)
    arm, horn = 0.036, 0.022
    rad = np.arcsin(np.clip((horn**2 + lin**2 - arm**2) / (2 * horn * lin), -1.0, 1.0))
    return _norm(rad, 0.5476, 1.6296)


def aloha_gripper_from_angular(value: np.ndarray) -> np.ndarray:
    """π0 angular gripper action → ALOHA gripper command (openpi ``_gripper_from_angular``):
    ``+ 0.5476``, normalised over PUPPET_GRIPPER_JOINT_{CLOSE,OPEN} = (-0.6213, 1.4910)."""
    return _norm(np.asarray(value, np.float64) + 0.5476, -0.6213, 1.4910)


def aloha_gripper_from_angular_inv(value: np.ndarray) -> np.ndarray:
    """Inverse of :func:`aloha_gripper_from_angular` (openpi ``_gripper_from_angular_inv``, used on
    recorded commands when computing norm stats)."""
    return _unnorm(np.asarray(value, np.float64), -0.6213, 1.4910) - 0.5476


@dataclass(frozen=True)
class ActionSpaceConfig:
    """How a checkpoint's action dims map to robot commands (ROS parameters ``action_space.*``).

    Attributes:
        kind: ``absolute`` | ``delta`` | ``velocity`` | ``ee_delta`` (see the module doc).
        absolute_joints: joints whose action is an absolute position in a ``delta`` or ``velocity``
            space (grippers); every other joint has the space's kind.
        flip_joints: joints whose sign differs between robot and model (openpi ALOHA
            ``_joint_flip_mask``: both shoulders and elbows).
        gripper_joints: joints converted with ``gripper_conversion``.
        gripper_conversion: ``none`` | ``aloha`` (openpi ``adapt_to_pi`` gripper conversions).
    """

    kind: str = "absolute"
    absolute_joints: tuple[str, ...] = ()
    flip_joints: tuple[str, ...] = ()
    gripper_joints: tuple[str, ...] = ()
    gripper_conversion: str = "none"

    def validate(self) -> ActionSpaceConfig:
        """Raise :class:`ConfigError` naming the first invalid field."""

        def bad(name: str, value: object, why: str) -> ConfigError:
            return ConfigError(f"action_space.{name}={value!r} is invalid: {why}")

        if self.kind not in KINDS:
            raise bad("kind", self.kind, f"must be one of {KINDS}")
        if self.gripper_conversion not in GRIPPER_CONVERSIONS:
            raise bad("gripper_conversion", self.gripper_conversion, f"must be one of {GRIPPER_CONVERSIONS}")
        for name in ("absolute_joints", "flip_joints", "gripper_joints"):
            v = getattr(self, name)
            if len(set(v)) != len(v):
                raise bad(name, list(v), "names must be unique")
        if self.absolute_joints and self.kind in ("absolute", "ee_delta"):
            raise bad(
                "absolute_joints",
                list(self.absolute_joints),
                f"only meaningful with kind delta or velocity (kind is {self.kind!r}); "
                "set action_space.absolute_joints: []",
            )
        if bool(self.gripper_joints) != (self.gripper_conversion != "none"):
            raise bad(
                "gripper_joints",
                list(self.gripper_joints),
                f"gripper_joints and gripper_conversion (={self.gripper_conversion!r}) go together",
            )
        if self.kind == "velocity" and set(self.gripper_joints) - set(self.absolute_joints):
            raise bad(
                "gripper_joints",
                list(self.gripper_joints),
                "a gripper conversion applies to positions: list these joints in absolute_joints too",
            )
        return self


@dataclass
class RobotCommand:
    """An action chunk in the robot's command interfaces (robot units, finite).

    Attributes:
        position_joints: names of the position dims; positions ``[H, len(position_joints)]``.
        velocity_joints: names of the velocity dims; velocities ``[H, len(velocity_joints)]``.
        ee_names: names of end-effector command dims (``ee_delta``); ee ``[H, len(ee_names)]``.
    """

    position_joints: tuple[str, ...]
    positions: np.ndarray
    velocity_joints: tuple[str, ...] = ()
    velocities: np.ndarray | None = None
    ee_names: tuple[str, ...] = ()
    ee: np.ndarray | None = None


class ActionSpace:
    """An :class:`ActionSpaceConfig` bound to the robot's action and state names.

    Args:
        cfg: the configuration.
        joint_names: the action dims in checkpoint order.
        state_names: the state dims in checkpoint order (default: ``joint_names``). Flips and
            gripper conversions apply to the dims of either list by name; a delta action dim is
            anchored on the state dim of the same name.

    Raises:
        ConfigError: an invalid field, a listed joint in neither list, or a delta joint without a
            state dim of its name (named).
    """

    def __init__(
        self,
        cfg: ActionSpaceConfig,
        joint_names: tuple[str, ...] | list[str],
        state_names: tuple[str, ...] | list[str] | None = None,
    ) -> None:
        self.cfg = cfg.validate()
        self.joint_names = tuple(joint_names)
        self.state_names = tuple(state_names) if state_names else self.joint_names
        known = set(self.joint_names) | set(self.state_names)
        for name in ("absolute_joints", "flip_joints", "gripper_joints"):
            pool = self.joint_names if name == "absolute_joints" else known
            unknown = [j for j in getattr(cfg, name) if j not in pool]
            if unknown:
                raise ConfigError(f"action_space.{name}: {unknown} not in joint_names {list(self.joint_names)}")

        def mask(names: tuple[str, ...], chosen: tuple[str, ...]) -> np.ndarray:
            return np.array([n in chosen for n in names], bool)

        self.absolute = mask(self.joint_names, cfg.absolute_joints)
        self.sign = np.where(mask(self.joint_names, cfg.flip_joints), -1.0, 1.0)
        self.gripper = mask(self.joint_names, cfg.gripper_joints)
        self.state_sign = np.where(mask(self.state_names, cfg.flip_joints), -1.0, 1.0)
        self.state_gripper = mask(self.state_names, cfg.gripper_joints)
        self.delta = ~self.absolute if cfg.kind == "delta" else np.zeros(len(self.joint_names), bool)
        self.velocity = ~self.absolute if cfg.kind == "velocity" else np.zeros(len(self.joint_names), bool)
        no_state = [j for j, d in zip(self.joint_names, self.delta) if d and j not in self.state_names]
        if no_state:
            raise ConfigError(
                f"action_space.kind='delta': joints {no_state} have no state dim of that name "
                f"(state_joint_names {list(self.state_names)}); list them in action_space.absolute_joints"
            )
        self.anchor = np.array(
            [self.state_names.index(j) if d else 0 for j, d in zip(self.joint_names, self.delta)], dtype=np.int64
        )

    @property
    def kind(self) -> str:
        """The configured kind."""
        return self.cfg.kind

    @property
    def is_identity(self) -> bool:
        """True when actions go out unchanged as joint positions and the state goes in unchanged."""
        return self.kind == "absolute" and not self.cfg.flip_joints and not self.cfg.gripper_joints

    def _check(self, x: np.ndarray, what: str, ndim: int, state: bool = False) -> np.ndarray:
        a = np.asarray(x, np.float64)
        n = len(self.state_names if state else self.joint_names)
        if a.ndim != ndim or a.shape[-1] != n:
            raise ValueError(f"{what} must have shape {'[H, ' if ndim == 2 else '['}{n}], got {list(a.shape)}")
        return a

    def state_to_model(self, state: np.ndarray, dtype: type = np.float32) -> np.ndarray:
        """Robot state ``[n]`` (robot units) → model-space state ``[n]`` of ``dtype`` (flip, gripper
        to angular; openpi ``_decode_state``). Identity without flips/conversions.

        Raises:
            ValueError: wrong shape.
        """
        s = self._check(state, "state", 1, state=True) * self.state_sign
        if self.cfg.gripper_conversion == "aloha":
            s[self.state_gripper] = aloha_gripper_to_angular(s[self.state_gripper])
        return s.astype(dtype)

    def to_robot(self, actions: np.ndarray, model_state: np.ndarray) -> RobotCommand:
        """Unnormalised model actions ``[H, n]`` → robot command.

        Args:
            actions: ``[H, n]`` model-space actions (the policy's unnormalised output).
            model_state: ``[n_state]`` the observation's state in model space
                (:meth:`state_to_model`), the anchor of delta dims.

        Returns:
            :class:`RobotCommand`: positions for absolute/delta dims (delta dims ``+= state``),
            velocities for velocity dims, ee commands for ``ee_delta``; flipped and converted.

        Raises:
            ValueError: wrong shapes, or a non-finite result (nothing non-finite leaves).
        """
        a = self._check(actions, "actions", 2).copy()
        s = self._check(model_state, "model_state", 1, state=True)
        a[:, self.delta] += s[self.anchor[self.delta]]
        a *= self.sign
        if self.cfg.gripper_conversion == "aloha":
            a[:, self.gripper] = aloha_gripper_from_angular(a[:, self.gripper])
        if not np.isfinite(a).all():
            raise ValueError("robot command is not finite")
        names = np.asarray(self.joint_names, dtype=object)
        if self.kind == "ee_delta":
            return RobotCommand((), np.zeros((a.shape[0], 0)), ee_names=self.joint_names, ee=a)
        pos = ~self.velocity
        return RobotCommand(tuple(names[pos]), a[:, pos], tuple(names[self.velocity]), a[:, self.velocity])

    def to_model(self, commands: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Recorded robot commands ``[T, n]`` (robot units: positions / velocities / ee commands as
        the kind says) with the robot states ``[T, n_state]`` at those times → model-space actions
        ``[T, n]`` (openpi ``_encode_actions_inv`` then ``DeltaActions``). Used for norm stats.

        Raises:
            ValueError: wrong shapes.
        """
        a: np.ndarray = self._check(commands, "commands", 2).copy()
        st = self._check(state, "state", 2, state=True)
        if a.shape[0] != st.shape[0]:
            raise ValueError(f"commands ({a.shape[0]}) and states ({st.shape[0]}) differ in length")
        a *= self.sign
        if self.cfg.gripper_conversion == "aloha":
            a[:, self.gripper] = aloha_gripper_from_angular_inv(a[:, self.gripper])
        model_state = np.stack([self.state_to_model(s, np.float64) for s in st]) if len(st) else st
        a[:, self.delta] -= model_state[:, self.anchor[self.delta]]
        return a


def checkpoint_convention(
    raw_config: dict[str, Any], processor_steps: list[dict[str, Any]] | None = None
) -> dict[str, Any] | None:
    """The action convention a LeRobot checkpoint states about itself, or None if it states none.

    Reads ``config.json`` (``use_relative_actions``, ``relative_exclude_joints``,
    ``action_feature_names`` of LeRobot's ``PI05Config``) and the ``relative_actions_processor``
    step of ``policy_preprocessor.json`` when given (``enabled``, ``exclude_joints``,
    ``action_names``). openpi checkpoints state nothing (their convention lives in the training
    config, not in the converted folder).

    Returns:
        ``{"relative": bool, "exclude": [...], "action_names": [...] | None, "source": str}``.
    """
    step = next(
        (
            s.get("config", {})
            for s in processor_steps or []
            if s.get("registry_name") in ("relative_actions_processor", "delta_actions_processor")
        ),
        None,
    )
    if "use_relative_actions" not in raw_config and step is None:
        return None
    rel = bool(raw_config.get("use_relative_actions", False)) or bool((step or {}).get("enabled", False))
    exclude = list(raw_config.get("relative_exclude_joints") or (step or {}).get("exclude_joints") or [])
    names = raw_config.get("action_feature_names") or (step or {}).get("action_names")
    src = f"use_relative_actions={'true' if rel else 'false'}"
    if rel:
        src += f", relative_exclude_joints={exclude}"
    return {"relative": rel, "exclude": exclude, "action_names": list(names) if names else None, "source": src}


def check_against_checkpoint(space: ActionSpace, convention: dict[str, Any] | None, where: str) -> None:
    """Raise unless the configured action space is the one the checkpoint states.

    LeRobot's rule for the relative mask (``RelativeActionsProcessorStep._build_mask``): a dim is
    kept absolute when its action name (lower case) contains one of ``exclude``; without action
    names every dim is relative.

    Args:
        space: the configured space; convention: :func:`checkpoint_convention`; where: the file it
            came from (for the message).

    Raises:
        ConfigError: naming the parameter (``action_space.kind`` / ``action_space.absolute_joints``)
            and the checkpoint's setting.
    """
    if convention is None:
        return
    openpi_only = [
        name
        for name, on in (
            ("action_space.flip_joints", space.cfg.flip_joints),
            ("action_space.gripper_conversion", space.cfg.gripper_conversion != "none"),
        )
        if on
    ]
    if openpi_only:
        raise ConfigError(
            f"{' and '.join(openpi_only)} are openpi's ALOHA runtime conventions (openpi "
            f"src/openpi/policies/aloha_policy.py, adapt_to_pi), but {where} is a LeRobot checkpoint "
            "(it says " + convention["source"] + "), whose processors flip no joint and convert no "
            "gripper: for a LeRobot pi0.5 ALOHA checkpoint use config/aloha_lerobot.yaml, otherwise "
            "leave them unset"
        )
    if not convention["relative"]:
        if space.kind == "delta":
            raise ConfigError(
                f"action_space.kind='delta' but {where} says {convention['source']}: the checkpoint "
                "outputs absolute positions; set action_space.kind: absolute"
            )
        return
    if space.kind != "delta":
        raise ConfigError(
            f"action_space.kind={space.kind!r} but {where} says {convention['source']}: the checkpoint "
            "outputs joint deltas relative to the state; set action_space.kind: delta"
        )
    names = convention["action_names"] or space.joint_names
    tokens = [str(t).lower() for t in convention["exclude"] if t]
    expected = [
        j
        for j, n in zip(space.joint_names, names)
        if convention["action_names"] and any(t in str(n).lower() for t in tokens)
    ]
    if sorted(expected) != sorted(space.cfg.absolute_joints):
        raise ConfigError(
            f"action_space.absolute_joints={list(space.cfg.absolute_joints)} but {where} says "
            f"{convention['source']}, which keeps {expected} absolute"
        )


__all__ = [
    "checkpoint_convention",
    "check_against_checkpoint",
    "KINDS",
    "GRIPPER_CONVERSIONS",
    "ActionSpaceConfig",
    "ActionSpace",
    "RobotCommand",
    "aloha_gripper_to_angular",
    "aloha_gripper_from_angular",
    "aloha_gripper_from_angular_inv",
]
