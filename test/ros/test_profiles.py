"""The robot profiles (config/aloha.yaml, aloha_lerobot.yaml, droid.yaml, libero.yaml) read through the
node's parameter code, the action spaces they declare (openpi's and LeRobot's conventions per family),
and the LeRobot profile against the tiny LeRobot checkpoint of the parity data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.core.action_space import ActionSpace, aloha_gripper_from_angular, aloha_gripper_to_angular
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
    bad.write_text(
        (CONFIG / "libero.yaml")
        .read_text()
        .replace("action_rate_hz: 0.0", "action_rate_hz: 20.0")
        .replace("command_type: float64_multi_array", "command_type: joint_state")
    )
    with pytest.raises(ParamsFileError, match="command_type='joint_state' with action_space.kind='ee_delta'"):
        load_node_config(bad)


PARITY_CKPT = CONFIG.parent / "test" / "data" / "parity" / "tiny_lerobot_pi05"


def lerobot_checkpoint(tmp_path: Path) -> Path:
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(PARITY_CKPT, ckpt)
    (ckpt / "oxygen_config.json").write_text('{"vision": {"num_heads": 2}}')  # tiny_model_dims.json
    return ckpt


def test_lerobot_aloha_profile_flips_nothing_and_converts_no_gripper():
    cfg = profile("aloha_lerobot.yaml")
    sp = ActionSpace(cfg.action_space, cfg.joint_names, cfg.state_joint_names)
    assert sp.kind == "absolute" and len(cfg.joint_names) == 14 and len(cfg.cameras) == 3
    assert sp.sign.tolist() == [1] * 14 and cfg.action_space.gripper_conversion == "none"
    assert cfg.joint_names == profile("aloha.yaml").joint_names  # same robot, other checkpoint family
    state = np.linspace(-1.0, 1.0, 14)
    # state in and actions out in the dataset's own units: identity, where the openpi profile flips
    np.testing.assert_array_equal(sp.state_to_model(state, np.float64), state)
    openpi = profile("aloha.yaml")
    flipped = ActionSpace(openpi.action_space, openpi.joint_names, openpi.state_joint_names).state_to_model(
        state, np.float64
    )
    assert flipped[1] == -state[1] and flipped[2] == -state[2]


def test_the_lerobot_checkpoint_configures_with_its_profile_and_refuses_the_openpi_one(tmp_path):
    from oxygen_ros.ros.model_setup import action_space, load_policy

    ckpt = str(lerobot_checkpoint(tmp_path))
    cfg = load_node_config(CONFIG / "aloha_lerobot.yaml", [f"model:={ckpt}"])
    policy = load_policy(cfg)  # the node's own configure path: convention check, loading, fit
    assert policy.normalizer.action_dim == 14
    openpi = load_node_config(CONFIG / "aloha.yaml", [f"model:={ckpt}"])
    with pytest.raises(
        ValueError,
        match=r"action_space.flip_joints and action_space.gripper_conversion are openpi's "
        r"ALOHA runtime conventions .* use config/aloha_lerobot.yaml",
    ):
        action_space(openpi)


def test_lerobot_profile_passes_actions_out_unconverted_openpi_profile_converts_the_grippers():
    rng = np.random.default_rng(1)
    state = rng.uniform(-0.5, 0.5, 14)
    state[[6, 13]] = [0.2, 0.8]
    actions = rng.uniform(-0.3, 0.3, (4, 14))
    cfg = profile("aloha_lerobot.yaml")
    lr = ActionSpace(cfg.action_space, cfg.joint_names, cfg.state_joint_names)
    np.testing.assert_allclose(lr.to_robot(actions, lr.state_to_model(state)).positions, actions, atol=1e-7)
    cfg = profile("aloha.yaml")
    op = ActionSpace(cfg.action_space, cfg.joint_names, cfg.state_joint_names)
    ms = op.state_to_model(state)
    np.testing.assert_allclose(ms[[6, 13]], aloha_gripper_to_angular(state[[6, 13]]), atol=1e-6)
    out = op.to_robot(actions, ms).positions
    np.testing.assert_allclose(out[:, [6, 13]], aloha_gripper_from_angular(actions[:, [6, 13]]), atol=1e-6)
    assert np.sign(out[:, [1, 2, 8, 9]]).tolist() == (-np.sign(actions + ms)[:, [1, 2, 8, 9]]).tolist()


def test_absolute_joints_with_kind_absolute_says_to_empty_them():
    with pytest.raises(ParamsFileError, match=r"absolute_joints.*set action_space.absolute_joints: \[\]"):
        load_node_config(CONFIG / "aloha.yaml", ["action_space.kind:=absolute"])


def test_replay_of_a_lerobot_checkpoint_runs_with_aloha_lerobot_and_refuses_aloha(tmp_path, capsys):
    from bag_edit import SAMPLE_BAG

    from oxygen_ros.replay.replay import main

    ckpt = lerobot_checkpoint(tmp_path)
    common = [str(SAMPLE_BAG), "--model", str(ckpt), "--no-plots", "--max-frames", "2", "--progress", "off"]
    assert main([*common, "--params-file", str(CONFIG / "aloha.yaml"), "--out", str(tmp_path / "a")]) == 2
    assert "use config/aloha_lerobot.yaml" in capsys.readouterr().err
    assert main([*common, "--params-file", str(CONFIG / "aloha_lerobot.yaml"), "--out", str(tmp_path / "b")]) == 0
    assert "2 action chunks" in capsys.readouterr().out
