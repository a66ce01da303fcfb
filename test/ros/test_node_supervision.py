"""The inference thread never dies quietly — through the real pieces: the node in its own process
(``fault_node``: the shipped node, plus faults armed on command over DDS), rclpy's own logger, and
/diagnostics, asks and chunks over DDS.

1. A contained engine fault (the denoise stage raises once) is logged by rclpy's logger as a
   dropped frame (WARN) and a fault (ERROR) — two severities through the node's one ``report`` —
   and the node goes on: chunks keep coming, an ask is answered, /diagnostics says ERROR with the
   fault while it is recent. (Before: rclpy raised "Logger severity cannot be changed between
   calls" on the ERROR, the inference thread died, and /diagnostics went back to OK.)
2. A frame that hangs (a stalled denoise) turns /diagnostics to ERROR "no action chunk for …"
   while observations keep arriving — health comes from chunks actually published — and back once
   chunks flow again.
3. A fault outside the engine's containment (the node's frame handling raises) restarts the frame loop under
   its supervisor: the ask in flight ends with a notice saying why, /diagnostics says ERROR
   ``inference_restarted``, and chunks resume.
4. An ask sent while the node is inactive is answered at once with a notice (before: nothing).
"""

from __future__ import annotations

import time

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from ros_helpers import ALOHA_COMPRESSED, ALOHA_JOINTS, REPO, RosPeer, SensorFeed, node_process
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.ros.qos import reliable_qos

pytestmark = [pytest.mark.ros, pytest.mark.slow]
RAW = {s: t.replace("/compressed", "") for s, t in ALOHA_COMPRESSED.items()}
PARAMS = {
    "model": "pi05-tiny",
    "num_threads": 1,
    "diagnostics_period_s": 0.25,
    "tasks.memory.every_n_frames": 0,
    "tasks.conversation.max_new_tokens": 24,
    "tasks.conversation.temperature": 1.0,
    "engine.tokens_per_frame": 1,
    **{f"cameras.{s}.type": "raw" for s in RAW},
    **{f"cameras.{s}.topic": t for s, t in RAW.items()},
}


def statuses(peer: RosPeer, since: float) -> list[tuple[float, int, str]]:
    """(receive time, level, message) of the node's inference status received after ``since``."""
    with peer._lock:
        got = [(t, m) for t, m in peer.received.get("/diagnostics", []) if t >= since]
    return [(t, s.level[0], s.message) for t, m in got for s in m.status if s.name.endswith(": inference")]


def wait_status(peer: RosPeer, since: float, pred, timeout: float, what: str) -> tuple[float, int, str]:
    found = peer.wait_for(lambda: next((s for s in statuses(peer, since) if pred(s)), None), timeout)
    assert found, f"no /diagnostics status {what} within {timeout} s; last: {statuses(peer, since)[-3:]}"
    return found


def chunks_after(peer: RosPeer, t: float) -> int:
    return len(peer.times("action_chunk", t))


def test_faults_never_kill_the_inference_thread_and_health_follows_the_chunks(tmp_path):
    with domain_id() as dom:
        peer = RosPeer(dom, "supervision")
        try:
            peer.collect(JointTrajectory, "action_chunk")
            peer.collect(DiagnosticArray, "/diagnostics")
            peer.collect(
                String,
                "conversation/text",
                QoSProfile(history=HistoryPolicy.KEEP_ALL, depth=0, reliability=ReliabilityPolicy.RELIABLE),
            )
            fault = peer.node.create_publisher(String, "/test_fault", reliable_qos())
            ask = peer.node.create_publisher(String, "ask", reliable_qos())
            feed = SensorFeed(peer, RAW, ALOHA_JOINTS, 30.0)
            log = tmp_path / "node.log"
            with node_process(dom, log, REPO / "config" / "oxygen.yaml", PARAMS, module="fault_node"):
                feed.start()
                peer.wait_outputs_matched(["action_chunk", "conversation/text"], 90)
                assert peer.wait_for(lambda: chunks_after(peer, 0) >= 5, 60), log.read_text()
                assert peer.wait_for(lambda: fault.get_subscription_count() > 0, 30)

                # 1. a contained engine fault: WARN + ERROR through rclpy's logger, the node goes on
                t1 = time.monotonic()
                fault.publish(String(data="denoise"))
                wait_status(peer, t1, lambda s: s[1] == 2 and "fault_denoise" in s[2], 20, "ERROR naming the fault")
                t_fault = time.monotonic()
                assert peer.wait_for(lambda: chunks_after(peer, t_fault) >= 5, 20), (
                    f"no chunks after a contained fault:\n{log.read_text()[-3000:]}"
                )
                text = log.read_text()
                assert "[WARN]" in text and "frame_dropped: action chunk dropped: failed in denoise" in text, text[
                    -3000:
                ]
                assert "[ERROR]" in text and "fault_denoise: RuntimeError: injected fault in denoise" in text, text[
                    -3000:
                ]
                assert "Logger severity cannot be changed" not in text
                peer.publish_matched(ask, String(data="what do you see?"))
                answered = peer.wait_for(
                    lambda: [
                        m.data for m in peer.messages("conversation/text", t1) if "Q: what do you see?]" in m.data
                    ],
                    60,
                )
                assert answered and "[request" not in answered[0], answered

                # 2. a stalled frame: ERROR from the missing chunks, OK again once they flow
                t2 = time.monotonic()
                fault.publish(String(data="hang 6"))
                stalled = wait_status(
                    peer,
                    t2,
                    lambda s: s[1] == 2 and "no action chunk for" in s[2],
                    15,
                    "ERROR while no chunk is published",
                )
                assert "one inference frame has run for" in stalled[2], stalled
                wait_status(peer, stalled[0], lambda s: s[1] == 0, 30, "OK once chunks flow again")
                assert peer.wait_for(lambda: chunks_after(peer, stalled[0]) >= 3, 10)

                # 3. a fault outside the engine: the supervisor restarts the loop, the ask in flight ends
                t3 = time.monotonic()
                fault.publish(String(data="frame_stats"))
                time.sleep(0.5)  # armed before the ask is taken
                ask.publish(String(data="and now?"))
                ended = peer.wait_for(
                    lambda: [m.data for m in peer.messages("conversation/text", t3) if "Q: and now?]" in m.data], 30
                )
                assert (
                    ended
                    and "[request" in ended[0]
                    and "inference restarted after an error: RuntimeError: injected fault in frame_stats" in ended[0]
                ), f"{ended}\n{log.read_text()[-4000:]}"
                wait_status(
                    peer, t3, lambda s: s[1] == 2 and "inference_restarted" in s[2], 10, "ERROR naming the restart"
                )
                t_restart = time.monotonic()
                assert peer.wait_for(lambda: chunks_after(peer, t_restart) >= 5, 30), log.read_text()[-3000:]
                assert "inference loop failed" in log.read_text()

                # 4. an ask while the node is inactive is answered with a notice, not silence
                change = peer.node.create_client(ChangeState, "/oxygen/change_state")
                assert change.wait_for_service(timeout_sec=30)
                future = change.call_async(
                    ChangeState.Request(transition=Transition(id=Transition.TRANSITION_DEACTIVATE))
                )
                assert peer.wait_for(future.done, 30) and future.result().success
                t4 = time.monotonic()
                ask.publish(String(data="are you there?"))
                ignored = peer.wait_for(lambda: [m.data for m in peer.messages("conversation/text", t4)], 10)
                assert ignored == [
                    "[ask ignored: the node is inactive; asks are answered only while it is active] Q: are you there?"
                ], ignored
                feed.stop()
        finally:
            peer.close()
