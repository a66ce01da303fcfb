"""Action chunk -> ``trajectory_msgs/JointTrajectory`` (positions or velocities) or, for end-effector
commands, ``std_msgs/Float64MultiArray``."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from builtin_interfaces.msg import Duration, Time
from std_msgs.msg import Float64MultiArray, MultiArrayDimension
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.core.action_space import RobotCommand
from oxygen_ros.ros.convert.stamps import _NS, make_header

__all__ = ["FIELDS", "chunk_to_joint_trajectory", "chunk_to_multi_array", "command_messages", "primary_values"]

FIELDS = ("positions", "velocities")


def chunk_to_joint_trajectory(
    actions: np.ndarray,
    joint_names: Sequence[str],
    stamp: Time | float,
    control_period_s: float,
    frame_id: str = "",
    field: str = "positions",
) -> JointTrajectory:
    """Build a JointTrajectory from an action chunk.

    Point ``i`` (0-based) gets ``time_from_start = (i + 1) * control_period_s``: the first action
    is the next command, one control period after the header stamp (the observation stamp). Only
    ``field`` is filled — ``positions`` (joint positions) or ``velocities`` (joint velocities, of a
    velocity action space: never written into ``positions``); the other fields stay empty. Times
    are rounded to whole nanoseconds per point, so they do not accumulate float error.

    Args:
        actions: ``[H, n]`` finite positions (rad / m) or velocities (rad/s, m/s) in robot units,
            ``n == len(joint_names)``, ``H >= 1``.
        joint_names: the ``n`` joint names, in the column order of ``actions``.
        stamp: header stamp (``builtin_interfaces/Time`` or seconds).
        control_period_s: seconds between consecutive points (> 0, finite).
        frame_id: header frame id.
        field: ``positions`` or ``velocities``.

    Raises:
        ValueError: wrong shape, empty chunk, non-finite values (never published), bad period or
            field.
    """
    if field not in FIELDS:
        raise ValueError(f"field must be one of {FIELDS}, got {field!r}")
    arr = np.asarray(actions, dtype=np.float64)
    names = list(joint_names)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] != len(names):
        raise ValueError(f"action chunk must be [H>=1, {len(names)}] for joints {names}, got {arr.shape}")
    if not np.isfinite(arr).all():
        rows, cols = np.nonzero(~np.isfinite(arr))
        raise ValueError(
            f"action chunk has {rows.size} non-finite values (first: step {rows[0]}, joint "
            f"{names[cols[0]]!r}); refusing to publish"
        )
    period = float(control_period_s)
    if not math.isfinite(period) or period <= 0.0:
        raise ValueError(f"control_period_s must be finite and > 0, got {control_period_s}")
    period_ns = period * _NS
    points = []
    for i, row in enumerate(arr):
        sec, nanosec = divmod(round((i + 1) * period_ns), _NS)
        points.append(JointTrajectoryPoint(**{field: row.tolist()}, time_from_start=Duration(sec=sec, nanosec=nanosec)))
    return JointTrajectory(header=make_header(stamp, frame_id), joint_names=names, points=points)


def chunk_to_multi_array(actions: np.ndarray, names: Sequence[str]) -> Float64MultiArray:
    """An end-effector command chunk ``[H, n]`` as a row-major ``Float64MultiArray``: dim 0
    ``step`` (H), dim 1 labelled with the comma-joined command names (n).

    Raises:
        ValueError: wrong shape or non-finite values.
    """
    arr = np.asarray(actions, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] != len(names):
        raise ValueError(f"command chunk must be [H>=1, {len(names)}], got {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("command chunk has non-finite values; refusing to publish")
    h, n = arr.shape
    msg = Float64MultiArray(data=arr.reshape(-1).tolist())
    msg.layout.dim = [
        MultiArrayDimension(label="step", size=h, stride=h * n),
        MultiArrayDimension(label=",".join(names), size=n, stride=n),
    ]
    return msg


def command_messages(
    cmd: RobotCommand, stamp: Time | float, control_period_s: float, frame_id: str = ""
) -> tuple[JointTrajectory | Float64MultiArray, JointTrajectory | None]:
    """The messages of one robot command chunk: (for ``action_topic``, for ``position_action_topic``).

    * joint positions only (absolute / delta spaces): a positions JointTrajectory, None;
    * a velocity space: a velocities JointTrajectory of the velocity joints, and a positions
      JointTrajectory of its position joints (grippers) or None;
    * end-effector commands: a Float64MultiArray (:func:`chunk_to_multi_array`), None.

    Raises:
        ValueError: see :func:`chunk_to_joint_trajectory`.
    """
    if cmd.ee is not None:
        return chunk_to_multi_array(cmd.ee, cmd.ee_names), None
    if cmd.velocity_joints:
        assert cmd.velocities is not None  # a velocity space's command carries them (ActionSpace)
        vel = chunk_to_joint_trajectory(
            cmd.velocities, cmd.velocity_joints, stamp, control_period_s, frame_id, field="velocities"
        )
        pos = (
            chunk_to_joint_trajectory(cmd.positions, cmd.position_joints, stamp, control_period_s, frame_id)
            if cmd.position_joints
            else None
        )
        return vel, pos
    return chunk_to_joint_trajectory(cmd.positions, cmd.position_joints, stamp, control_period_s, frame_id), None


def primary_values(cmd: RobotCommand) -> tuple[tuple[str, ...], np.ndarray, str]:
    """(names, ``[H, n]`` values, ``'position'`` / ``'velocity'`` / ``'ee'``) of what ``action_topic``
    carries — what the per-step command stream steps through."""
    if cmd.ee is not None:
        return cmd.ee_names, cmd.ee, "ee"
    if cmd.velocity_joints:
        assert cmd.velocities is not None  # a velocity space's command carries them (ActionSpace)
        return cmd.velocity_joints, cmd.velocities, "velocity"
    return cmd.position_joints, cmd.positions, "position"
