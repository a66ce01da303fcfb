"""Tests for the committed sample bag (data/aloha_sim_sample) and the record_sim_bag tool."""

from __future__ import annotations

import argparse
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest
from rosbags.highlevel import AnyReader
from rosbags.typesys import Stores, get_typestore

from oxygen_ros.sim.record_bag import (
    ASK_TOPIC,
    COMMAND_TOPIC,
    CUBE_REGION_TOPIC,
    EPOCH_NS,
    INSTRUCTION_TOPIC,
    JOINT_STATES_TOPIC,
    PHASE_TOPIC,
    _due,
    main,
    parse_size,
    record,
)
from oxygen_ros.sim.scene import CONTROL_RATE_HZ, JOINT_NAMES

SAMPLE_BAG = Path(__file__).resolve().parents[2] / "data" / "aloha_sim_sample"
CAMERA_TOPICS = (
    "/cam_high/image_raw/compressed",
    "/cam_left_wrist/image_raw/compressed",
    "/cam_right_wrist/image_raw/compressed",
)
STEP_NS = round(1e9 / CONTROL_RATE_HZ)


def read_bag(path: Path) -> dict[str, list[tuple[int, object]]]:
    """topic -> [(log time ns, deserialized message)] for every message of the bag at ``path``."""
    out: dict[str, list[tuple[int, object]]] = {}
    with AnyReader([path], default_typestore=get_typestore(Stores.ROS2_KILTED)) as reader:
        types = {c.topic: c.msgtype for c in reader.connections}
        assert types == {
            **dict.fromkeys(CAMERA_TOPICS, "sensor_msgs/msg/CompressedImage"),
            JOINT_STATES_TOPIC: "sensor_msgs/msg/JointState",
            COMMAND_TOPIC: "sensor_msgs/msg/JointState",
            INSTRUCTION_TOPIC: "std_msgs/msg/String",
            ASK_TOPIC: "std_msgs/msg/String",
            CUBE_REGION_TOPIC: "std_msgs/msg/String",
            PHASE_TOPIC: "std_msgs/msg/String",
        }
        for conn, stamp, raw in reader.messages():
            out.setdefault(conn.topic, []).append((stamp, reader.deserialize(raw, conn.msgtype)))
    return out


def stamp_ns(msg: object) -> int:
    return msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec


def decode(msg: object) -> np.ndarray:
    """CompressedImage -> uint8 [H, W, 3] RGB."""
    assert "jpeg" in msg.format
    bgr = cv2.imdecode(np.frombuffer(msg.data, np.uint8), cv2.IMREAD_COLOR)
    assert bgr is not None
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def red_fraction(rgb: np.ndarray) -> float:
    """Fraction of pixels of the red cube's colour."""
    r, g, b = (rgb[..., i].astype(int) for i in range(3))
    return float(np.mean((r > 120) & (g < 60) & (b < 60)))


