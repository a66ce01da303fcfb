"""Controller groups (``controller_names`` / ``controllers.<name>.*``): the humanoid profile reads
through the node's parameter code, and every malformed declaration fails configure naming the
parameter. The groups on the wire are tested over DDS in test_node_controllers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from oxygen_ros.ros.params.controllers import ControllerGroup
from oxygen_ros.ros.params.node_config import ParamsFileError, load_node_config

CONFIG = Path(__file__).resolve().parents[2] / "config"
BASE = ["model:=pi05-tiny", "joint_names:=[a1, a2, h1, h2]", "cameras.base_0_rgb.topic:=cam"]


def groups(*extra: str, rate: float = 0.0):
    return load_node_config(None, BASE + [f"action_rate_hz:={rate}", *extra]).controllers


def test_humanoid_profile_has_one_group_per_controller_covering_every_joint():
    cfg = load_node_config(CONFIG / "humanoid.yaml")
    assert len(cfg.joint_names) == 27 and set(cfg.cameras) == {"base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"}
    by_name = {g.name: g for g in cfg.controllers}
    assert list(by_name) == [
        "left_arm_controller",
        "right_arm_controller",
        "left_hand_controller",
        "right_hand_controller",
        "waist_controller",
    ]
    assert by_name["left_arm_controller"] == ControllerGroup(
        "left_arm_controller", tuple(cfg.joint_names[:7]), "left_arm_controller/joint_trajectory", "joint_trajectory"
    )
    assert by_name["left_hand_controller"].type == "forward_command"
    assert by_name["left_hand_controller"].topic == "left_hand_controller/commands"
    assert sorted(j for g in cfg.controllers for j in g.joints) == sorted(cfg.joint_names)
    assert cfg.action_rate_hz == 50.0 and cfg.action_space.kind == "absolute"


def test_groups_take_topics_types_and_their_own_joint_order():
    got = groups(
        "controller_names:=[arm, hand]",
        "controllers.arm.joints:=[a2, a1]",
        "controllers.arm.topic:=/robot/arm/follow",
        "controllers.hand.joints:=[h1, h2]",
        "controllers.hand.type:=forward_command",
        rate=50.0,
    )
    assert got == (
        ControllerGroup("arm", ("a2", "a1"), "/robot/arm/follow", "joint_trajectory"),
        ControllerGroup("hand", ("h1", "h2"), "hand/commands", "forward_command"),
    )
    assert load_node_config(None, BASE).controllers == ()  # unset: no groups


@pytest.mark.parametrize(
    "extra, rate, message",
    [
        (
            ["controllers.arm.joints:=[a1, a2, h1, x9]", "controllers.hand.joints:=[h2]"],
            0.0,
            "controllers.arm.joints: 'x9' is not in joint_names",
        ),
        (
            ["controllers.arm.joints:=[a1, a2, h1]", "controllers.hand.joints:=[h1, h2]"],
            0.0,
            "controllers.hand.joints: 'h1' is already in controller 'arm'",
        ),
        (
            ["controllers.arm.joints:=[a1, a2]", "controllers.hand.joints:=[h1]"],
            0.0,
            r"joints in no controller group: \['h2'\]",
        ),
        (
            ["controllers.arm.joints:=[a1, a2, h1, h2]"],
            0.0,
            r"controllers.hand.joints=None: give the controller's joints",
        ),
        (
            ["controllers.arm.joints:=[a1, a2]", "controllers.hand.joints:=[h1, h2]", "controllers.hand.type:=effort"],
            0.0,
            r"controllers.hand.type='effort': must be one of \['joint_trajectory', 'forward_command'\]",
        ),
        (
            [
                "controllers.arm.joints:=[a1, a2]",
                "controllers.hand.joints:=[h1, h2]",
                "controllers.hand.type:=forward_command",
            ],
            0.0,
            "forward_command controllers: they take one command per step",
        ),
        (
            ["controllers.arm.joints:=[a1, a2]", "controllers.hand.joints:=[h1, h2]"],
            50.0,
            "no controller group is a forward_command controller",
        ),
        (
            [
                "controllers.arm.joints:=[a1, a2]",
                "controllers.hand.joints:=[h1, h2]",
                "controllers.hand.topic:=arm/joint_trajectory",
            ],
            0.0,
            "controllers.hand.topic='arm/joint_trajectory' is also controllers.arm.topic",
        ),
        (
            [
                "controllers.arm.joints:=[a1, a2]",
                "controllers.hand.joints:=[h1, h2]",
                "controllers.hand.topic:=action_chunk",
            ],
            0.0,
            "controllers.hand.topic='action_chunk' is also action_topic",
        ),
        (
            ["controllers.arm.joints:=[a1, a2]", "controllers.hand.joints:=[h1, h2]", "action_space.kind:=velocity"],
            0.0,
            "controller groups carry joint positions",
        ),
        (
            ["controllers.arm.joints:=[a1, a2]", "controllers.hand.joints:=[h1, h2]", "controllers.hand.jonts:=[h1]"],
            0.0,
            r"unknown parameter controllers.hand.jonts \(did you mean controllers.hand.joints\?\)",
        ),
    ],
)
def test_bad_groups_fail_configure_naming_the_parameter(extra, rate, message):
    with pytest.raises(ParamsFileError, match=message):
        groups("controller_names:=[arm, hand]", *extra, rate=rate)


def test_bad_controller_names_are_named():
    with pytest.raises(ParamsFileError, match=r"controller_names: 'left arm' is not a valid controller name"):
        groups("controller_names:=['left arm']")
    with pytest.raises(ParamsFileError, match="controller_names=.*duplicate names"):
        groups("controller_names:=[arm, arm]", "controllers.arm.joints:=[a1, a2, h1, h2]")


def test_mistyped_group_values_are_named_not_raised():
    with pytest.raises(ParamsFileError, match=r"controllers.arm.joints=5: give the controller's joints"):
        groups("controller_names:=[arm]", "controllers.arm.joints:=5")
    with pytest.raises(ParamsFileError, match=r"controller_names=5: expected a list of controller names"):
        groups("controller_names:=5")


def test_more_joints_than_the_action_width_is_a_clear_error():
    from oxygen_ros.ros.model_setup import load_policy

    names = ", ".join(f"j{i}" for i in range(33))
    cfg = load_node_config(None, ["model:=pi05-tiny", f"joint_names:=[{names}]", "cameras.base_0_rgb.topic:=cam"])
    with pytest.raises(ValueError, match=r"joint_names has 33 joints but pi0.5 actions are at most 32 wide"):
        load_policy(cfg)
