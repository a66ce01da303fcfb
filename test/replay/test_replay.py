"""Offline replay (oxygen_ros.replay.replay) of the ALOHA sim sample bag and of damaged bags.

Every replay runs the pi05-tiny random-weight preset with the node's own parameter file
(config/oxygen.yaml), so the topic mapping is the one the node uses.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from bag_edit import SAMPLE_BAG, TS, corrupt_a_chunk, edit_bag, start_ns, window
from rclpy.serialization import deserialize_message
from rosbags.highlevel import AnyReader
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.bags.reader import BagInput
from oxygen_ros.bags.writer import to_rosbags
from oxygen_ros.core.config import get_preset
from oxygen_ros.replay.replay import ReplayError, ReplayOptions, main, replay
from oxygen_ros.sim.scene import JOINT_NAMES

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")

TINY = ("model:=pi05-tiny", "num_threads:=1")
H = get_preset("pi05-tiny").action_horizon
CAMS = (
    "/cam_high/image_raw/compressed",
    "/cam_left_wrist/image_raw/compressed",
    "/cam_right_wrist/image_raw/compressed",
)
T0 = start_ns()


def run(bag: Path, out: Path | None, *params: str, **kw) -> object:
    """Replay ``bag`` with pi05-tiny, quietly."""
    opts = ReplayOptions(bag=bag, out=out, params=TINY + params, progress="off", show_text=False, **kw)
    return replay(opts)


def cli(*args: str) -> int:
    """``replay`` on the command line with pi05-tiny, no progress bar."""
    return main([*args, "-p", TINY[0], "-p", TINY[1], "--progress", "off"])


def read_out(bag: Path) -> dict[str, list]:
    """topic -> [(log ns, rosbags message)] of an output bag, opened with plain rosbags."""
    out: dict[str, list] = {}
    with AnyReader([bag], default_typestore=TS) as reader:
        for c in reader.connections:
            out.setdefault(c.topic, [])
        for conn, t, raw in reader.messages():
            out[conn.topic].append((t, reader.deserialize(raw, conn.msgtype)))
    return out


def read_raw(bag: Path) -> dict[str, list[tuple[int, bytes]]]:
    """topic -> [(log ns, serialized bytes)] of a bag."""
    out: dict[str, list] = {}
    with BagInput(bag) as b:
        for topic, t, raw in b.messages(b.topics):
            out.setdefault(topic, []).append((t, raw))
    return out


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("replay") / "out"
    return run(SAMPLE_BAG, out), out


def test_sample_bag_output_bag_topics_and_counts(sample_run):
    result, out = sample_run
    assert result.ok, result.problems
    bag = read_out(out / "output_bag")
    assert set(bag) == {"/action_chunk", "/conversation/delta", "/conversation/text", "/memory/delta", "/memory/text"}
    chunks = bag["/action_chunk"]
    assert len(chunks) == 100  # one frame per top-camera image (10 Hz x 10 s)
    cam_stamps = {T0 + i * 100_000_000 for i in range(100)}
    for t, msg in chunks:
        assert list(msg.joint_names) == list(JOINT_NAMES)
        assert len(msg.points) == H and all(len(p.positions) == 14 for p in msg.points)
        assert msg.points[0].time_from_start.nanosec == 20_000_000  # control_period_s 0.02
        stamp = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
        nearest = round((stamp - T0) / 1e8) * 100_000_000 + T0
        # header stamp = observation stamp (float seconds in the core: ~100 ns rounding at 1.7e9 s)
        assert nearest in cam_stamps and abs(stamp - nearest) < 1000 and t == nearest
        assert np.isfinite(np.array([p.positions for p in msg.points])).all()
    assert len(bag["/conversation/text"]) == 4  # the bag's 4 asks, all finished
    assert len(bag["/memory/text"]) == 4  # every 25 frames: frames 0, 25, 50, 75
    for task in ("conversation", "memory"):  # deltas between finished texts add up to each text
        deltas = "".join(m.data for _, m in bag[f"/{task}/delta"])
        assert deltas == "".join(m.data for _, m in bag[f"/{task}/text"])
    assert result.stats.outputs["/action_chunk"] == 100


def test_sample_bag_report_and_plots(sample_run):
    result, out = sample_run
    for key in (
        "frames",
        "action ",
        "chunk latency",
        "tok/s",
        "time to first token",
        "deadline misses",
        "drops",
        "chunk switches",
    ):
        assert key in result.report
    data = json.loads((out / "report.json").read_text())
    s = data["summary"]
    assert s["chunks"] == 100 and s["frames_with_observation"] == 100
    assert s["action_hz"] > 0 and s["chunk_latency_p99_s"] >= s["chunk_latency_p50_s"] > 0
    assert s["tokens"] > 0 and s["tok_per_s"] > 0 and s["ttft_p50_s"] > 0
    assert s["request_status"] == {"finished": 8}
    assert s["drops"] == {} and s["masked_slots"] == {} and s["gaps"] == []
    assert len(data["frames"]) == 100 and len(data["requests"]) == 8
    # every chunk after the first executed one takes over from its predecessor: measured, or after
    # a hold (the machine was slower than the 0.1 s between frames), or never executed
    assert s["chunk_switches"] + s["switches_after_hold"] + s["chunks_never_executed"] == 99
    assert s["command_kind"] == "position"
    if s["chunk_switches"]:  # random weights: independent chunks jump
        assert s["switch_jump_max"] >= s["switch_jump_median"] > 0
        assert f"{s['chunk_switches']} measured, switch discontinuity median" in result.report
    for name in ("timeline.png", "trajectories.png", "decode_batch.png"):
        png = (out / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (out / "report.txt").read_text().strip() == result.report


def test_same_bag_twice_gives_identical_actions_and_text(tmp_path):
    # A fixed decode budget: the adaptive one fits decode steps to the wall time left in a frame, so
    # how a text is cut into deltas (not the text itself) would depend on the machine's load.
    sampled = ("tasks.conversation.temperature:=1.5", "tasks.memory.temperature:=1.5", "engine.decode_budget:=fixed")
    bag = window(SAMPLE_BAG, tmp_path / "short", 4.0)
    a = run(bag, tmp_path / "a", *sampled)
    b = run(bag, tmp_path / "b", *sampled)
    assert len(a.chunks) == len(b.chunks) == 40
    for x, y in zip(a.chunks, b.chunks):
        assert x.stamp == y.stamp and np.array_equal(x.actions, y.actions)
    assert a.texts == b.texts and len(a.texts) >= 3
    assert read_raw(tmp_path / "a" / "output_bag") == read_raw(tmp_path / "b" / "output_bag")
    other = run(bag, None, *sampled, "engine.seed:=7")  # the seed matters
    assert not np.array_equal(other.chunks[0].actions, a.chunks[0].actions)


def test_concurrent_schedule_replays_the_same_actions_and_text(tmp_path):
    """engine.schedule:=concurrent (two loops) gives the serial schedule's chunks and texts; the
    report names the schedule and carries its metrics."""
    sampled = ("tasks.conversation.temperature:=1.5", "tasks.memory.temperature:=1.5")
    bag = window(SAMPLE_BAG, tmp_path / "short", 4.0)
    a = run(bag, None, *sampled)
    b = run(bag, tmp_path / "b", *sampled, "engine.schedule:=concurrent")
    assert len(a.chunks) == len(b.chunks) == 40
    for x, y in zip(a.chunks, b.chunks):
        assert x.stamp == y.stamp and np.array_equal(x.actions, y.actions)
    assert sorted(a.texts) == sorted(b.texts) and len(b.texts) >= 3
    s = json.loads((tmp_path / "b" / "report.json").read_text())["summary"]
    assert s["schedule"] == "concurrent" and 0.0 <= s["batcher_busy_mean"] <= 1.0
    assert s["chunk_latency_language_p50_s"] > 0 and s["tokens_per_frame"] > 0
    assert "concurrent: chunk latency p50 with language" in b.report


def test_missing_camera_topic_masks_the_slot_and_says_so(tmp_path):
    src = window(SAMPLE_BAG, tmp_path / "short", 3.0)
    bag = edit_bag(src, tmp_path / "nowrist", lambda t, s, r: [] if t == CAMS[1] else [(t, s, r)])
    result = run(bag, tmp_path / "out")
    assert result.ok and len(result.chunks) == 30
    assert any("/cam_left_wrist/image_raw/compressed" in w and "masked" in w for w in result.stats.warnings)
    assert all(f.masked == ("left_wrist_0_rgb",) for f in result.stats.frames if f.has_obs)
    assert "left_wrist_0_rgb in 30 frames" in result.report
    assert "cam_left_wrist" in result.report


@pytest.mark.parametrize(
    "dropped, needle",
    [
        ({"/joint_states"}, "joint-state topic /joint_states"),
        (set(CAMS), "none of the camera topics"),
    ],
)
def test_bag_without_state_or_cameras_is_a_clear_error(tmp_path, dropped, needle):
    src = window(SAMPLE_BAG, tmp_path / "short", 1.0)
    bag = edit_bag(src, tmp_path / "bad", lambda t, s, r: [] if t in dropped else [(t, s, r)])
    with pytest.raises(ReplayError, match=needle):
        run(bag, tmp_path / "out")
    assert cli(str(bag), "--out", str(tmp_path / "cli")) == 2


def test_two_second_gap_is_reported_and_counted(tmp_path):
    gap = (T0 + 4 * 10**9, T0 + 6 * 10**9)
    bag = edit_bag(SAMPLE_BAG, tmp_path / "gap", lambda t, s, r: [] if gap[0] <= s < gap[1] else [(t, s, r)])
    result = run(bag, tmp_path / "out")
    assert result.ok, result.problems
    assert len(result.chunks) == 80  # 20 camera frames fell into the gap
    gaps = {topic: (start, length) for topic, start, length in result.stats.gaps}
    assert set(gaps) == {*CAMS, "/joint_states"}
    for start, length in gaps.values():
        assert 3.9 <= start <= 4.0 and 2.0 <= length <= 2.1
    assert "input gaps" in result.report and "silent 2." in result.report


def test_truncated_bag_file_is_a_clear_error(tmp_path):
    bag = tmp_path / "trunc"
    shutil.copytree(SAMPLE_BAG, bag)
    mcap = bag / "aloha_sim_sample.mcap"
    os.truncate(mcap, mcap.stat().st_size // 2)
    with pytest.raises(ReplayError, match="truncated"):
        run(bag, tmp_path / "out")
    assert cli(str(bag), "--out", str(tmp_path / "cli")) == 2


def test_corrupt_bag_file_is_a_clear_error(tmp_path, capsys):
    bag = tmp_path / "junk"
    bag.mkdir()
    shutil.copy(SAMPLE_BAG / "metadata.yaml", bag)
    (bag / "aloha_sim_sample.mcap").write_bytes(np.random.default_rng(0).bytes(100_000))
    with pytest.raises(ReplayError, match="corrupt"):
        run(bag, tmp_path / "out")
    assert cli(str(bag), "--out", str(tmp_path / "cli")) == 2
    assert "replay: error: cannot open bag" in capsys.readouterr().err
    with pytest.raises(ReplayError, match="does not exist"):
        run(tmp_path / "nothing", None)


def test_corrupt_chunk_inside_the_bag_is_counted_as_lost(tmp_path, capsys):
    bag = tmp_path / "flipped"
    shutil.copytree(SAMPLE_BAG, bag)
    corrupt_a_chunk(bag)
    result = run(bag, tmp_path / "out")
    assert not result.ok
    lost = result.stats.lost or {}
    assert result.stats.bag_error or sum(lost.values()) > 0
    assert "INCOMPLETE" in result.report and len(result.chunks) > 0
    assert cli(str(bag), "--out", str(tmp_path / "cli"), "--no-plots") == 3
    assert "INCOMPLETE" in capsys.readouterr().out


def test_bad_messages_are_counted_drops(tmp_path):
    """A corrupt JPEG, a JointState without the configured joints and undecodable CDR bytes."""
    src = window(SAMPLE_BAG, tmp_path / "short", 2.0)
    img_t, js_t = T0 + 500_000_000, T0 + 520_000_000

    def edit(topic, stamp, raw):
        if topic == CAMS[0] and stamp == img_t:
            msg = TS.deserialize_cdr(raw, "sensor_msgs/msg/CompressedImage")
            msg.data = np.frombuffer(b"not a jpeg" * 10, dtype=np.uint8)
            raw = TS.serialize_cdr(msg, "sensor_msgs/msg/CompressedImage")
        elif topic == "/joint_states" and stamp == js_t:
            msg = TS.deserialize_cdr(raw, "sensor_msgs/msg/JointState")
            msg.name = ["elbow_only"]
            msg.position = msg.position[:1]
            msg.velocity = msg.velocity[:1]
            raw = TS.serialize_cdr(msg, "sensor_msgs/msg/JointState")
        elif topic == CAMS[2] and stamp == img_t:
            raw = b"\x00\x01\x00\x00\xff\xff"
        return [(topic, stamp, bytes(raw))]

    result = run(edit_bag(src, tmp_path / "bad", edit), tmp_path / "out")
    assert result.ok and len(result.chunks) == 20
    drops = result.stats.drops
    assert drops["image decode errors"] == 1
    assert drops["bad joint states on /joint_states"] == 1
    assert drops[f"undecodable messages on {CAMS[2]}"] == 1
    assert "image decode errors 1" in result.report


def test_no_usable_joint_state_is_never_a_silent_empty_result(tmp_path):
    src = window(SAMPLE_BAG, tmp_path / "short", 1.0)
    names = "[" + ",".join(f"j{i}" for i in range(14)) + "]"
    result = run(src, tmp_path / "out", f"joint_names:={names}")
    assert not result.ok and not result.chunks
    assert "no action chunk was produced" in result.problems[0]
    assert "waiting for joint states" in result.problems[0]
    assert result.stats.drops["bad joint states on /joint_states"] == 50
    # the ask of the window can never start (no prefix): cancelled and counted at the end, not
    # waited for until it expires
    assert result.stats.drops["language requests cancelled at the end of the bag"] == 1


def test_backwards_time_jump_clears_buffers_and_continues(tmp_path):
    src = window(SAMPLE_BAG, tmp_path / "short", 2.0)
    shift = 3 * 10**9  # replayed again 3 s later with the original header stamps (a bag loop)
    bag = edit_bag(src, tmp_path / "loop", lambda t, s, r: [(t, s, r), (t, s + shift, r)])
    result = run(bag, tmp_path / "out")
    assert result.ok and len(result.chunks) == 40
    assert result.stats.drops["backwards time jumps (buffers cleared)"] >= 1


def test_camera_type_mismatch_names_the_parameter(tmp_path):
    with pytest.raises(ReplayError, match=r"cameras\.base_0_rgb\.type=raw"):
        run(SAMPLE_BAG, None, "cameras.base_0_rgb.type:=raw")
    with pytest.raises(ReplayError, match="tokens_per_frame"):
        run(SAMPLE_BAG, None, "engine.tokens_per_frame:=0")


def test_recorded_timing_runs_at_bag_speed(tmp_path):
    # 3 s of bag at x2 is 1.5 s of wall time: room for a slow first (warm-up) frame on a loaded CI
    # machine, whose overlapping observations are superseded, and still more than one chunk
    bag = window(SAMPLE_BAG, tmp_path / "short", 3.0)
    result = run(bag, tmp_path / "out", timing="recorded", rate=2.0, plots=False)
    assert result.ok and len(result.chunks) >= 2
    assert result.stats.wall_total >= 1.4  # 3 s of bag at x2
    assert "recorded timing x2" in result.report
    assert all(f.latency is not None and f.latency >= 0 for f in result.stats.frames if f.action)


def test_existing_output_folder_needs_overwrite(tmp_path, sample_run):
    _, out = sample_run
    with pytest.raises(ReplayError, match="--overwrite"):
        run(SAMPLE_BAG, out)
    junk = tmp_path / "out"
    (junk / "output_bag").mkdir(parents=True)
    (junk / "output_bag" / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="non-bag entries"):
        run(window(SAMPLE_BAG, tmp_path / "short", 1.0), junk, overwrite=True)
    assert (junk / "output_bag" / "notes.txt").read_text() == "mine"


def test_output_messages_roundtrip_through_rclpy(sample_run):
    """rosbags-serialized chunks deserialize with rclpy to the message the converter built."""
    _, out = sample_run
    with BagInput(out / "output_bag") as bag:
        topic, _, raw = next(iter(bag.messages(["/action_chunk"])))
    msg = deserialize_message(raw, JointTrajectory)
    assert len(msg.points) == H
    again = TS.serialize_cdr(to_rosbags(msg, TS), "trajectory_msgs/msg/JointTrajectory")
    assert bytes(again) == raw


def test_rtc_gets_a_report_line_and_json_entry(tmp_path, capsys):
    bag = window(SAMPLE_BAG, tmp_path / "short", 2.0)
    assert cli(str(bag), "--out", str(tmp_path / "rtc"), "--no-plots", "-p", "rtc.enabled:=true") == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  rtc "))
    assert line.startswith(
        "  rtc             on (elementwise guidance, linear schedule, execution horizon 10, max weight 10): "
    ), line
    assert " chunks guided, unguided: " in line and "inference delay " in line, line
    rtc = json.loads((tmp_path / "rtc" / "report.json").read_text())["summary"]["rtc"]
    assert rtc["rtc_enabled"] is True and rtc["rtc_guided"] >= 1, rtc
    assert cli(str(bag), "--out", str(tmp_path / "off"), "--no-plots") == 0
    assert not [x for x in capsys.readouterr().out.splitlines() if x.startswith("  rtc ")]  # off: no line
