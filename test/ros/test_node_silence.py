"""Silent states speak (issue 23), over DDS with the node in its own process (3 raw cameras, 14
joints, pi05-tiny):

- activation logs ``active, ready`` with the cameras and the ask topic;
- an ask before any camera image gets the waiting notice on the text topic at once, then its
  normal answer once the inputs come;
- every input that sends nothing after activation is named once on the console; after a
  re-activation again, once, for the camera that is still silent;
- the joint states stopping alone turn /diagnostics WARN (``stale: joint_states …``), every input
  stopping turns it STALE; back to OK when they resume; one console line per input each way.

Every wait is for a condition (a diagnostic, a log line, a message) with a generous bound.
"""

from __future__ import annotations

import time

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from ros_helpers import ALOHA_COMPRESSED, ALOHA_JOINTS, REPO, RosPeer, SensorFeed, node_process
from std_msgs.msg import String

from oxygen_ros.ros.qos import reliable_qos

pytestmark = [pytest.mark.ros, pytest.mark.slow]
RAW = {s: t.replace("/compressed", "") for s, t in ALOHA_COMPRESSED.items()}
PARAMS = {
    "model": "pi05-tiny",
    "num_threads": 1,
    "diagnostics_period_s": 0.25,
    "input_timeout_s": 1.0,
    "tasks.memory.every_n_frames": 0,
    "tasks.conversation.max_new_tokens": 6,
    **{f"cameras.{s}.type": "raw" for s in RAW},
    **{f"cameras.{s}.topic": t for s, t in RAW.items()},
}
INPUTS = {f"camera {s}": f"/{t}" for s, t in RAW.items()} | {"joint_states": "/joint_states"}
OK, WARN, STALE = 0, 1, 3


class Watch:
    """The node's log and /diagnostics as seen by the peer."""

    def __init__(self, peer: RosPeer, log):
        self.peer, self.log = peer, log

    def count(self, text: str) -> int:
        return self.log.read_text(errors="replace").count(text)

    def wait_log(self, text: str, n: int = 1, timeout: float = 30.0) -> None:
        assert self.peer.wait_for(lambda: self.count(text) >= n, timeout), (
            f"{n} x {text!r} not in the node log:\n{self.log.read_text()[-4000:]}"
        )

    def statuses(self, since: float = 0.0) -> list[tuple[float, int, str, dict[str, str]]]:
        with self.peer._lock:
            got = [(t, m) for t, m in self.peer.received.get("/diagnostics", []) if t >= since]
        return [
            (t, s.level[0], s.message, {kv.key: kv.value for kv in s.values})
            for t, m in got
            for s in m.status
            if s.name.endswith(": inference")
        ]

    def status(self, since: float, pred, timeout: float = 30.0, what: str = ""):
        """The first status after ``since`` for which ``pred(level, message, values)`` holds."""

        def find():
            return next((s for s in self.statuses(since) if pred(*s[1:])), None)

        found = self.peer.wait_for(find, timeout)
        assert found, f"no status {what} in {timeout} s; last: {[s[1:3] for s in self.statuses()[-3:]]}"
        return found

    def later_statuses(self, n: int, timeout: float = 30.0) -> None:
        """Wait for ``n`` more statuses (the node's checks ran meanwhile: same executor, ≥ n periods)."""
        k = len(self.statuses())
        assert self.peer.wait_for(lambda: len(self.statuses()) >= k + n, timeout)


def _transition(peer: RosPeer, client, tid: int) -> None:
    future = client.call_async(ChangeState.Request(transition=Transition(id=tid)))
    assert peer.wait_for(future.done, 60), f"transition {tid} timed out"
    assert future.result().success, tid


