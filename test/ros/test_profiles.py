"""The robot profiles (config/aloha.yaml, droid.yaml, libero.yaml) read through the node's
parameter code, and the action spaces they declare (openpi's conventions per family)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oxygen_ros.core.action_space import ActionSpace
from oxygen_ros.ros.params.node_config import ParamsFileError, load_node_config

CONFIG = Path(__file__).resolve().parents[2] / "config"


def profile(name: str):
    return load_node_config(CONFIG / name)


def test_aloha_profile_is_openpi_adapt_to_pi():
    cfg = profile("aloha.yaml")
    sp = ActionSpace(cfg.action_space, cfg.joint_names, cfg.state_joint_names)
    assert sp.kind == "delta" and len(cfg.joint_names) == 14 and len(cfg.cameras) == 3
    assert sp.sign.tolist() == [1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1]  # openpi _joint_flip_mask
    assert sp.delta.tolist() == [True] * 6 + [False] + [True] * 6 + [False]  # make_bool_mask(6, -1, 6, -1)
    assert cfg.action_space.gripper_conversion == "aloha" and cfg.control_period_s == 0.02
    sub = cfg.engine.task("subtask")
    assert sub.own_prefix and sub.template == "Task: {instruction}. Subtask: "


def test_droid_profile_sends_velocities_and_a_gripper_position():
    cfg = profile("droid.yaml")
    sp = ActionSpace(cfg.action_space, cfg.joint_names, cfg.state_joint_names)
    assert sp.kind == "velocity" and sp.velocity.tolist() == [True] * 7 + [False]
    assert cfg.position_action_topic and cfg.command_type == "float64_multi_array"
    assert set(cfg.cameras) == {"base_0_rgb", "left_wrist_0_rgb"}


def test_libero_profile_has_8_state_dims_and_7_ee_commands():
    cfg = profile("libero.yaml")
    sp = ActionSpace(cfg.action_space, cfg.joint_names, cfg.state_joint_names)
    assert sp.kind == "ee_delta" and len(cfg.joint_names) == 7 and len(cfg.state_joint_names) == 8
    assert set(cfg.cameras) == {"base_0_rgb", "left_wrist_0_rgb"}
    assert cfg.engine.tokens_per_frame == 1


def test_ee_delta_refuses_a_joint_state_command_stream(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((CONFIG / "libero.yaml").read_text().replace("action_rate_hz: 0.0", "action_rate_hz: 20.0")
                   .replace("command_type: float64_multi_array", "command_type: joint_state"))
    with pytest.raises(ParamsFileError, match="command_type='joint_state' with action_space.kind='ee_delta'"):
        load_node_config(bad)
