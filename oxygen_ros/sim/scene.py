"""Headless ALOHA bimanual simulation (gym-aloha's MuJoCo transfer-cube scene) and a scripted motion.

The scene is built from gym-aloha's MJCF and task classes (``gym_aloha.tasks.sim.TransferCubeTask``)
through dm_control, but without gym-aloha's per-step 480x640 renders of three cameras: this wrapper
renders only the cameras asked for, at a small size, and only when asked (``render()``). Nothing here
knows about ROS or bags; ``record_sim_bag`` and the sim node build on it. The scripted pick-and-lift
and the success detector live in :mod:`oxygen_ros.sim.task`.

Joint vector (14, ALOHA order, see ``JOINT_NAMES``): per arm waist, shoulder, elbow, forearm_roll,
wrist_angle, wrist_rotate in radians, then the gripper as gym-aloha's *normalised* finger opening
(0 = closed, 1 = open; the finger limits make a gripper read about 0.06 fully closed and 0.97
fully open, about 0.6 closed on the 4 cm cube). Commands use the same units; all joints are
position-controlled by the sim's actuators.

Cameras (names from the MJCF; ``CAMERA_SLOTS`` maps them to the π0.5 image slots):
``top`` (fixed, above the table looking down) -> ``base_0_rgb``; ``left_wrist`` / ``right_wrist``
(mounted on each gripper link, behind and above the fingers, narrow 20° field of view, looking
along the fingers) -> ``left_wrist_0_rgb`` / ``right_wrist_0_rgb``. Other cameras in the MJCF:
``left_pillar``, ``right_pillar``, ``angle``, ``front_close``.

MuJoCo renders through ``MUJOCO_GL`` (defaulted to ``egl``, which works headless on CPU).
``mujoco``/``gym_aloha``/``dm_control`` are imported only when a ``SimScene`` is created.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

_ARM_JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate")
JOINT_NAMES: tuple[str, ...] = tuple(
    f"{side}_{joint}" for side in ("left", "right") for joint in (*_ARM_JOINTS, "gripper")
)
"""The 14 joint names in ALOHA order (left arm 6 + left gripper, right arm 6 + right gripper)."""

CONTROL_RATE_HZ = 50.0
"""gym-aloha's control rate (``DT = 0.02`` s; 10 physics steps of 2 ms per control step)."""

CAMERA_SLOTS: dict[str, str] = {
    "base_0_rgb": "top",
    "left_wrist_0_rgb": "left_wrist",
    "right_wrist_0_rgb": "right_wrist",
}
"""π0.5 image slot -> MJCF camera name."""

DEFAULT_CAMERAS: tuple[str, ...] = tuple(CAMERA_SLOTS.values())
DEFAULT_IMAGE_SIZE: tuple[int, int] = (240, 320)
"""Default render size as (height, width): the real ALOHA cameras' 3:4 aspect at half of 480x640."""

CUBE_REST_Z = 0.02  # cube centre height when resting on the table (4 cm cube), metres
GRIPPER_OPEN = 1.0
GRIPPER_CLOSED = 0.0


def _make_task_class() -> type:
    """gym-aloha's transfer-cube task with an observation that renders nothing (renders are ours)."""
    from gym_aloha.tasks.sim import TransferCubeTask

    class _NoRenderTransferCube(TransferCubeTask):
        def get_observation(self, physics: Any) -> collections.OrderedDict[str, Any]:
            obs: collections.OrderedDict[str, Any] = collections.OrderedDict()
            obs["qpos"] = self.get_qpos(physics)
            obs["qvel"] = self.get_qvel(physics)
            return obs

    return _NoRenderTransferCube