def check_common(bag: dict, n_steps: int, n_frames: int, hw: tuple[int, int]) -> np.ndarray:
    """Checks shared by the committed and a freshly recorded bag; returns joint positions [n, 14]."""
    assert len(bag[JOINT_STATES_TOPIC]) == n_steps
    assert len(bag[COMMAND_TOPIC]) == n_steps
    for topic in (JOINT_STATES_TOPIC, COMMAND_TOPIC, *CAMERA_TOPICS):
        stamps = [t for t, _ in bag[topic]]
        assert stamps[0] == EPOCH_NS
        assert all(stamp_ns(m) == t for t, m in bag[topic]), "header stamp != bag time"
        assert np.all(np.diff(stamps) > 0)
    js_stamps = np.array([t for t, _ in bag[JOINT_STATES_TOPIC]])
    assert np.all(np.diff(js_stamps) == STEP_NS)
    for topic in (JOINT_STATES_TOPIC, COMMAND_TOPIC):
        for _, msg in bag[topic]:
            assert list(msg.name) == list(JOINT_NAMES)
            assert msg.position.shape == (14,) and np.all(np.isfinite(msg.position))
    for topic in CAMERA_TOPICS:
        assert len(bag[topic]) == n_frames
        for _, msg in bag[topic][:: max(1, n_frames // 5)]:
            img = decode(msg)
            assert img.shape == (*hw, 3) and img.dtype == np.uint8
            assert img.std() > 5, f"{topic} frame is blank"
    assert bag[INSTRUCTION_TOPIC][0][0] == EPOCH_NS
    assert all(m.data == "pick up the red cube" for _, m in bag[INSTRUCTION_TOPIC])
    return np.array([m.position for _, m in bag[JOINT_STATES_TOPIC]])


@pytest.fixture(scope="module")
def sample() -> dict:
    assert (SAMPLE_BAG / "metadata.yaml").is_file(), f"committed sample bag missing at {SAMPLE_BAG}"
    return read_bag(SAMPLE_BAG)


def test_sample_bag_is_small():
    size = sum(p.stat().st_size for p in SAMPLE_BAG.iterdir())
    assert size <= 10 * 1024 * 1024


def test_sample_bag_topics_counts_and_stamps(sample):
    pos = check_common(sample, n_steps=500, n_frames=100, hw=(240, 320))
    assert pos.shape == (500, 14)
    assert len(sample[INSTRUCTION_TOPIC]) == 5  # t = 0, 2, 4, 6, 8 s
    asks = [(t - EPOCH_NS) / 1e9 for t, _ in sample[ASK_TOPIC]]
    assert len(asks) == 4 and asks[0] == 0.5
    assert all(m.data.endswith("?") or m.data.endswith(".") for _, m in sample[ASK_TOPIC])


def test_sample_bag_robot_moves_and_tracks_commands(sample):
    pos = np.array([m.position for _, m in sample[JOINT_STATES_TOPIC]])
    cmd = np.array([m.position for _, m in sample[COMMAND_TOPIC]])
    arm = [JOINT_NAMES.index(f"{s}_{j}") for s in ("left", "right") for j in ("shoulder", "elbow")]
    assert np.all(np.ptp(pos[:, arm], axis=0) > 0.5), "both arms should visibly move (rad)"
    right_grip = pos[:, JOINT_NAMES.index("right_gripper")]
    assert right_grip.max() > 0.9 and right_grip[-1] < 0.8, "right gripper opens then closes on the cube"
    # the state one step later follows the command closely, except the gripper squeezing the cube
    err = np.abs(pos[1:] - cmd[:-1])
    assert np.median(err[:, arm]) < 0.05


def test_sample_bag_cameras_show_the_cube(sample):
    top = decode(sample["/cam_high/image_raw/compressed"][0][1])
    assert red_fraction(top) > 0.0005, "cube visible from the top camera at the start"
    right_end = decode(sample["/cam_right_wrist/image_raw/compressed"][-1][1])
    assert red_fraction(right_end) > 0.03, "cube held in front of the right wrist camera at the end"


@pytest.mark.parametrize("text,expected", [("320x240", (240, 320)), ("224", (224, 224)), ("64X48", (48, 64))])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "0x10", "10x", "axb", "1x2x3", "-5"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


@pytest.mark.parametrize("rate,fps,expected", [(10, 50, 10), (15, 50, 15), (50, 50, 50), (12.5, 50, 13)])
def test_camera_schedule_rate(rate, fps, expected):
    ticks = [k for k in range(fps) if _due(k, Fraction(str(rate)), Fraction(fps))]
    assert ticks[0] == 0 and len(ticks) == expected


def test_refuses_existing_bag_without_overwrite(tmp_path, capsys):
    out = tmp_path / "bag"
    out.mkdir()
    (out / "metadata.yaml").write_text("x")
    assert main(["--out", str(out), "--no-progress"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "metadata.yaml").read_text() == "x"


def test_overwrite_refuses_non_bag_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="non-bag"):
        record(tmp_path, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"fps": 0.0}, "control rate"),
        ({"camera_rate": 60.0}, "camera rate"),
        ({"camera_rate": 0.0}, "camera rate"),
        ({"seconds": 0.001}, "no control step"),
        ({"jpeg_quality": 0}, "JPEG quality"),
        ({"cameras": ["top", "top"]}, "duplicate camera"),
        ({"start_jitter": -0.1}, "start jitter"),
        ({"start_jitter": 0.6}, "start jitter"),
        ({"action_noise_rad": -0.01}, "action noise"),
        ({"action_noise_rad": 0.2}, "action noise"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        record(tmp_path / "bag", **kwargs)
    assert not (tmp_path / "bag").exists()


@pytest.mark.slow
def test_record_one_second_bag(tmp_path, sample):
    pytest.importorskip("mujoco")
    pytest.importorskip("gym_aloha")
    out = tmp_path / "short"
    args = ["--out", str(out), "--seconds", "1", "--size", "160x120", "--no-progress"]
    assert main(args) == 0
    bag = read_bag(out)
    pos = check_common(bag, n_steps=50, n_frames=10, hw=(120, 160))
    assert len(bag[INSTRUCTION_TOPIC]) == 1 and len(bag[ASK_TOPIC]) == 1
    assert np.ptp(pos, axis=0).max() > 0.1, "the robot moves within the first second"
    # same seed and script as the committed sample: same joint trajectory (image size is irrelevant)
    ref = np.array([m.position for _, m in sample[JOINT_STATES_TOPIC][:50]])
    np.testing.assert_allclose(pos, ref, atol=1e-3)
    # a second run refuses to clobber the bag, and --overwrite replaces it
    assert main(args) == 2
    assert main([*args, "--overwrite", "--seconds", "0.5"]) == 0
    assert len(read_bag(out)[JOINT_STATES_TOPIC]) == 25
    assert not list(tmp_path.glob(".*partial*"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"cameras": ["top", "no_such_camera"]}, "unknown camera"),
        ({"fps": 30.0}, "whole number"),  # 33.3 ms is not a multiple of the 2 ms physics step
        ({"fps": 1000.0}, "whole number"),  # faster than the physics step
        ({"size": (481, 640)}, "image size"),
    ],
)
def test_sim_rejects_bad_settings(tmp_path, kwargs, match):
    pytest.importorskip("mujoco")
    pytest.importorskip("gym_aloha")
    with pytest.raises(ValueError, match=match):
        record(tmp_path / "bag", seconds=0.1, **{"camera_rate": 5.0, **kwargs})
    assert not list(tmp_path.iterdir())


