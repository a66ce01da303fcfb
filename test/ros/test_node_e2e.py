"""End to end over Fast DDS: publisher process -> oxygen node process -> listener (this process).

The node runs the shipped ALOHA-like config (3 compressed cameras, 14 joints) with the pi05-tiny
random-weight preset; a separate publisher process sends cameras + joint states at 30 Hz and the
instruction. This process listens for action chunks, text and /diagnostics and, once the node's
publishers have matched its subscriptions (read from the node's /diagnostics, writer side) and its
ask publisher has matched the node, sends three asks within one second. No step depends on a
wall-clock guess about discovery: every wait is for a condition, with a generous bound.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from ros_helpers import ALOHA_JOINTS, REPO, RosPeer, node_process, ros_env, stop_process
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.core.config import get_preset
from oxygen_ros.ros.qos import reliable_qos
from oxygen_ros.streams.text import is_waiting_notice

pytestmark = pytest.mark.ros
H = get_preset("pi05-tiny").action_horizon
PERIOD = 0.02  # control_period_s of config/oxygen.yaml


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["serial", "concurrent"])
def test_chunks_and_streamed_text_end_to_end(tmp_path, schedule):
    questions = ["What do you see?", "Where is the cube?", "Is the gripper open?"]
    outputs = [
        "action_chunk",
        "conversation/delta",
        "conversation/text",
        "memory/delta",
        "memory/text",
        "forward_position_controller/commands",
    ]
    with domain_id() as dom:
        peer = RosPeer(dom, "listener")
        try:
            for topic, kind in zip(outputs, (JointTrajectory, String, String, String, String, Float64MultiArray)):
                peer.collect(kind, topic)
            peer.collect(DiagnosticArray, "/diagnostics")
            ask = peer.node.create_publisher(String, "ask", reliable_qos())
            params = {
                "model": "pi05-tiny",
                "tasks.conversation.temperature": 1.0,
                "tasks.conversation.max_new_tokens": 24,
                "tasks.memory.every_n_frames": 10,
                "tasks.memory.max_new_tokens": 8,
                "num_threads": 1,
                "action_rate_hz": 50.0,
                "command_type": "float64_multi_array",
                "diagnostics_period_s": 0.25,
                "command_topic": "forward_position_controller/commands",
                "engine.schedule": schedule,
            }
            stamps_file = tmp_path / "stamps.txt"
            with node_process(dom, tmp_path / "node.log", REPO / "config" / "oxygen.yaml", params) as node:
                pub = subprocess.Popen(
                    [
                        sys.executable,
                        str(REPO / "test" / "ros_helpers.py"),
                        "publish",
                        "--domain",
                        str(dom),
                        "--rate",
                        "30",
                        "--duration",
                        "600",
                        "--compressed",
                        "--stamps-out",
                        str(stamps_file),
                    ],
                    env=ros_env(dom),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                )
                try:
                    peer.wait_outputs_matched(outputs, 90)
                    t_ask = time.monotonic()
                    for i, q in enumerate(questions):  # three asks within one second
                        if i:
                            time.sleep(0.2)
                        peer.publish_matched(ask, String(data=q))
                    assert time.monotonic() - t_ask < 1.0

                    def texts() -> list[str]:  # asked ahead of the first observation
                        return [m.data for m in peer.messages("conversation/text") if not is_waiting_notice(m.data)]

                    def deltas() -> str:
                        return "".join(m.data for m in peer.messages("conversation/delta"))

                    got_text = peer.wait_for(lambda: len(texts()) >= 3 and deltas() == "".join(texts()), 90)
                    peer.wait_for(lambda: len(peer.messages("memory/text")) >= 3, 30)
                    peer.wait_for(lambda: len(peer.messages("action_chunk")) >= 20, 30)
                    peer.wait_for(lambda: len(peer.messages("forward_position_controller/commands")) > 60, 30)
                    done = peer.wait_for(
                        lambda: [d for d in peer.diagnostics() if d.get("requests_conversation_finished") == "3"], 30
                    )
                finally:
                    assert stop_process(pub) == 0
                assert node.poll() is None, "node died"
            assert node.returncode == 0, (tmp_path / "node.log").read_text()
        finally:
            peer.close()
    log = (tmp_path / "node.log").read_text()
    assert got_text, f"three asks, {len(texts())} answers: {texts()}; node log:\n{log}"
    chunks = peer.messages("action_chunk")
    assert len(chunks) >= 20, log
    sent = {round(float(s), 6) for s in stamps_file.read_text().split()}
    for msg in chunks:
        assert list(msg.joint_names) == list(ALOHA_JOINTS)
        assert len(msg.points) == H
        for i, p in enumerate(msg.points):
            assert len(p.positions) == len(ALOHA_JOINTS)
            t = p.time_from_start.sec + p.time_from_start.nanosec * 1e-9
            assert t == pytest.approx((i + 1) * PERIOD, abs=1e-9)
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        assert round(stamp, 6) in sent, "chunk stamp is not an observation stamp"
    stamps = [m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for m in chunks]
    assert stamps == sorted(stamps)
    # the per-step command stream (ros2_control forward controller) sends points of the chunks
    commands = peer.messages("forward_position_controller/commands")
    assert len(commands) > 50
    points = {tuple(p.positions) for m in chunks for p in m.points}
    assert all(len(c.data) == len(ALOHA_JOINTS) for c in commands)
    matched = sum(tuple(c.data) in points for c in commands)
    assert matched >= 0.9 * len(commands)  # the rest: chunks the listener missed at shutdown
    # three asks -> three utterances, in the order asked, each naming its question; the deltas
    # concatenate to the finished texts
    answers = texts()
    assert len(answers) == 3, answers
    ids = []
    for text, q in zip(answers, questions):
        head = text[: text.index("] ") + 2]
        assert head.startswith("[#") and head.endswith(f" Q: {q}] "), text
        ids.append(int(head[2 : head.index(" ")]))
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert deltas() == "".join(answers)
    # memory: every utterance but the first (it may have begun before the listener matched) and
    # the newest (its last deltas may still be on the way: two topics) is in the delta stream
    mem_texts = [m.data for m in peer.messages("memory/text")]
    mem_deltas = "".join(m.data for m in peer.messages("memory/delta"))
    assert len(mem_texts) >= 3 and all(t.startswith("[#") for t in mem_texts)
    assert all(t in mem_deltas for t in mem_texts[1:-1])
    diags = peer.diagnostics()
    active = [d for d in diags if d.get("state") == "active" and float(d.get("chunk_hz", 0)) > 0]
    assert active, diags[-3:]
    last = active[-1]
    for key in (
        "frame_hz",
        "chunk_hz",
        "action_hz",
        "tok_per_s",
        "frame_time_p50_ms",
        "frame_time_p99_ms",
        "decode_batch_max",
        "kv_blocks_in_use",
        "kv_blocks_total",
        "deadline_misses",
        "dropped_out_of_order",
        "model",
        "device",
    ):
        assert key in last, key
    assert last["model"] == "pi05-tiny" and last["device"] == "cpu" and last["engine_schedule"] == schedule
    for key in ("chunk_latency_language_ms", "chunk_latency_no_language_ms", "batcher_busy", "tokens_per_frame"):
        assert key in last, key  # the schedule metrics of issue 13
    assert float(last["tok_per_s"]) > 0
    # the request accounting on /diagnostics: three asks submitted, three finished, none lost
    assert done, [{k: v for k, v in d.items() if k.startswith("requests_")} for d in diags[-2:]]
    row = {
        k[len("requests_conversation_") :]: int(v)
        for k, v in done[-1].items()
        if k.startswith("requests_conversation_")
    }
    assert row == {
        "submitted": 3,
        "finished": 3,
        "rejected": 0,
        "expired": 0,
        "failed": 0,
        "cancelled": 0,
        "in_flight": 0,
    }, row
    mem = {k: int(v) for k, v in done[-1].items() if k.startswith("requests_memory_")}
    assert mem["requests_memory_submitted"] == sum(
        mem[f"requests_memory_{o}"] for o in ("finished", "rejected", "expired", "failed", "cancelled", "in_flight")
    )
