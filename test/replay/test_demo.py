"""The demo (``make demo``): cached random-weight checkpoint with bag statistics, and the run itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from bag_edit import SAMPLE_BAG

from oxygen_ros.bags.reader import BagError, BagInput
from oxygen_ros.core.types import NormStats
from oxygen_ros.replay.demo import build_parser, demo_threads, main, sample_bag, shipped_policy
from oxygen_ros.replay.demo_checkpoint import FINGERPRINT, bag_norm_stats, cache_root, ensure_checkpoint
from oxygen_ros.sim.scene import JOINT_NAMES

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
GRIPPERS = [JOINT_NAMES.index("left_gripper"), JOINT_NAMES.index("right_gripper")]


@pytest.fixture(scope="module")
def stats():
    return bag_norm_stats(SAMPLE_BAG, JOINT_NAMES)


def test_norm_stats_come_from_the_bag(stats):
    s, a = stats["state"], stats["actions"]
    assert s.dim == a.dim == 14
    assert np.all(s.q01 <= s.q99) and np.all(a.q01 <= a.q99)
    assert np.all(s.q01 <= s.mean + 1e-6) and np.all(s.mean <= s.q99 + 1e-6)
    for j in GRIPPERS:  # gym-aloha normalised grippers: 0 closed .. 1 open
        assert 0.0 <= s.q01[j] < s.q99[j] <= 1.0
    assert a.q01[GRIPPERS[1]] < 0.05 < s.q01[GRIPPERS[1]]  # commands close fully, the cube stops it
    assert np.any(s.q99 - s.q01 > 0.5)  # the arms move


def test_norm_stats_need_the_joints(tmp_path):
    with pytest.raises(BagError, match="need at least 2 usable /joint_states"):
        bag_norm_stats(SAMPLE_BAG, ["not_a_joint"])
    with pytest.raises(BagError, match="does not exist"):
        bag_norm_stats(tmp_path / "nothing", JOINT_NAMES)


def test_checkpoint_is_built_cached_checked_and_rebuilt(tmp_path, stats, monkeypatch):
    monkeypatch.setenv("OXYGEN_ROS_CACHE", str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache"
    logs: list[str] = []
    folder, policy = ensure_checkpoint(stats, preset="pi05-tiny", log=logs.append)
    assert folder == tmp_path / "cache" / "pi05-tiny-random" and "building" in logs[-1]
    assert {p.name for p in folder.iterdir()} >= {
        "model.safetensors",
        "tokenizer.json",
        "config.json",
        FINGERPRINT,
        "assets",
    }
    np.testing.assert_allclose(policy.norm_stats["state"].q99, stats["state"].q99)
    np.testing.assert_allclose(policy.norm_stats["actions"].q01, stats["actions"].q01)
    weights = folder / "model.safetensors"
    mtime = weights.stat().st_mtime_ns

    _, again = ensure_checkpoint(stats, preset="pi05-tiny", log=logs.append)
    assert logs[-1].startswith("using the cached") and weights.stat().st_mtime_ns == mtime
    w0 = next(again.model.parameters()).detach().clone()

    os.truncate(weights, weights.stat().st_size // 2)  # corrupt cache: rebuilt, same weights
    _, rebuilt = ensure_checkpoint(stats, preset="pi05-tiny", log=logs.append)
    assert "does not load" in logs[-2] and "building" in logs[-1]
    assert np.array_equal(next(rebuilt.model.parameters()).detach().numpy(), w0.numpy())

    other = {"state": NormStats.identity(14), "actions": stats["actions"]}
    ensure_checkpoint(other, preset="pi05-tiny", log=logs.append)
    assert "other settings" in logs[-2]
    assert json.loads((folder / FINGERPRINT).read_text())["preset"] == "pi05-tiny"
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]  # no partials


def test_demo_helpers():
    assert sample_bag() == SAMPLE_BAG
    assert demo_threads() >= 1
    assert build_parser().parse_args([]).out == Path("out") / "oxygen_demo"  # not the repository root


def test_demo_with_a_missing_bag_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OXYGEN_ROS_CACHE", str(tmp_path / "cache"))
    assert main(["--bag", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "oxygen_demo: error:" in err and "nothing does not exist" in err


@pytest.mark.slow
@pytest.mark.skipif(not (shipped_policy() / "model.safetensors").is_file(), reason="no shipped policy")
def test_demo_runs_the_bundled_policy_and_answers(tmp_path, capsys):
    """``make demo`` by default: the trained sim policy on the bundled bag; its answer to the bag's
    "Where is the cube?" at 3 s is the sim's true region (seed 0: back right), and its chunks
    follow the recorded commands far better than holding the state."""
    out = tmp_path / "demo"
    assert main(["--out", str(out), "--max-frames", "45", "--progress", "off"]) == 0
    text = capsys.readouterr().out
    assert f"model:={shipped_policy()}" in text and "random" not in text.split("replay of")[0]
    assert "ask (conversation): Where is the cube?" in text
    assert "Q: Where is the cube?] back right'" in text, text
    report = json.loads((out / "report.json").read_text())
    acc = report["action_accuracy"]
    assert acc["available"] and acc["mae"] < 0.5 * acc["hold_baseline"]["mae"], acc


@pytest.mark.slow
def test_demo_with_random_weights(tmp_path, capsys, monkeypatch, stats):
    """``--model random``: builds the pi05-small checkpoint, replays 15 frames, reports."""
    monkeypatch.setenv("OXYGEN_ROS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert main(["--model", "random", "--out", str(out), "--max-frames", "15", "--progress", "off"]) == 0
    text = capsys.readouterr().out
    assert "building a random-weight pi05-small checkpoint" in text
    assert "ask (conversation): What do you see?" in text
    assert "conversation #" in text  # a finished utterance was printed
    assert f"outputs in {out}/: output_bag/" in text  # where it wrote them
    for key in ("action ", "chunk latency", "tok/s", "deadline misses", "drops"):
        assert key in text
    with BagInput(out / "output_bag") as bag:
        assert bag.topics["/action_chunk"].count == 15
        from rclpy.serialization import deserialize_message
        from trajectory_msgs.msg import JointTrajectory

        acts = np.array(
            [
                [p.positions for p in deserialize_message(r, JointTrajectory).points]
                for _, _, r in bag.messages(["/action_chunk"])
            ]
        )
    lo, hi = stats["actions"].q01, stats["actions"].q99
    span = np.maximum(hi - lo, 1e-3)
    inside = (acts >= lo - span) & (acts <= hi + span)  # unnormalised with the bag's stats
    assert inside.mean() > 0.9
    for name in ("report.txt", "report.json", "timeline.png", "trajectories.png", "decode_batch.png"):
        assert (out / name).is_file()
    assert main(["--model", "random", "--out", str(out), "--max-frames", "3", "--progress", "off"]) == 0  # cached now
    assert "using the cached random-weight pi05-small" in capsys.readouterr().out
