"""Bad input over DDS: the node stays up, /diagnostics says what happened, nothing non-finite is
published, and the action stream keeps its rate while the input is still usable.

One node process (ALOHA-like: 3 raw cameras, 14 joints, per-step commands at 50 Hz); this process
feeds cameras + joint states at 30 Hz and injects, phase by phase: NaN joint states, a missing
joint name, truncated images, a stale camera, no camera at all, out-of-order and backwards
stamps, an over-long instruction, and 100 asks in one second.
"""

from __future__ import annotations

import math
import time

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from ros_helpers import ALOHA_COMPRESSED, ALOHA_JOINTS, REPO, RosPeer, SensorFeed, node_process
from sensor_msgs.msg import JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.ros.convert import sec_to_stamp, stamp_to_sec
from oxygen_ros.ros.qos import reliable_qos

pytestmark = [pytest.mark.ros, pytest.mark.slow]
RAW = {s: t.replace("/compressed", "") for s, t in ALOHA_COMPRESSED.items()}
CMD_HZ = 50.0
# adaptive decode budget: language steps fit in what is left of a 30 Hz camera frame
# asks: the 'text' QoS (reliable, keep last 100) so a burst of 100 asks is queued, not overwritten
PARAMS = {
    "model": "pi05-tiny",
    "num_threads": 1,
    "action_rate_hz": CMD_HZ,
    "ask_qos": "text",
    "diagnostics_period_s": 0.25,
    "tasks.memory.every_n_frames": 0,
    "engine.decode_budget": "adaptive",
    "engine.frame_deadline_s": 0.03,
    **{f"cameras.{s}.type": "raw" for s in RAW},
    **{f"cameras.{s}.topic": t for s, t in RAW.items()},
}


class Probe:
    def __init__(self, peer: RosPeer):
        self.peer = peer
        peer.collect(JointTrajectory, "action_chunk")
        peer.collect(JointState, "joint_command")
        peer.collect(DiagnosticArray, "/diagnostics")
        self.feed = SensorFeed(peer, RAW, ALOHA_JOINTS, 30.0)
        self.ask = peer.node.create_publisher(String, "ask", reliable_qos(200))
        self.instruction = peer.node.create_publisher(String, "instruction", reliable_qos())

    def rate(self, topic: str, t0: float, t1: float) -> float:
        return sum(1 for t in self.peer.times(topic, t0) if t <= t1) / (t1 - t0)

    def phase(self, seconds: float = 2.5, settle: float = 0.7) -> tuple[float, float, float]:
        """Let a phase run; (start, end of settling, end) monotonic times."""
        t0 = time.monotonic()
        time.sleep(seconds)
        return t0, t0 + settle, time.monotonic()

    def diag(self, since: float, text: str, timeout: float = 10.0) -> dict[str, str | float]:
        """Values of the first diagnostic after ``since`` whose message contains ``text``, plus
        ``_msg`` and ``_t`` (its monotonic receive time)."""

        def find():
            with self.peer._lock:
                received = [(t, m) for t, m in self.peer.received.get("/diagnostics", []) if t >= since]
            for t, m in received:
                for s in m.status:
                    if text in s.message:
                        return {kv.key: kv.value for kv in s.values} | {"_msg": s.message, "_t": t}
            return None

        found = self.peer.wait_for(find, timeout)
        last = self.peer.messages("/diagnostics")[-1:]
        assert found, f"no diagnostic with {text!r}; last: {[s.message for m in last for s in m.status]}"
        return found


def every_other(fn):
    state = {"n": 0}

    def hook(msg):
        state["n"] += 1
        return fn(msg) if state["n"] % 2 else msg

    return hook


def nan_joint(js: JointState) -> JointState:
    js.position = [float("nan")] + list(js.position[1:])
    return js


def drop_first_joint(js: JointState) -> JointState:
    js.name, js.position = list(js.name[1:]), list(js.position[1:])
    return js


