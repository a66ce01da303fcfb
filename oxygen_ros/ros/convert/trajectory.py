"""Action chunk -> ``trajectory_msgs/JointTrajectory``."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from builtin_interfaces.msg import Duration, Time
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.ros.convert.stamps import _NS, make_header

__all__ = ['chunk_to_joint_trajectory']


def chunk_to_joint_trajectory(
    actions: np.ndarray,
    joint_names: Sequence[str],
    stamp: Time | float,
    control_period_s: float,
    frame_id: str = '',
) -> JointTrajectory:
    """Build a JointTrajectory from an action chunk.

    Point ``i`` (0-based) gets ``time_from_start = (i + 1) * control_period_s``: the first action
    is the next command, one control period after the header stamp (the observation stamp). Only
    ``positions`` are filled (velocities/accelerations/effort stay empty). Times are rounded to
    whole nanoseconds per point, so they do not accumulate float error.

    Args:
        actions: ``[H, n]`` finite positions in robot units, ``n == len(joint_names)``, ``H >= 1``.
        joint_names: the ``n`` joint names, in the column order of ``actions``.
        stamp: header stamp (``builtin_interfaces/Time`` or seconds).
        control_period_s: seconds between consecutive points (> 0, finite).
        frame_id: header frame id.

    Raises:
        ValueError: wrong shape, empty chunk, non-finite values (never published), bad period.
    """
    arr = np.asarray(actions, dtype=np.float64)
    names = list(joint_names)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] != len(names):
        raise ValueError(
            f'action chunk must be [H>=1, {len(names)}] for joints {names}, got {arr.shape}'
        )
    if not np.isfinite(arr).all():
        rows, cols = np.nonzero(~np.isfinite(arr))
        raise ValueError(
            f'action chunk has {rows.size} non-finite values (first: step {rows[0]}, joint '
            f'{names[cols[0]]!r}); refusing to publish'
        )
    period = float(control_period_s)
    if not math.isfinite(period) or period <= 0.0:
        raise ValueError(f'control_period_s must be finite and > 0, got {control_period_s}')
    period_ns = period * _NS
    points = []
    for i, row in enumerate(arr):
        sec, nanosec = divmod(round((i + 1) * period_ns), _NS)
        points.append(
            JointTrajectoryPoint(
                positions=row.tolist(), time_from_start=Duration(sec=sec, nanosec=nanosec)
            )
        )
    return JointTrajectory(header=make_header(stamp, frame_id), joint_names=names, points=points)
