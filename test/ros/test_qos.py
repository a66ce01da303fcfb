"""Tests for oxygen_ros.ros.qos: profile values only, no DDS, no rclpy.init."""

from __future__ import annotations

import os

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")  # DDS stays on this host

import pytest
from rclpy.qos import (
    DurabilityPolicy,
    HistoryPolicy,
    QoSProfile,
    ReliabilityPolicy,
    qos_profile_system_default,
)

from oxygen_ros.ros.qos import (
    QOS_NAMES,
    qos_from_name,
    reliable_qos,
    sensor_data_qos,
    system_default_qos,
    text_qos,
)


def test_sensor_data_is_best_effort_keep_last_small_volatile():
    p = sensor_data_qos()
    assert p.reliability == ReliabilityPolicy.BEST_EFFORT
    assert p.history == HistoryPolicy.KEEP_LAST and 1 <= p.depth <= 5
    assert p.durability == DurabilityPolicy.VOLATILE


@pytest.mark.parametrize("factory, depth", [(reliable_qos, 10), (text_qos, 100)])
def test_reliable_profiles_are_keep_last_volatile(factory, depth):
    p = factory()
    assert p.reliability == ReliabilityPolicy.RELIABLE
    assert p.history == HistoryPolicy.KEEP_LAST and p.depth == depth
    assert p.durability == DurabilityPolicy.VOLATILE  # late joiners never get stale chunks


def test_system_default_matches_rclpy():
    assert system_default_qos() == qos_profile_system_default


def test_qos_from_name_known_names():
    assert set(QOS_NAMES) >= {"sensor_data", "reliable", "system_default"}
    assert qos_from_name("sensor_data") == sensor_data_qos()
    assert qos_from_name("reliable") == reliable_qos()
    assert qos_from_name("text") == text_qos()
    assert qos_from_name("system_default") == qos_profile_system_default
    assert qos_from_name("  Sensor_Data ") == sensor_data_qos()  # YAML-typed values are forgiving
    for name in QOS_NAMES:
        assert isinstance(qos_from_name(name), QoSProfile)


def test_qos_from_name_unknown_lists_valid_names():
    with pytest.raises(ValueError, match=r"'best_effrot'.*sensor_data.*reliable.*system_default"):
        qos_from_name("best_effrot")


def test_depth_override():
    assert qos_from_name("sensor_data", depth=1).depth == 1
    assert qos_from_name("reliable", depth=3).reliability == ReliabilityPolicy.RELIABLE
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="depth"):
            qos_from_name("reliable", depth=bad)
    with pytest.raises(ValueError, match="system_default"):
        qos_from_name("system_default", depth=5)


def test_profiles_are_fresh_copies():
    p = qos_from_name("sensor_data")
    p.depth = 50
    assert qos_from_name("sensor_data").depth != 50