def test_bad_inputs_keep_the_node_up_and_the_actions_flowing(tmp_path):
    with domain_id() as dom:
        peer = RosPeer(dom, "robustness")
        try:
            p = Probe(peer)
            log = tmp_path / "node.log"
            with node_process(dom, log, REPO / "config" / "oxygen.yaml", PARAMS) as node:
                p.feed.start()
                assert peer.wait_for(lambda: len(peer.messages("action_chunk")) >= 5, 90), log.read_text()
                results = {}
                _, a, b = p.phase(3.0)
                base_chunks, base_cmds = p.rate("action_chunk", a, b), p.rate("joint_command", a, b)
                assert base_chunks > 5 and base_cmds > 0.7 * CMD_HZ, (base_chunks, base_cmds)

                def usable(name, setup, text, undo):
                    setup()
                    t0, a, b = p.phase()
                    results[name] = (p.rate("action_chunk", a, b), p.rate("joint_command", a, b))
                    p.diag(t0, text)
                    undo()

                usable(
                    "nan",
                    lambda: setattr(p.feed, "state_hook", every_other(nan_joint)),
                    "non-finite positions for joints: left_waist",
                    lambda: setattr(p.feed, "state_hook", None),
                )
                usable(
                    "missing joint",
                    lambda: setattr(p.feed, "state_hook", every_other(drop_first_joint)),
                    "lacks configured joints: left_waist",
                    lambda: setattr(p.feed, "state_hook", None),
                )

                def truncate(slot, msg):
                    if slot == "right_wrist_0_rgb":
                        msg.data = bytes(msg.data[: len(msg.data) // 3])
                    return msg

                usable(
                    "wrong image size",
                    lambda: setattr(p.feed, "image_hook", truncate),
                    "image data too short",
                    lambda: setattr(p.feed, "image_hook", None),
                )
                usable(
                    "stale camera",
                    lambda: p.feed.cameras_on.update(left_wrist_0_rgb=False),
                    "left_wrist_0_rgb (cam_left_wrist/image_raw): stale",
                    lambda: p.feed.cameras_on.update(left_wrist_0_rgb=True),
                )

                pubs = p.feed.cam_pubs

                def older_copy(slot, msg):  # a late duplicate 0.2 s behind the stream
                    if slot == "base_0_rgb":
                        old = type(msg)(
                            height=msg.height, width=msg.width, encoding=msg.encoding, step=msg.step, data=msg.data
                        )
                        old.header.stamp = sec_to_stamp(stamp_to_sec(msg.header.stamp) - 0.2)
                        pubs[slot].publish(msg)
                        return old
                    return msg

                usable(
                    "out of order",
                    lambda: setattr(p.feed, "image_hook", older_copy),
                    "out_of_order",
                    lambda: setattr(p.feed, "image_hook", None),
                )

                # no camera at all: no frames, a "waiting for" diagnostic, commands stop. The
                # window starts when the node says it is waiting (a frame in flight may still end)
                p.feed.cameras_on.update({s: False for s in RAW})
                t0 = time.monotonic()
                t_wait = p.diag(t0, "waiting for camera images")["_t"]
                p.diag(t0, "command_expired")
                time.sleep(max(0.0, t_wait + 1.8 - time.monotonic()))
                late = [t for t in peer.times("action_chunk", t_wait + 0.3) if t <= t_wait + 1.8]
                assert len(late) <= 1, late
                p.feed.cameras_on.update({s: True for s in RAW})

                # 100 asks within one second
                def flood_asks():
                    peer.publish_matched(p.ask, String(data="question 0?"))
                    for i in range(1, 100):
                        time.sleep(0.01)
                        p.ask.publish(String(data=f"question {i}?"))

                usable("100 asks", flood_asks, "running", lambda: None)

                # an instruction past max_instruction_chars: refused in the callback, the old one stays
                peer.publish_matched(p.instruction, String(data="pick up the cube " * 400))
                p.diag(time.monotonic(), "instruction_too_long")
                # one within the cap but too long for the prompt: frames dropped with a reason, none cut
                p.instruction.publish(String(data="pick up the cube " * 55))
                t0, a, b = p.phase(2.0)
                p.diag(t0, "frame_dropped")
                p.instruction.publish(String(data="pick up the red cube"))
                t_fixed = time.monotonic()
                assert peer.wait_for(lambda: peer.messages("action_chunk", t_fixed), 5)

                # backwards time jump (e.g. a looping bag): buffers cleared, chunks resume
                before = stamp_to_sec(peer.messages("action_chunk")[-1].header.stamp)
                p.feed.stamp_offset = -100.0
                t0, a, b = p.phase()
                values = p.diag(t0, "time_jump")
                assert int(values["time_jumps"]) >= 1
                after = [stamp_to_sec(m.header.stamp) for m in peer.messages("action_chunk", a)]
                assert after and max(after) < before - 50
                assert node.poll() is None, log.read_text()
            assert node.returncode == 0, log.read_text()
        finally:
            p.feed.stop()
            peer.close()
    # nothing non-finite ever went out
    for msg in peer.messages("action_chunk"):
        assert all(math.isfinite(x) for pt in msg.points for x in pt.positions)
    for msg in peer.messages("joint_command"):
        assert all(math.isfinite(x) for x in msg.position)
    last = {kv.key: kv.value for m in peer.messages("/diagnostics")[-1:] for kv in m.status[0].values}
    assert int(last["asks"]) == 100, last
    assert int(last["count_bad_joint_state"]) > 10 and int(last["dropped_out_of_order"]) > 10
    # the action stream kept its rate while the input was still usable
    for name, (chunks, cmds) in results.items():
        assert chunks >= 0.4 * base_chunks, (name, chunks, base_chunks)
        assert cmds >= 0.6 * CMD_HZ, (name, cmds)
