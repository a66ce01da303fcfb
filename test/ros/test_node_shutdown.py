"""A signal ends the node cleanly and answers everyone — a real node process, a real signal, the
utterance read over DDS.

An answer is streaming (a long greedy budget at one token per frame) when the process gets SIGINT
(Ctrl-C, ``ros2 launch``'s first signal) or SIGTERM (its escalation, systemd, docker stop): the
utterance in flight ends with ``[request N cancelled: node shutting down]`` on the task's text topic
before the node's context goes away, and the process exits with status 0 within a few seconds —
also when the signal arrives in the middle of a long frame (a stalled denoise, ``fault_node``'s
``hang``), which is left to end with the process. (Before: the utterance just stopped.) The node is gone
from the ROS graph when the process is: no ghost of it lingers for the DDS lease.
"""

from __future__ import annotations

import signal
import time

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from ros_helpers import ALOHA_COMPRESSED, ALOHA_JOINTS, REPO, RosPeer, SensorFeed, node_process
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.ros.qos import reliable_qos
from oxygen_ros.streams.text import is_waiting_notice

pytestmark = [pytest.mark.ros, pytest.mark.slow]
RAW = {s: t.replace("/compressed", "") for s, t in ALOHA_COMPRESSED.items()}
PARAMS = {
    "model": "pi05-tiny",
    "num_threads": 1,
    "diagnostics_period_s": 0.25,
    "tasks.memory.every_n_frames": 0,
    "tasks.conversation.max_new_tokens": 400,
    "engine.tokens_per_frame": 1,
    **{f"cameras.{s}.type": "raw" for s in RAW},
    **{f"cameras.{s}.topic": t for s, t in RAW.items()},
}
KEEP_ALL = QoSProfile(history=HistoryPolicy.KEEP_ALL, depth=0, reliability=ReliabilityPolicy.RELIABLE)


@pytest.mark.parametrize(
    "sig, hang", [(signal.SIGINT, 0.0), (signal.SIGTERM, 8.0)], ids=["SIGINT", "SIGTERM-mid-frame"]
)
def test_a_signal_ends_every_answer_in_flight_then_the_process(tmp_path, sig, hang):
    with domain_id() as dom:
        peer = RosPeer(dom, "shutdown")
        try:
            peer.collect(DiagnosticArray, "/diagnostics")
            peer.collect(JointTrajectory, "action_chunk")
            peer.collect(String, "conversation/text", KEEP_ALL)
            peer.collect(String, "conversation/delta", KEEP_ALL)
            ask = peer.node.create_publisher(String, "ask", reliable_qos())
            fault = peer.node.create_publisher(String, "/test_fault", reliable_qos())
            feed = SensorFeed(peer, RAW, ALOHA_JOINTS, 30.0)
            log = tmp_path / "node.log"

            def answers() -> list[str]:  # the ends of the ask's utterance (a waiting notice is none)
                return [
                    m.data
                    for m in peer.messages("conversation/text")
                    if "Q: tell me a long story]" in m.data and not is_waiting_notice(m.data)
                ]

            with node_process(dom, log, REPO / "config" / "oxygen.yaml", PARAMS, module="fault_node") as proc:
                feed.start()
                peer.wait_outputs_matched(["action_chunk", "conversation/text", "conversation/delta"], 90)
                # observations flow (else the ask gets a waiting notice first, which is not an end)
                assert peer.wait_for(lambda: peer.messages("action_chunk"), 60), log.read_text()[-3000:]
                peer.publish_matched(ask, String(data="tell me a long story"))
                streaming = peer.wait_for(lambda: len(peer.messages("conversation/delta")) >= 4, 60)
                assert streaming, log.read_text()[-3000:]
                assert not answers(), f"the answer ended before the signal: {answers()}"
                if hang:
                    peer.publish_matched(fault, String(data=f"hang {hang}"))
                    time.sleep(1.0)  # the next frame is now stuck in its denoise
                t0 = time.monotonic()
                proc.send_signal(sig)
                code = proc.wait(15)
                took = time.monotonic() - t0
                ended = peer.wait_for(answers, 5)
                assert code == 0, log.read_text()[-3000:]
                assert took < 4.0, f"exit took {took:.1f} s"
                assert ended and ended[0].rstrip().endswith("cancelled: node shutting down]"), ended
                # the node leaves the graph with its process: a participant the process never deleted
                # stays in every peer's graph, a ghost /oxygen, until its DDS lease ends (~20 s)
                assert peer.wait_for(lambda: "oxygen" not in peer.node.get_node_names(), 5), (
                    f"a ghost of the node is still in the graph: {peer.node.get_node_names_and_namespaces()}"
                )
                feed.stop()
        finally:
            peer.close()
