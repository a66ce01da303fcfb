"""Action spaces (core/action_space.py): hand-computed model output -> robot command cases."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.core.action_space import (
    ActionSpace,
    ActionSpaceConfig,
    aloha_gripper_from_angular,
    aloha_gripper_from_angular_inv,
    aloha_gripper_to_angular,
    check_against_checkpoint,
    checkpoint_convention,
)
from oxygen_ros.core.config import ConfigError

J3 = ("shoulder", "elbow", "gripper")
ALOHA = (
    "left_waist",
    "left_shoulder",
    "left_elbow",
    "left_forearm_roll",
    "left_wrist_angle",
    "left_wrist_rotate",
    "left_gripper",
    "right_waist",
    "right_shoulder",
    "right_elbow",
    "right_forearm_roll",
    "right_wrist_angle",
    "right_wrist_rotate",
    "right_gripper",
)
ALOHA_SPACE = ActionSpaceConfig(
    kind="delta",
    absolute_joints=("left_gripper", "right_gripper"),
    flip_joints=("left_shoulder", "left_elbow", "right_shoulder", "right_elbow"),
    gripper_joints=("left_gripper", "right_gripper"),
    gripper_conversion="aloha",
)


def test_absolute_is_identity():
    sp = ActionSpace(ActionSpaceConfig(), J3)
    a = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    cmd = sp.to_robot(a, sp.state_to_model(np.array([9.0, 9.0, 9.0])))
    assert cmd.position_joints == J3 and cmd.velocity_joints == () and cmd.velocities.shape == (2, 0)
    np.testing.assert_array_equal(cmd.positions, a)
    assert sp.is_identity


def test_delta_with_per_joint_mask():
    sp = ActionSpace(ActionSpaceConfig(kind="delta", absolute_joints=("gripper",)), J3)
    state = np.array([0.5, -1.0, 0.3])
    a = np.array([[0.1, 0.2, 0.9], [0.0, -0.1, 0.1]])
    cmd = sp.to_robot(a, sp.state_to_model(state))
    np.testing.assert_allclose(cmd.positions, [[0.6, -0.8, 0.9], [0.5, -1.1, 0.1]], atol=1e-12)
    np.testing.assert_allclose(sp.to_model(cmd.positions, np.stack([state, state])), a, atol=1e-12)


def test_velocity_never_fills_positions():
    sp = ActionSpace(ActionSpaceConfig(kind="velocity", absolute_joints=("gripper",)), J3)
    a = np.array([[0.1, -0.2, 0.7], [0.3, 0.0, 0.6]])
    cmd = sp.to_robot(a, sp.state_to_model(np.array([1.0, 2.0, 0.5])))
    assert cmd.velocity_joints == ("shoulder", "elbow") and cmd.position_joints == ("gripper",)
    np.testing.assert_array_equal(cmd.velocities, a[:, :2])  # not shifted by the state
    np.testing.assert_array_equal(cmd.positions, a[:, 2:])
    all_vel = ActionSpace(ActionSpaceConfig(kind="velocity"), J3).to_robot(a, np.zeros(3))
    assert all_vel.position_joints == () and all_vel.positions.shape == (2, 0)


def test_sign_flips_state_and_actions():
    sp = ActionSpace(ActionSpaceConfig(kind="delta", flip_joints=("elbow",)), J3)
    state = np.array([0.5, 0.25, 0.0])
    ms = sp.state_to_model(state)
    np.testing.assert_array_equal(ms, [0.5, -0.25, 0.0])
    cmd = sp.to_robot(np.array([[0.1, 0.1, 0.2]]), ms)
    # elbow: model delta 0.1 + model state -0.25 = -0.15 in model space -> robot +0.15
    np.testing.assert_allclose(cmd.positions, [[0.6, 0.15, 0.2]], atol=1e-12)


def test_aloha_gripper_conversions_hand_computed():
    # openpi _gripper_from_angular: (x + 0.5476 - (-0.6213)) / (1.4910 - (-0.6213))
    assert aloha_gripper_from_angular(np.array(0.5)) == pytest.approx((0.5 + 0.5476 + 0.6213) / 2.1123)
    assert aloha_gripper_from_angular_inv(aloha_gripper_from_angular(np.array(0.3))) == pytest.approx(0.3)
    # openpi _gripper_to_angular at 0.5: linear 0.03822 m -> asin((h^2 + l^2 - a^2) / (2 h l)) -> (rad - 0.5476) / 1.082
    lin = 0.5 * (0.05800 - 0.01844) + 0.01844
    rad = np.arcsin((0.022**2 + lin**2 - 0.036**2) / (2 * 0.022 * lin))
    assert aloha_gripper_to_angular(np.array(0.5)) == pytest.approx((rad - 0.5476) / (1.6296 - 0.5476))


def test_aloha_round_trip_model_to_robot_and_back():
    sp = ActionSpace(ALOHA_SPACE, ALOHA)
    rng = np.random.default_rng(0)
    state = rng.uniform(-0.5, 0.5, 14)
    state[[6, 13]] = [0.2, 0.8]
    ms = sp.state_to_model(state)
    flip = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1])  # openpi _joint_flip_mask
    np.testing.assert_allclose(ms[:6], (flip * state)[:6], atol=1e-6)
    np.testing.assert_allclose(ms[[6, 13]], aloha_gripper_to_angular(state[[6, 13]]), atol=1e-6)
    a = rng.uniform(-0.2, 0.2, (5, 14))
    cmd = sp.to_robot(a, ms)
    expect = flip * (a + np.where(np.arange(14) % 7 == 6, 0.0, ms))
    expect[:, [6, 13]] = aloha_gripper_from_angular(a[:, [6, 13]])
    np.testing.assert_allclose(cmd.positions, expect, atol=1e-6)
    np.testing.assert_allclose(sp.to_model(cmd.positions, np.tile(state, (5, 1))), a, atol=1e-6)


def test_ee_delta_is_not_a_joint_command():
    names = ("dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper")
    cmd = ActionSpace(ActionSpaceConfig(kind="ee_delta"), names).to_robot(np.ones((2, 7)), np.zeros(7))
    assert cmd.position_joints == () and cmd.velocity_joints == () and cmd.ee_names == names
    np.testing.assert_array_equal(cmd.ee, np.ones((2, 7)))


@pytest.mark.parametrize(
    "cfg, match",
    [
        (ActionSpaceConfig(kind="joint"), r"action_space.kind='joint'"),
        (ActionSpaceConfig(absolute_joints=("gripper",)), r"action_space.absolute_joints.*only meaningful"),
        (
            ActionSpaceConfig(kind="delta", absolute_joints=("wrist",)),
            r"action_space.absolute_joints: \['wrist'\] not in",
        ),
        (ActionSpaceConfig(gripper_conversion="aloha"), r"action_space.gripper_joints=\[\]"),
        (
            ActionSpaceConfig(kind="velocity", gripper_joints=("gripper",), gripper_conversion="aloha"),
            r"list these joints in absolute_joints",
        ),
    ],
)
def test_bad_configs_name_the_parameter(cfg, match):
    with pytest.raises(ConfigError, match=match):
        ActionSpace(cfg, J3)


def test_non_finite_and_bad_shapes_refused():
    sp = ActionSpace(ActionSpaceConfig(kind="delta"), J3)
    with pytest.raises(ValueError, match="not finite"):
        sp.to_robot(np.array([[np.nan, 0, 0]]), np.zeros(3))
    with pytest.raises(ValueError, match=r"\[H, 3\]"):
        sp.to_robot(np.zeros((2, 4)), np.zeros(3))


def lerobot_cfg(rel: bool, names=J3) -> dict:
    return {
        "type": "pi05",
        "use_relative_actions": rel,
        "relative_exclude_joints": ["gripper"],
        "action_feature_names": list(names),
    }


def test_checkpoint_convention_mismatch_fails_naming_both():
    where = "ckpt/config.json"
    conv = checkpoint_convention(lerobot_cfg(True))
    with pytest.raises(
        ConfigError,
        match=r"action_space.kind='absolute' but ckpt/config.json says "
        r"use_relative_actions=true",
    ):
        check_against_checkpoint(ActionSpace(ActionSpaceConfig(), J3), conv, where)
    with pytest.raises(ConfigError, match=r"action_space.absolute_joints=\[\] .* keeps \['gripper'\] absolute"):
        check_against_checkpoint(ActionSpace(ActionSpaceConfig(kind="delta"), J3), conv, where)
    check_against_checkpoint(
        ActionSpace(ActionSpaceConfig(kind="delta", absolute_joints=("gripper",)), J3), conv, where
    )
    with pytest.raises(ConfigError, match=r"action_space.kind='delta' but .* use_relative_actions=false"):
        check_against_checkpoint(
            ActionSpace(ActionSpaceConfig(kind="delta"), J3), checkpoint_convention(lerobot_cfg(False)), where
        )
    check_against_checkpoint(ActionSpace(ActionSpaceConfig(), J3), checkpoint_convention(lerobot_cfg(False)), where)
    assert checkpoint_convention({"action_dim": 32}) is None  # openpi folders state nothing
    steps = [{"registry_name": "relative_actions_processor", "config": {"enabled": True, "exclude_joints": []}}]
    assert checkpoint_convention({}, steps)["relative"] is True
