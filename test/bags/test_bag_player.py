"""bag_player: the sample bag over real DDS (own domain, localhost), alone and into the oxygen node."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import rclpy
from bag_edit import SAMPLE_BAG, corrupt_a_chunk, edit_bag, start_ns
from domain_coordinator import domain_id
from rclpy.context import Context
from rclpy.serialization import deserialize_message
from rclpy.signals import SignalHandlerOptions
from ros_helpers import REPO, RosPeer, node_process, ros_env
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CompressedImage, JointState

from oxygen_ros.bags.player import BagPlayer, main, qos_from_recorded
from oxygen_ros.bags.reader import BagInput
from oxygen_ros.core.config import get_preset
from oxygen_ros.ros.qos import reliable_qos
from oxygen_ros.sim.scene import JOINT_NAMES
from oxygen_ros.streams.text import is_waiting_notice

pytestmark = pytest.mark.ros
T0 = start_ns()
CAM = "/cam_high/image_raw/compressed"
INPUTS = [
    CAM,
    "/cam_left_wrist/image_raw/compressed",
    "/cam_right_wrist/image_raw/compressed",
    "/joint_states",
    "/instruction",
    "/ask",
]


def _stamp_ns(msg) -> int:
    return msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec


@pytest.fixture
def player_node():
    """(domain id, an rclpy node in its own context on that domain) for the player."""
    with domain_id() as dom:
        ctx = Context()
        rclpy.init(context=ctx, domain_id=dom, signal_handler_options=SignalHandlerOptions.NO)
        node = rclpy.create_node("test_bag_player", context=ctx)
        try:
            yield dom, node
        finally:
            node.destroy_node()
            ctx.try_shutdown()


def test_plays_recorded_bytes_at_recorded_timing_with_clock(player_node):
    dom, node = player_node
    peer = RosPeer(dom, "listener")
    try:
        peer.collect(JointState, "/joint_states", reliable_qos(1000))
        peer.collect(CompressedImage, CAM, reliable_qos(100))
        peer.collect(Clock, "/clock", reliable_qos(1000))
        with BagInput(SAMPLE_BAG) as bag:
            # read the bag once first: what is timed is the player, not a cold disk or page cache
            # (CI runs this first, right after installing two venvs: one 200 ms stall made 19 late)
            assert sum(1 for _ in bag.messages(["/joint_states", CAM])) > 100
            player = BagPlayer(bag, node, topics=["/joint_states", CAM], clock_hz=50.0)
            assert player.wait_for_subscribers(20, clock=True) == []
            stats = player.play(rate=2.0, duration=2.0)
            first_raw = next(r for t, _, r in bag.messages(["/joint_states"]))
        peer.wait_for(lambda: len(peer.messages("/joint_states")) >= 100, 10)
        peer.wait_for(lambda: len(peer.messages(CAM)) >= 20, 5)
    finally:
        peer.close()
    states = peer.messages("/joint_states")
    assert len(states) == 100 and stats.published["/joint_states"] == 100
    assert [_stamp_ns(m) for m in states] == [T0 + k * 20_000_000 for k in range(100)]
    assert states[0] == deserialize_message(first_raw, JointState)  # the recorded bytes, unchanged
    assert list(states[0].name) == list(JOINT_NAMES)
    assert len(peer.messages(CAM)) == 20
    span = peer.times("/joint_states")[-1] - peer.times("/joint_states")[0]
    # received times: a first message delivered late shortens the span on a loaded machine (one
    # run saw 0.79 s); as fast as possible would take a few ms, rate 1 about 2 s
    assert 0.6 <= span <= 1.6, f"1.98 s of bag at rate 2 took {span:.2f} s"
    assert stats.late <= 5
    clock = [m.clock.sec * 10**9 + m.clock.nanosec for m in peer.messages("/clock")]
    assert len(clock) >= 35 and clock == sorted(clock)
    # the clock starts at the bag's first stamp (not 0, not wall time); its first tick may come a few
    # 50 Hz periods late on a loaded machine (a loop run once saw 174 ms)
    assert T0 <= clock[0] <= T0 + 300_000_000 and abs(clock[-1] - (T0 + 2 * 10**9)) < 150_000_000


def test_remap_and_start_offset(player_node):
    dom, node = player_node
    peer = RosPeer(dom, "listener")
    try:
        peer.collect(JointState, "/robot/joint_states", reliable_qos(1000))
        with BagInput(SAMPLE_BAG) as bag:
            player = BagPlayer(bag, node, topics=["/joint_states"], remap={"/joint_states": "/robot/joint_states"})
            assert player.wait_for_subscribers(20) == []
            stats = player.play(rate=5.0, start_offset=9.0)
        peer.wait_for(lambda: len(peer.messages("/robot/joint_states")) >= 50, 5)
    finally:
        peer.close()
    got = peer.messages("/robot/joint_states")
    assert len(got) == 50 == stats.published["/robot/joint_states"]
    assert _stamp_ns(got[0]) == T0 + 9 * 10**9


def test_qos_follows_the_recorded_publishers():
    from rclpy.qos import DurabilityPolicy, ReliabilityPolicy

    with BagInput(SAMPLE_BAG) as bag:
        qos = qos_from_recorded(bag.topics[CAM].qos)
    assert qos.reliability == ReliabilityPolicy.RELIABLE
    assert qos.durability == DurabilityPolicy.VOLATILE and qos.depth == 10
    assert qos_from_recorded([]).reliability == ReliabilityPolicy.RELIABLE


def test_bad_bags_and_arguments_exit_2(tmp_path, capsys):
    trunc = tmp_path / "trunc"
    shutil.copytree(SAMPLE_BAG, trunc)
    mcap = trunc / "aloha_sim_sample.mcap"
    os.truncate(mcap, mcap.stat().st_size // 3)
    with domain_id() as dom:
        os.environ["ROS_DOMAIN_ID"] = str(dom)
        try:
            assert main([str(tmp_path / "missing")]) == 2
            assert "does not exist" in capsys.readouterr().err
            assert main([str(trunc)]) == 2
            assert "truncated" in capsys.readouterr().err
            assert main([str(SAMPLE_BAG), "--topics", "/nope"]) == 2
            assert "topics ['/nope'] are not in" in capsys.readouterr().err
            assert main([str(SAMPLE_BAG), "--remap", "/a/b"]) == 2
            assert main([str(SAMPLE_BAG), "--record", str(tmp_path / "rec")]) == 2
            flipped = tmp_path / "flipped"  # a corrupt chunk: plays the rest, exit 3, says so
            shutil.copytree(SAMPLE_BAG, flipped)
            corrupt_a_chunk(flipped)
            capsys.readouterr()
            assert main([str(flipped), "--rate", "20", "--topics", "/joint_states", "/ask"]) == 3
            err = capsys.readouterr().err
            assert "INCOMPLETE" in err and "unreadable messages on /joint_states" in err
        finally:
            os.environ.pop("ROS_DOMAIN_ID", None)


@pytest.mark.slow
def test_feeds_the_oxygen_node_and_records_its_outputs(tmp_path):
    """The whole online path: bag_player -> DDS -> oxygen node -> DDS -> recorded output bag."""
    rec = tmp_path / "node_outputs"
    with domain_id() as dom:
        params = {"model": "pi05-tiny", "num_threads": 1}
        with node_process(dom, tmp_path / "node.log", REPO / "config" / "oxygen.yaml", params) as node:
            play = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "oxygen_ros.bags.player",
                    str(SAMPLE_BAG),
                    "--topics",
                    *INPUTS,
                    "--wait-for-subscribers",
                    "60",
                    "--record",
                    str(rec),
                    "--record-topics",
                    "/action_chunk",
                    "/conversation/delta",
                    "/conversation/text",
                    "/memory/text",
                    "--record-linger",
                    "8",
                ],
                cwd=REPO,
                env=ros_env(dom),
                capture_output=True,
                text=True,
                timeout=150,
            )
            assert node.poll() is None, (tmp_path / "node.log").read_text()
    log = (tmp_path / "node.log").read_text()
    assert play.returncode == 0, play.stdout + play.stderr + log
    assert "no subscriber" not in play.stderr, play.stderr + log
    out: dict[str, list] = {}
    with BagInput(rec) as bag:
        for topic, _, raw in bag.messages(bag.topics):
            out.setdefault(topic, []).append(raw)
    from std_msgs.msg import String
    from trajectory_msgs.msg import JointTrajectory

    chunks = [deserialize_message(r, JointTrajectory) for r in out.get("/action_chunk", [])]
    assert len(chunks) >= 50, (play.stdout, log)  # about one per camera image (100 in the bag)
    cams = np.array([T0 + k * 100_000_000 for k in range(100)])
    for msg in chunks:
        assert list(msg.joint_names) == list(JOINT_NAMES)
        assert len(msg.points) == get_preset("pi05-tiny").action_horizon
        # stamped by a bag observation: its stamp is the newer of the image and the matched joint
        # state, which is within state_tolerance_s (0.05 s in config/oxygen.yaml) of the image
        assert np.abs(cams - _stamp_ns(msg)).min() <= 50_000_000
    texts = [deserialize_message(r, String).data for r in out.get("/conversation/text", [])]
    texts = [t for t in texts if not is_waiting_notice(t)]  # an ask ahead of the first observation
    assert len(texts) == 4, (play.stdout, log)  # the bag's four asks, answered
    deltas = "".join(deserialize_message(r, String).data for r in out["/conversation/delta"])
    assert deltas == "".join(texts)


def test_record_into_an_existing_folder_names_overwrite(tmp_path, capsys):
    rec = tmp_path / "rec"
    rec.mkdir()
    assert main([str(SAMPLE_BAG), "--record", str(rec), "--record-topics", "/action_chunk"]) == 2
    err = capsys.readouterr().err
    assert f"--record {rec} already exists; pass --overwrite" in err, err


def _record(dom: int, rec, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "oxygen_ros.bags.player",
            str(SAMPLE_BAG),
            "--topics",
            "/joint_states",
            "--rate",
            "10",
            "--duration",
            "2",
            "--record",
            str(rec),
            "--record-linger",
            "0.5",
            *extra,
        ],
        cwd=REPO,
        env=ros_env(dom),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_empty_recording_exits_4_and_says_why_per_topic(tmp_path):
    """Nothing published on the recorded topics (no node at all): exit status 4, each topic named
    with the reason; the (empty) bag is still written. A recording with messages exits 0."""
    with domain_id() as dom:
        play = _record(dom, tmp_path / "empty", "--record-topics", "/action_chunk", "/conversation/text")
        assert play.returncode == 4, play.stdout + play.stderr
        assert "EMPTY RECORDING" in play.stderr and "'active, ready'" in play.stderr, play.stderr
        assert "/action_chunk: no message (never in the graph)" in play.stderr, play.stderr
        assert "/conversation/text: no message (never in the graph)" in play.stderr, play.stderr
        assert (tmp_path / "empty" / "metadata.yaml").is_file()
        # the player's own topic is in the graph with a publisher: recorded, exit 0
        play = _record(dom, tmp_path / "self", "--record-topics", "/joint_states")
        assert play.returncode == 0, play.stdout + play.stderr
        assert "EMPTY" not in play.stderr


@pytest.mark.slow
def test_a_node_that_failed_to_configure_gives_an_empty_recording_exit_4(tmp_path):
    """The node is up but its configure failed (a bad parameter): its output publishers never
    appear, so the recording is empty; the player says so and exits 4 (it used to exit 0)."""
    with domain_id() as dom:
        params = {"model": "pi05-tiny", "num_threads": 1, "engine.block_size": 0}
        log = tmp_path / "node.log"
        with node_process(dom, log, REPO / "config" / "oxygen.yaml", params) as node:
            end = time.monotonic() + 60
            while "configure failed" not in log.read_text() and time.monotonic() < end:
                time.sleep(0.1)
            assert "engine.block_size" in log.read_text(), log.read_text()
            play = _record(dom, tmp_path / "rec", "--record-topics", "/action_chunk", "/conversation/text")
            assert node.poll() is None, log.read_text()
    assert play.returncode == 4, play.stdout + play.stderr
    assert "/action_chunk: no message (never in the graph)" in play.stderr, play.stderr


def test_nothing_to_play_exits_2_with_one_line_saying_why(tmp_path, capsys):
    """A bag without messages, none on the --topics, or none after --start-offset: exit status 2 and
    one line on stderr (before: 'played 0 messages' and exit status 0)."""
    empty = edit_bag(SAMPLE_BAG, tmp_path / "empty", lambda t, s, r: [])
    states = edit_bag(SAMPLE_BAG, tmp_path / "states", lambda t, s, r: [(t, s, r)] if t == "/joint_states" else [])
    cases = [
        ([str(empty)], f"bag_player: error: nothing to play: {empty} has no message at all (its topics /ask, "),
        (
            [str(states), "--topics", "/instruction", "/ask"],
            f"bag_player: error: nothing to play: {states} has no message on ['/ask', '/instruction']; "
            "messages are on /joint_states (500)",
        ),
        (
            [str(states), "--topics", "/joint_states", "--start-offset", "12"],
            "bag_player: error: nothing played: no message of ['/joint_states'] between --start-offset 12 s "
            "and the end (the bag spans 9.980 s)",
        ),
        ([str(states), "--topics", "/joint_states", "--rate", "50", "--duration", "0.5"], None),
    ]
    with domain_id() as dom:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "oxygen_ros.bags.player", *argv],
                cwd=REPO,
                env=ros_env(dom),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for argv, _ in cases
        ]
        done = [(p, *p.communicate(timeout=120)) for p in procs]
    for (argv, line), (proc, out, err) in zip(cases, done):
        if line is None:  # the same bag does play: 25 joint states
            assert proc.returncode == 0 and "  /joint_states: 25" in out, (argv, out, err)
            continue
        assert proc.returncode == 2, (argv, proc.returncode, out, err)
        assert len(err.splitlines()) == 1 and err.startswith(line), (argv, err)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "or nothing to play" in " ".join(capsys.readouterr().out.split())
