"""Tests for oxygen_ros.ros.convert.joints: joints (JointState → state vector by name); pure message construction, no
DDS."""

from __future__ import annotations

import os

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")  # DDS stays on this host

import math

import numpy as np
import pytest
from sensor_msgs.msg import JointState

from oxygen_ros.ros.convert import (
    JointStateError,
    joint_state_to_vector,
)

NAMES = ["shoulder", "elbow", "wrist", "gripper"]


def _joint_state(names, positions) -> JointState:
    return JointState(name=list(names), position=[float(p) for p in positions])


def test_joint_mapping_by_name_with_shuffled_order_and_extra_joints():
    msg = _joint_state(
        ["camera_tilt", "gripper", "wrist", "shoulder", "head", "elbow"], [9.0, 0.04, -1.5, 0.25, 8.0, 1.0]
    )
    vec = joint_state_to_vector(msg, NAMES)
    assert vec.dtype == np.float64 and vec.shape == (4,)
    np.testing.assert_array_equal(vec, [0.25, 1.0, -1.5, 0.04])


def test_missing_joints_are_all_named():
    msg = _joint_state(["shoulder", "wrist"], [0.0, 0.0])
    with pytest.raises(JointStateError, match="elbow, gripper"):
        joint_state_to_vector(msg, NAMES)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_position_names_the_joint(bad):
    msg = _joint_state(NAMES, [0.0, 1.0, bad, 0.0])
    with pytest.raises(JointStateError, match="wrist"):
        joint_state_to_vector(msg, NAMES)


def test_non_finite_position_of_an_unused_joint_is_ignored():
    msg = _joint_state(NAMES + ["broken_sensor"], [0.0, 1.0, 2.0, 3.0, math.nan])
    np.testing.assert_array_equal(joint_state_to_vector(msg, NAMES), [0.0, 1.0, 2.0, 3.0])


def test_positions_shorter_than_names_raise():
    msg = _joint_state(NAMES, [0.0, 1.0])
    with pytest.raises(JointStateError, match="positions"):
        joint_state_to_vector(msg, NAMES)
    empty = JointState(name=list(NAMES))  # e.g. a velocity-only JointState
    with pytest.raises(JointStateError):
        joint_state_to_vector(empty, NAMES)