def test_silent_inputs_and_an_early_ask_are_reported_once_each(tmp_path):
    with domain_id() as dom:
        peer = RosPeer(dom, "silence")
        feed = None
        try:
            peer.collect(DiagnosticArray, "/diagnostics")
            peer.collect(String, "conversation/text")
            ask = peer.node.create_publisher(String, "ask", reliable_qos())
            lifecycle = peer.node.create_client(ChangeState, "/oxygen/change_state")
            log = tmp_path / "node.log"
            w = Watch(peer, log)
            with node_process(dom, log, REPO / "config" / "oxygen.yaml", PARAMS) as node:
                # 1. active, ready: one line with the cameras and the ask topic
                peer.wait_outputs_matched(["conversation/text"], 120)
                w.wait_log("active, ready: ")
                assert (
                    w.count(
                        "active, ready: cameras base_0_rgb /cam_high/image_raw, left_wrist_0_rgb "
                        "/cam_left_wrist/image_raw, right_wrist_0_rgb /cam_right_wrist/image_raw; joint "
                        "states /joint_states; asks /ask (conversation)"
                    )
                    == 1
                ), log.read_text()

                # 2. an ask before any camera image: the waiting notice at once, with its id
                peer.publish_matched(ask, String(data="what do you see?"))
                first = peer.wait_for(lambda: peer.messages("conversation/text"), 30)
                assert first, log.read_text()
                notice = first[0].data
                rid = int(notice[len("[request ") : notice.index(" waiting:")])
                assert notice == (
                    f"[request {rid} waiting: no camera input yet; it waits up to 30.0 s "
                    "(engine.max_queue_wait_s) for an observation]"
                )

                # 3. nothing sent 2 s (2 x input_timeout_s) after activation: one line per input
                for name, topic in INPUTS.items():
                    w.wait_log(f"{name} on {topic} has sent nothing since activation (")
                w.later_statuses(8)
                for name, topic in INPUTS.items():
                    assert w.count(f"{name} on {topic} has sent nothing since activation (") == 1
                text = log.read_text()
                line = text[text.index("camera right_wrist_0_rgb on /cam_right_wrist/image_raw has sent") :]
                line = line[: line.index("\n")]
                assert line.endswith("s); its slot is masked"), line
                waited = float(line[line.index("activation (") + len("activation (") : line.index(" s)")])
                assert 2.0 <= waited < 10.0, line  # the grace period: 2 x input_timeout_s

                # ... the inputs come (one camera still silent): the ask is answered as usual
                feed = SensorFeed(peer, RAW, ALOHA_JOINTS, 30.0)
                feed.cameras_on["right_wrist_0_rgb"] = False
                feed.start()
                answer = f"[#{rid} Q: what do you see?] "
                got = peer.wait_for(
                    lambda: [m.data for m in peer.messages("conversation/text") if m.data.startswith(answer)], 60
                )
                assert got, [m.data for m in peer.messages("conversation/text")]
                assert [m.data for m in peer.messages("conversation/text")] == [notice, got[0]]

                # 4. a new activation: once more, only for the camera still silent
                assert lifecycle.wait_for_service(timeout_sec=20)
                _transition(peer, lifecycle, Transition.TRANSITION_DEACTIVATE)
                _transition(peer, lifecycle, Transition.TRANSITION_ACTIVATE)
                w.wait_log("active, ready: ", 2)
                w.wait_log(
                    "camera right_wrist_0_rgb on /cam_right_wrist/image_raw has sent nothing since activation (", 2
                )
                for name in ("camera base_0_rgb", "camera left_wrist_0_rgb", "joint_states"):
                    assert w.count(f"{name} on {INPUTS[name]} has sent nothing since activation (") == 1
                feed.cameras_on["right_wrist_0_rgb"] = True
                t0 = time.monotonic()
                w.status(t0, lambda lv, msg, v: lv == OK and msg.startswith("running"), what="OK")

                # 5. the joint states stop: WARN naming them, one console line; back to OK, one line
                feed.state_hook = lambda js: None
                t0 = time.monotonic()
                _, _, msg, values = w.status(
                    t0, lambda lv, msg, v: lv == WARN and "stale: joint_states" in msg, what="WARN stale joint_states"
                )
                assert "camera" not in msg.split(";")[0], msg  # only the joint states are stale
                assert float(values["since_last_message_s joint_states"]) >= 1.0, values  # stale: > 1 s, rounded
                assert float(values["since_last_message_s camera base_0_rgb"]) < 1.0, values
                stale_line = "input stale: joint_states on /joint_states has sent nothing for "
                w.wait_log(stale_line)
                w.status(
                    t0,
                    lambda lv, msg, v: float(v.get("since_last_message_s joint_states", 0)) > 3.0,
                    what="joint states silent 3 s",
                )
                assert w.count(stale_line) == 1  # once, not every check
                feed.state_hook = None
                t0 = time.monotonic()
                w.status(t0, lambda lv, msg, v: lv == OK and msg.startswith("running"), what="OK again")
                w.wait_log("input resumed: joint_states on /joint_states (silent for about ")
                w.later_statuses(8)
                assert w.count(stale_line) == 1
                assert w.count("input resumed: joint_states on /joint_states") == 1

                # 6. every input stops: STALE, naming each; one line per input each way
                feed.state_hook = lambda js: None
                feed.cameras_on.update({s: False for s in RAW})
                t0 = time.monotonic()
                _, _, msg, values = w.status(t0, lambda lv, msg, v: lv == STALE, what="STALE")
                assert msg.startswith("stale: ") and "every input has stopped" in msg, msg
                for name in INPUTS:
                    assert f"{name} " in msg.split(";")[0], msg
                    assert float(values[f"since_last_message_s {name}"]) >= 1.0, values  # rounded
                for name, topic in INPUTS.items():
                    w.wait_log(
                        f"input stale: {name} on {topic} has sent nothing for ", 2 if name == "joint_states" else 1
                    )
                # ... an ask now is told at once that it waits, and why
                since = time.monotonic()
                peer.publish_matched(ask, String(data="anyone there?"))
                late = peer.wait_for(lambda: [m.data for m in peer.messages("conversation/text", since)], 30)
                assert late and " waiting: no camera image for " in late[0] and "(the inputs stopped)" in late[0], late
                feed.state_hook = None
                feed.cameras_on.update({s: True for s in RAW})
                t0 = time.monotonic()
                w.status(t0, lambda lv, msg, v: lv == OK and msg.startswith("running"), what="OK after STALE")
                for name, topic in INPUTS.items():
                    w.wait_log(
                        f"input resumed: {name} on {topic} (silent for about ", 2 if name == "joint_states" else 1
                    )
                w.later_statuses(8)
                for name, topic in INPUTS.items():
                    n = 2 if name == "joint_states" else 1
                    assert w.count(f"input stale: {name} on {topic} ") == n, log.read_text()[-4000:]
                    assert w.count(f"input resumed: {name} on {topic} ") == n, log.read_text()[-4000:]
                assert node.poll() is None, log.read_text()
            assert node.returncode == 0, log.read_text()
        finally:
            if feed is not None:
                feed.stop()
            peer.close()