def test_into_a_pipe_record_sim_bag_draws_no_progress_bar(tmp_path):
    """stderr a pipe and no --no-progress: no tqdm frame (each a carriage return) in it."""
    out = tmp_path / "bag"
    r = subprocess.run(
        [sys.executable, "-m", "oxygen_ros.sim.record_bag", "--out", str(out), "--seconds", "0.3", "--size", "160x120"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "metadata.yaml").is_file()
    assert "\r" not in r.stderr and "step/s" not in r.stderr and "it/s" not in r.stderr, r.stderr[-2000:]


def test_start_offsets_are_seeded_per_episode_and_leave_the_grippers():
    from oxygen_ros.sim.record_bag import start_offset

    assert start_offset(3, 0.0) is None
    a, b = start_offset(3, 0.3), start_offset(4, 0.3)
    np.testing.assert_array_equal(a, start_offset(3, 0.3))
    assert a.shape == (14,) and not np.allclose(a, b)
    assert a[6] == a[13] == 0.0 and np.abs(a).max() <= 0.3 and np.abs(a).max() > 0.1


@pytest.mark.slow
def test_a_jittered_episode_starts_off_the_start_pose_and_the_oracle_still_lifts(tmp_path):
    pytest.importorskip("mujoco")
    pytest.importorskip("gym_aloha")
    from oxygen_ros.sim.record_bag import start_offset
    from oxygen_ros.sim.scene import SimScene
    from oxygen_ros.sim.task.script import ScriptedPickLift

    plain, jittered = tmp_path / "plain", tmp_path / "jittered"
    assert main(["--out", str(plain), "--seconds", "0.1", "--size", "64x48", "--seed", "5", "--no-progress"]) == 0
    args = ["--out", str(jittered), "--seconds", "0.1", "--size", "64x48", "--seed", "5", "--no-progress"]
    assert main([*args, "--start-jitter", "0.3"]) == 0
    q_plain = np.array(read_bag(plain)[JOINT_STATES_TOPIC][0][1].position)
    q_jit = np.array(read_bag(jittered)[JOINT_STATES_TOPIC][0][1].position)
    np.testing.assert_allclose(q_jit - q_plain, start_offset(5, 0.3), atol=1e-9)
    # the scripted pick-and-lift still lifts the cube from a jittered start
    scene = SimScene(cameras=("top",), image_size=(48, 64))
    try:
        scene.reset(5, start_offset(5, 0.3))
        script = ScriptedPickLift(scene)
        for k in range(round(script.duration * scene.control_rate_hz)):
            scene.step(script(k / scene.control_rate_hz))
        assert scene.cube_position[2] > 0.15
        # a bad offset is refused, and a plain reset is back at the start pose
        for bad in (np.ones(14), np.full(14, np.nan), np.zeros(12)):
            with pytest.raises(ValueError, match="arm_offset"):
                scene.reset(5, bad)
        np.testing.assert_allclose(scene.reset(5), q_plain, atol=1e-9)
    finally:
        scene.close()


def test_action_noise_is_seeded_slow_and_off_before_the_grasp():
    from oxygen_ros.sim.record_bag import NOISE_OFF_AT_S, action_noise

    assert action_noise(3, 0.0, 500, 50.0) is None
    a = action_noise(3, 0.1, 500, 50.0)
    np.testing.assert_array_equal(a, action_noise(3, 0.1, 500, 50.0))
    assert a.shape == (500, 14) and not np.allclose(a, action_noise(4, 0.1, 500, 50.0))
    assert (a[:, [6, 13]] == 0).all() and (a[0] == 0).all()  # grippers untouched; the start pose as reset
    assert (a[round(NOISE_OFF_AT_S * 50) :] == 0).all()  # off for the descent, grasp and lift
    reach = np.concatenate([action_noise(s, 0.1, 150, 50.0)[50:, :6] for s in range(40)])
    assert 0.07 < reach.std() < 0.13  # the stationary standard deviation, sigma
    step = np.abs(np.diff(a[:150], axis=0)).mean()
    assert step < 0.5 * np.abs(a[:150]).mean()  # slowly varying (white noise: about 1.4)


@pytest.mark.slow
def test_a_perturbed_episode_records_the_oracles_commands_and_the_oracle_still_lifts(tmp_path):
    pytest.importorskip("mujoco")
    pytest.importorskip("gym_aloha")
    from oxygen_ros.sim.record_bag import action_noise
    from oxygen_ros.sim.scene import SimScene
    from oxygen_ros.sim.task.script import ScriptedPickLift

    plain, noisy = tmp_path / "plain", tmp_path / "noisy"
    args = ["--seconds", "1", "--size", "64x48", "--seed", "5", "--no-progress", "--camera-rate", "1"]
    assert main(["--out", str(plain), *args]) == 0
    assert main(["--out", str(noisy), *args, "--action-noise", "0.1"]) == 0
    bags = read_bag(plain), read_bag(noisy)
    commands = [np.array([m.position for _, m in b[COMMAND_TOPIC]]) for b in bags]
    states = [np.array([m.position for _, m in b[JOINT_STATES_TOPIC]]) for b in bags]
    np.testing.assert_array_equal(commands[0], commands[1])  # the label: the oracle's own command
    np.testing.assert_array_equal(states[0][0], states[1][0])
    assert np.abs(states[1][-1] - states[0][-1]).max() > 0.02  # the arm went where the perturbation took it
    # the perturbed oracle still lifts the cube
    scene = SimScene(cameras=("top",), image_size=(48, 64))
    try:
        scene.reset(5)
        script = ScriptedPickLift(scene)
        n = round(script.duration * scene.control_rate_hz)
        noise = action_noise(5, 0.1, n, scene.control_rate_hz)
        for k in range(n):
            scene.step(script(k / scene.control_rate_hz) + noise[k])
        assert scene.cube_position[2] > 0.15
    finally:
        scene.close()