class SimScene:
    """The gym-aloha transfer-cube scene: a red 4 cm cube on the table between two ViperX arms.

    Args:
        cameras: MJCF camera names rendered by ``render()``, in order.
        image_size: render size ``(height, width)`` in pixels (at most 480x640, the MJCF's
            offscreen buffer).
        control_rate_hz: control rate; ``1/control_rate_hz`` must be a whole number of the
            2 ms physics steps (50 Hz is gym-aloha's).

    Raises:
        ImportError: mujoco / gym-aloha / dm_control are not installed.
        ValueError: unknown camera, bad image size or control rate.
    """

    def __init__(
        self,
        cameras: Sequence[str] = DEFAULT_CAMERAS,
        image_size: tuple[int, int] = DEFAULT_IMAGE_SIZE,
        control_rate_hz: float = CONTROL_RATE_HZ,
    ) -> None:
        os.environ.setdefault("MUJOCO_GL", "egl")
        from dm_control import mujoco as dm_mujoco
        from dm_control.rl import control
        from gym_aloha.constants import ASSETS_DIR

        physics = dm_mujoco.Physics.from_xml_path(str(ASSETS_DIR / "bimanual_viperx_transfer_cube.xml"))
        substeps = 1.0 / (control_rate_hz * physics.model.opt.timestep) if control_rate_hz > 0 else 0.5
        if abs(substeps - round(substeps)) > 1e-6 or round(substeps) < 1:
            raise ValueError(
                f"control rate {control_rate_hz} Hz is not a whole number of "
                f"{physics.model.opt.timestep * 1e3:g} ms physics steps"
            )
        known = {physics.model.id2name(i, "camera") for i in range(physics.model.ncam)}
        unknown = [c for c in cameras if c not in known]
        if unknown:
            raise ValueError(f"unknown camera(s) {unknown}; the MJCF has {sorted(known)}")
        height, width = (int(v) for v in image_size)
        glob = physics.model.vis.global_
        if not (0 < height <= glob.offheight and 0 < width <= glob.offwidth):
            raise ValueError(f"image size {height}x{width} outside 1..{glob.offheight}x{glob.offwidth}")
        self.cameras: tuple[str, ...] = tuple(cameras)
        self.image_size = (height, width)
        self.control_rate_hz = float(control_rate_hz)
        self.all_cameras: tuple[str, ...] = tuple(sorted(known))
        self._env = control.Environment(
            physics,
            _make_task_class()(),
            time_limit=float("inf"),
            control_timestep=1.0 / control_rate_hz,
            flat_observation=False,
        )
        self._obs: dict[str, np.ndarray] | None = None
        self._steps = 0
        self.reward = 0.0
        """gym-aloha's staged reward of the last step (``TransferCubeTask.get_reward``: 0; 1 the
        right gripper touches the cube; 2 lifted: it touches the right gripper, not the table; 3 it
        touches the left gripper; 4 transferred: left gripper, not the table)."""

    @property
    def physics(self) -> Any:
        """The dm_control ``Physics`` (``.model.ptr`` / ``.data.ptr`` are the raw MuJoCo structs)."""
        return self._env.physics

    @property
    def time(self) -> float:
        """Seconds of simulated time since the last ``reset`` (control steps / control rate)."""
        return self._steps / self.control_rate_hz

    def reset(self, seed: int = 0, arm_offset: np.ndarray | None = None) -> np.ndarray:
        """Place the arms at gym-aloha's start pose and the cube at its seeded random pose.

        Args:
            seed: cube placement seed (gym-aloha's ``sample_box_pose``: x in [0, 0.2] m,
                y in [0.4, 0.6] m on the table).
            arm_offset: optional ``[14]`` radians added to the start pose's arm joints (the two
                gripper entries must be 0): the arms start there, at rest, and the actuators hold
                them there until the first ``step``. ``record_demos --start-jitter`` uses it so
                that demonstrations do not all leave from one pose.

        Returns:
            ``[14]`` float64 joint positions (see module docstring for units).

        Raises:
            ValueError: ``arm_offset`` is not 14 finite values with zero gripper entries.
        """
        from gym_aloha.tasks.sim import BOX_POSE
        from gym_aloha.utils import sample_box_pose

        offset = None
        if arm_offset is not None:
            offset = np.asarray(arm_offset, dtype=np.float64).reshape(-1)
            if offset.shape != (len(JOINT_NAMES),) or not np.all(np.isfinite(offset)) or np.any(offset[[6, 13]]):
                raise ValueError(f"arm_offset must be 14 finite values with 0 for both grippers, got {arm_offset!r}")
        BOX_POSE[0] = sample_box_pose(seed)  # gym-aloha's task reads this global on reset
        self._obs = dict(self._env.reset().observation)
        if offset is not None and np.any(offset):
            physics = self.physics
            # raw qpos / ctrl: left arm 0..5, left fingers 6..7, right arm 8..13, right fingers 14..15
            raw = np.r_[0:6, 8:14]
            arms = np.r_[0:6, 7:13]
            # not physics.reset_context(): it zeroes the state first, the cube pose included
            physics.data.qpos[raw] += offset[arms]
            physics.data.ctrl[raw] = physics.data.qpos[raw]
            physics.forward()
            self._obs = dict(self._env.task.get_observation(physics))
        self._steps = 0
        self.reward = 0.0
        return self.joint_positions()

    def step(self, command: np.ndarray) -> np.ndarray:
        """Apply a 14-D joint command for one control period and advance the physics.

        Args:
            command: ``[14]`` joint position targets, ALOHA order (radians; grippers normalised
                0 = closed .. 1 = open). Values outside the actuator ranges are clipped by MuJoCo.

        Returns:
            ``[14]`` joint positions after the step.

        Raises:
            RuntimeError: ``reset`` was never called.
            ValueError: the command is not 14 finite numbers.
        """
        if self._obs is None:
            raise RuntimeError("SimScene.step() before reset()")
        cmd = np.asarray(command, dtype=np.float64).reshape(-1)
        if cmd.shape != (len(JOINT_NAMES),) or not np.all(np.isfinite(cmd)):
            raise ValueError(f"command must be {len(JOINT_NAMES)} finite values, got {command!r}")
        step = self._env.step(cmd)
        self._obs = dict(step.observation)
        self.reward = float(step.reward or 0.0)
        self._steps += 1
        return self.joint_positions()

    def joint_positions(self) -> np.ndarray:
        """``[14]`` float64 joint positions (radians; grippers normalised opening)."""
        if self._obs is None:
            raise RuntimeError("SimScene used before reset()")
        return np.array(self._obs["qpos"], dtype=np.float64)

    def joint_velocities(self) -> np.ndarray:
        """``[14]`` float64 joint velocities (rad/s; grippers in normalised opening per second)."""
        if self._obs is None:
            raise RuntimeError("SimScene used before reset()")
        return np.array(self._obs["qvel"], dtype=np.float64)

    @property
    def cube_position(self) -> np.ndarray:
        """``[3]`` world position of the cube centre in metres (z up, table top at z = 0)."""
        return np.array(self.physics.named.data.xpos["box"], dtype=np.float64)

    def render(self) -> dict[str, np.ndarray]:
        """Render every configured camera.

        Returns:
            camera name -> uint8 ``[height, width, 3]`` RGB image (C-contiguous).
        """
        h, w = self.image_size
        return {
            cam: np.ascontiguousarray(self.physics.render(height=h, width=w, camera_id=cam)) for cam in self.cameras
        }

    def close(self) -> None:
        """Free the MuJoCo data and rendering contexts now (the scene is unusable afterwards)."""
        self._obs = None
        self._env.physics.free()
