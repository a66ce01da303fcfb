"""Tests for oxygen_ros.ros.convert.trajectory: trajectory (action chunk → JointTrajectory); pure message
construction, no DDS."""

from __future__ import annotations

import os

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")  # DDS stays on this host

import math

import numpy as np
import pytest
from builtin_interfaces.msg import Time

from oxygen_ros.ros.convert import chunk_to_joint_trajectory

NAMES = ["shoulder", "elbow", "wrist", "gripper"]


def test_chunk_to_joint_trajectory():
    actions = np.arange(12, dtype=np.float32).reshape(3, 4) / 8
    stamp = Time(sec=100, nanosec=250)
    traj = chunk_to_joint_trajectory(actions, NAMES, stamp, control_period_s=0.02, frame_id="base")
    assert list(traj.joint_names) == NAMES
    assert traj.header.stamp == stamp and traj.header.frame_id == "base"
    assert len(traj.points) == 3
    for i, point in enumerate(traj.points):
        assert list(point.positions) == actions[i].astype(float).tolist()
        assert point.time_from_start.sec == 0
        assert point.time_from_start.nanosec == (i + 1) * 20_000_000  # first point = next command
        assert len(point.velocities) == 0


def test_trajectory_times_do_not_drift():
    traj = chunk_to_joint_trajectory(np.zeros((150, 1)), ["j"], 0.0, control_period_s=1 / 30)
    last = traj.points[-1].time_from_start
    assert (last.sec, last.nanosec) == (5, 0)  # 150 * (1/30) s exactly, no accumulated error
    assert traj.header.stamp == Time()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_trajectory_refuses_non_finite(bad):
    actions = np.zeros((5, 4))
    actions[3, 1] = bad
    with pytest.raises(ValueError, match="non-finite.*step 3.*'elbow'"):
        chunk_to_joint_trajectory(actions, NAMES, Time(), 0.02)


@pytest.mark.parametrize("shape", [(5, 3), (5,), (0, 4), (2, 5, 4)])
def test_trajectory_refuses_shape_mismatch(shape):
    with pytest.raises(ValueError, match="action chunk"):
        chunk_to_joint_trajectory(np.zeros(shape), NAMES, Time(), 0.02)


@pytest.mark.parametrize("period", [0.0, -0.02, math.nan, math.inf])
def test_trajectory_refuses_bad_period(period):
    with pytest.raises(ValueError, match="control_period_s"):
        chunk_to_joint_trajectory(np.zeros((2, 4)), NAMES, Time(), period)
