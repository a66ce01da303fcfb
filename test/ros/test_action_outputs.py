"""Action spaces end to end without DDS: model output -> robot command -> the ROS messages the
controller receives (serialized and read back as a subscriber would), and the configure-time check
of the parameter file against the checkpoint's own convention (ros/model_setup.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from std_msgs.msg import Float64MultiArray

from oxygen_ros.core.action_space import ActionSpace, ActionSpaceConfig
from oxygen_ros.core.robot_io import RobotFrames
from oxygen_ros.core.types import ActionChunk, Observation
from oxygen_ros.ros.convert import command_messages, primary_values
from oxygen_ros.ros.model_setup import action_space
from oxygen_ros.ros.params.node_config import NodeConfig

DROID = (
    "panda_joint1",
    "panda_joint2",
    "panda_joint3",
    "panda_joint4",
    "panda_joint5",
    "panda_joint6",
    "panda_joint7",
    "gripper",
)
PARITY = Path(__file__).resolve().parents[1] / "data" / "parity" / "tiny_lerobot_pi05"


def received(msg):
    """What a subscriber gets: the message through CDR and back."""
    return deserialize_message(serialize_message(msg), type(msg))


def frames_for(cfg: ActionSpaceConfig, names) -> RobotFrames:
    return RobotFrames(ActionSpace(cfg, names))


def test_velocity_checkpoint_never_fills_positions():
    fr = frames_for(ActionSpaceConfig(kind="velocity", absolute_joints=("gripper",)), DROID)
    state = np.linspace(0.1, 0.8, 8)
    fr.observation(Observation(images={}, state=state, instruction="x", stamp=5.0))
    model_out = np.tile(np.arange(8, dtype=np.float32) / 10, (3, 1))
    cmd = fr.command(ActionChunk(model_out, stamp=5.0, frame_id=0))
    vel, pos = (received(m) for m in command_messages(cmd, 5.0, 1 / 15))
    assert vel.joint_names == list(DROID[:7]) and pos.joint_names == ["gripper"]
    for p in vel.points:
        assert len(p.positions) == 0 and len(p.accelerations) == 0
    np.testing.assert_allclose([p.velocities for p in vel.points], model_out[:, :7], atol=1e-7)
    np.testing.assert_allclose([p.positions for p in pos.points], model_out[:, 7:], atol=1e-7)
    assert all(len(p.velocities) == 0 for p in pos.points)
    assert vel.header.stamp.sec == 5 and vel.points[1].time_from_start.nanosec == round(2e9 / 15)
    names, values, field = primary_values(cmd)  # the per-step stream steps through velocities
    assert field == "velocity" and names == DROID[:7] and values.shape == (3, 7)


def test_aloha_delta_chunk_reaches_the_controller_as_absolute_flipped_positions():
    names = ("waist", "shoulder", "gripper")
    fr = frames_for(
        ActionSpaceConfig(
            kind="delta",
            absolute_joints=("gripper",),
            flip_joints=("shoulder",),
            gripper_joints=("gripper",),
            gripper_conversion="aloha",
        ),
        names,
    )
    obs = fr.observation(Observation(images={}, state=np.array([0.2, 0.3, 0.5]), instruction="x", stamp=2.0))
    np.testing.assert_allclose(obs.state[:2], [0.2, -0.3], atol=1e-7)  # what the model is given
    cmd = fr.command(ActionChunk(np.array([[0.1, 0.05, 0.4]], np.float32), stamp=2.0, frame_id=3))
    traj, extra = command_messages(cmd, 2.0, 0.02)
    assert extra is None
    got = received(traj).points[0]
    # waist: 0.2 + 0.1; shoulder: -(-0.3 + 0.05); gripper: (0.4 + 0.5476 + 0.6213) / 2.1123
    np.testing.assert_allclose(got.positions, [0.3, 0.25, (0.4 + 0.5476 + 0.6213) / 2.1123], atol=1e-6)
    assert len(got.velocities) == 0


def test_ee_delta_goes_out_as_a_labelled_multi_array():
    names = ("dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper")
    fr = frames_for(ActionSpaceConfig(kind="ee_delta"), names)
    fr.observation(Observation(images={}, state=np.zeros(7), instruction="x", stamp=1.0))
    a = np.arange(14, dtype=np.float32).reshape(2, 7)
    msg, extra = command_messages(fr.command(ActionChunk(a, stamp=1.0, frame_id=0)), 1.0, 0.05)
    got = received(msg)
    assert isinstance(got, Float64MultiArray) and extra is None
    assert [d.label for d in got.layout.dim] == ["step", ",".join(names)]
    np.testing.assert_array_equal(np.asarray(got.data).reshape(2, 7), a)


def test_chunk_of_an_unknown_observation_is_refused():
    fr = frames_for(ActionSpaceConfig(kind="delta"), ("a",))
    with pytest.raises(ValueError, match="no observation state"):
        fr.command(ActionChunk(np.zeros((1, 1)), stamp=9.0, frame_id=7))


def node_cfg(model: str, space: ActionSpaceConfig, joints=tuple(f"j{i}" for i in range(14))) -> NodeConfig:
    """A NodeConfig with only what :func:`action_space` reads set meaningfully."""
    from dataclasses import MISSING, fields

    plain = {f.name: "" for f in fields(NodeConfig) if f.default is MISSING and f.default_factory is MISSING}
    return NodeConfig(**{**plain, "model": model, "joint_names": joints}, action_space=space)


def test_configure_fails_when_the_checkpoint_says_relative(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(PARITY, folder)
    raw = json.loads((folder / "config.json").read_text())
    raw.update(
        use_relative_actions=True,
        relative_exclude_joints=["gripper"],
        action_feature_names=[f"j{i}" if i % 7 != 6 else f"gripper{i}" for i in range(14)],
    )
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(
        ValueError,
        match=r"action_space.kind='absolute' but .*config.json says "
        r"use_relative_actions=true",
    ):
        action_space(node_cfg(str(folder), ActionSpaceConfig()))
    with pytest.raises(ValueError, match=r"action_space.absolute_joints=\['j6'\] but .* keeps \['j6', 'j13'\]"):
        action_space(node_cfg(str(folder), ActionSpaceConfig(kind="delta", absolute_joints=("j6",))))
    ok = action_space(node_cfg(str(folder), ActionSpaceConfig(kind="delta", absolute_joints=("j6", "j13"))))
    assert ok.kind == "delta" and ok.absolute.tolist() == [i % 7 == 6 for i in range(14)]
    assert action_space(node_cfg(str(PARITY), ActionSpaceConfig())).is_identity  # it states absolute
