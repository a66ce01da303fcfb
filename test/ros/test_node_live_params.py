"""Live parameter changes on an active node (in this process, own Context, fed over DDS).

Every parameter is either applied live — the running engine, assembler, worker, command stream,
text streams or diagnostics timer holds the new value at once, and the behavioural ones change
what the node publishes — or refused while configured with a reason naming it and how to apply it.
The engine side is proven exactly in ``test/core/test_live.py`` (a reconfigured engine equals one
built with the new settings).
"""

from __future__ import annotations

import os
import threading
import time

os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"

import pytest  # noqa: E402
import rclpy  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from domain_coordinator import domain_id  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.signals import SignalHandlerOptions  # noqa: E402
from ros_helpers import ALOHA_COMPRESSED, ALOHA_JOINTS, REPO, RosPeer, SensorFeed  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from oxygen_ros.ros.distro import close_context  # noqa: E402
from oxygen_ros.ros.node import OxygenNode  # noqa: E402
from oxygen_ros.ros.params.live import LIVE_NODE_PARAMS, is_live  # noqa: E402
from oxygen_ros.ros.params.node_config import node_specs  # noqa: E402
from oxygen_ros.ros.params.specs import task_specs  # noqa: E402
from oxygen_ros.ros.qos import qos_from_name, reliable_qos  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]
RAW = {s: t.replace("/compressed", "") for s, t in ALOHA_COMPRESSED.items()}
# model_locked false: model is then a configure-time parameter like the others (locked: read-only, test_security.py)
ARGS = [
    "-p",
    "model:=pi05-tiny",
    "-p",
    "model_locked:=false",
    "-p",
    "num_threads:=1",
    "-p",
    "tasks.memory.every_n_frames:=0",
    "-p",
    "tasks.conversation.max_new_tokens:=6",
    "-p",
    "engine.tokens_per_frame:=2",
    "-p",
    "engine.decode_budget:=fixed",
    *[a for s, t in RAW.items() for a in ("-p", f"cameras.{s}.topic:={t}", "-p", f"cameras.{s}.type:=raw")],
]


class Live:
    """The active node, its executor thread, a peer feeding it and listening, and a record of
    every frame result and submitted observation."""

    def __init__(self, dom: int) -> None:
        self.ctx = Context()
        rclpy.init(
            context=self.ctx,
            domain_id=dom,
            signal_handler_options=SignalHandlerOptions.NO,
            args=["--ros-args", "--params-file", str(REPO / "config" / "oxygen.yaml"), *ARGS],
        )
        self.node = OxygenNode(context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()
        self.node.trigger_configure()
        assert self.node.engine is not None, self.node.configure_error
        self.results, self.observations = [], []
        handle, submit = self.node.worker._handle, self.node.engine.submit_observation
        self.node.worker._handle = lambda r: (self.results.append(r), handle(r))[1]
        self.node.engine.submit_observation = lambda o, **k: (self.observations.append(o), submit(o, **k))[1]
        self.node.trigger_activate()
        self.peer = RosPeer(dom, "live_peer")
        for topic in ("conversation/text", "memory/text"):
            self.peer.collect(String, topic, qos_from_name("text"))
        self.peer.collect(DiagnosticArray, "/diagnostics")
        self.feed = SensorFeed(self.peer, RAW, ALOHA_JOINTS, 20.0).start()
        self.ask_pub = self.peer.node.create_publisher(String, "ask", reliable_qos())
        assert self.peer.wait_for(lambda: len(self.results) >= 3, 60), "no frames"

    def _spin(self) -> None:
        while self.ctx.ok():
            try:
                self.executor.spin_once(timeout_sec=0.05)
            except Exception:
                if self.ctx.ok():
                    raise

    def set(self, **values) -> object:
        return self.node.set_parameters_atomically(
            [Parameter(k.replace("__", "."), value=v) for k, v in values.items()]
        )

    def ask(self, text: str, timeout: float = 60.0) -> str:
        """Ask and wait for the utterance of this ask on conversation/text."""
        since = time.monotonic()
        self.peer.publish_matched(self.ask_pub, String(data=text))
        got = self.peer.wait_for(
            lambda: [
                m.data
                for m in self.peer.messages("conversation/text", since)
                if f"Q: {text}]" in m.data and not m.data.startswith("[request")
            ],
            timeout,
        )
        assert got, f"no answer to {text!r}"
        return got[0]

    def ended(self, since: int) -> list:
        return [e for r in self.results[since:] for e in r.ended]

    def close(self) -> None:
        self.feed.stop()
        self.peer.close()
        self.node.teardown()
        close_context(self.ctx, [self.node], self.executor, self.thread)


@pytest.fixture(scope="module")
def live():
    with domain_id() as dom:
        lv = Live(dom)
        try:
            yield lv
        finally:
            lv.close()


def _other_value(spec, current):
    """A valid value different from ``current`` for ``spec`` (None when there is none)."""
    t = spec.ptype
    if t == Parameter.Type.BOOL:
        return not current
    if spec.choices:
        rest = [c for c in spec.choices if c != current]
        return rest[0] if rest else None
    if t == Parameter.Type.STRING:
        return (current or "") + "x"
    if t == Parameter.Type.STRING_ARRAY:
        return list(current or []) + ["x"]
    step = 1 if t == Parameter.Type.INTEGER else 0.5
    for cand in (current + step, current - step, current * 2):
        if (spec.lo is None or cand >= spec.lo) and (spec.hi is None or cand <= spec.hi):
            return cand
    return None


def test_every_parameter_is_either_applied_live_or_refused_with_a_reason(live):
    node = live.node
    specs = node_specs() + [s for t in node.cfg.task_topics for s in task_specs(t)]
    applied, refused = [], []
    for spec in specs:
        current = node.get_parameter(spec.name).value
        new = _other_value(spec, current)
        if new is None:
            continue
        if spec.name.startswith("engine.") and spec.name.split(".")[1] in ("min_decode_steps", "max_decode_steps"):
            new = 2  # a valid pair with the other bound
        res = node.set_parameters([Parameter(spec.name, value=new)])[0]
        if spec.read_only:  # model_locked, model_folders: rclpy refuses before the node's callback
            assert not res.successful and "read-only" in res.reason, (spec.name, res.reason)
            refused.append(spec.name)
        elif is_live(spec.name):
            assert res.successful, (spec.name, new, res.reason)
            applied.append(spec.name)
            node.set_parameters([Parameter(spec.name, value=current)])  # back
        else:
            assert not res.successful, spec.name
            if spec.name == "autostart":
                assert "start-up" in res.reason
                continue
            assert spec.name in res.reason and "configure" in res.reason and "deactivate" in res.reason, res.reason
            refused.append(spec.name)
    assert {
        "tasks.conversation.temperature",
        "engine.tokens_per_frame",
        "rtc.inference_delay",
        "instruction",
        "diagnostics_period_s",
        "input_timeout_s",
    } <= set(applied)
    assert {
        "model",
        "engine.mode",
        "engine.kv_blocks",
        "rtc.enabled",
        "task_names",
        "joint_names",
        "tasks.conversation.ask_topic",
        "tasks.memory.own_prefix",
        "cameras.base_0_rgb.topic",
    } <= set(refused)
    res = node.set_parameters([Parameter("model", value=node.get_parameter("model").value)])[0]
    assert res.successful  # the same value is no change


def test_the_running_parts_hold_each_new_live_value(live):
    node = live.node
    assert live.set(
        engine__tokens_per_frame=3,
        engine__max_queue_wait_s=12.5,
        engine__seed=7,
        rtc__inference_delay=4,
        rtc__delay_window=9,
    ).successful
    assert node.engine.cfg.tokens_per_frame == 3 and node.engine.cfg.max_queue_wait_s == 12.5
    assert node.engine.cfg.seed == 7
    assert live.peer.wait_for(lambda: node.engine.handover.cfg.inference_delay == 4, 10)  # next frame
    assert node.engine.handover.latencies.maxlen == 9
    assert live.set(
        state_tolerance_s=0.2,
        camera_max_age_s=0.9,
        time_jump_s=2.0,
        camera_sync_s=0.02,
        command_max_hold_s=0.3,
        input_timeout_s=3.0,
    ).successful
    assert node.inputs.watch.timeout_s == 3.0 and node.inputs.watch.grace_s == 6.0
    a = node.assembler.cfg
    assert (a.state_tolerance_s, a.camera_max_age_s, a.time_jump_s) == (0.2, 0.9, 2.0)
    assert node.worker.camera_sync_s == 0.02 and node.outputs.command_stream.max_hold_s == 0.3
    assert node.cfg.camera_max_age_s == 0.9  # what /diagnostics and the next configure see
    res = live.set(engine__tokens_per_frame=4, engine__mode="isolated")  # atomically: all or none
    assert not res.successful and "engine.mode" in res.reason and node.engine.cfg.tokens_per_frame == 3
    res = live.set(engine__min_decode_steps=9)  # live, but not with max_decode_steps 8
    assert not res.successful and "min_decode_steps" in res.reason
    assert LIVE_NODE_PARAMS <= {s.name for s in node_specs()}


def test_sampling_budget_and_header_changes_change_the_answers(live):
    def last_tokens(since: int) -> list[int]:
        done = [e for e in live.ended(since) if e.task == "conversation"]
        assert done
        return done[-1].token_ids

    n = len(live.results)
    greedy = live.ask("what is on the table")
    assert greedy.split("] ", 1)[1].strip() == ""  # random weights, greedy: spaces, never an EOS
    assert len(last_tokens(n)) == 6
    assert live.set(tasks__conversation__max_new_tokens=3).successful
    n = len(live.results)
    live.ask("a shorter answer")
    assert len(last_tokens(n)) == 3
    assert live.set(tasks__conversation__temperature=2.0, tasks__conversation__max_new_tokens=12).successful
    # sampled text is not all spaces (an early EOS is possible, so up to three asks)
    assert any(live.ask(f"what is on the table now {i}").split("] ", 1)[1].strip() for i in range(3))
    assert live.set(tasks__conversation__top_k=1).successful  # top-1 sampling is greedy again
    assert live.ask("and now").split("] ", 1)[1].strip() == ""
    assert live.set(text_header="id", tasks__conversation__top_k=0).successful
    since = time.monotonic()
    live.peer.publish_matched(live.ask_pub, String(data="header please"))
    got = live.peer.wait_for(
        lambda: [m.data for m in live.peer.messages("conversation/text", since) if not m.data.startswith("[request")],
        60,
    )
    assert got and got[0].startswith("[#") and "Q:" not in got[0]
    assert live.set(
        text_header="ask", tasks__conversation__temperature=0.0, tasks__conversation__max_new_tokens=6
    ).successful


def test_decode_budget_period_queue_and_instruction_changes_act_from_the_next_frame(live):
    assert live.set(engine__tokens_per_frame=1).successful
    n = len(live.results)
    live.ask("one token per frame")
    assert max(r.metrics.decode_steps for r in live.results[n:]) == 1
    assert live.set(engine__tokens_per_frame=5).successful
    n = len(live.results)
    live.ask("five tokens per frame")
    assert max(r.metrics.decode_steps for r in live.results[n:]) == 5
    since = time.monotonic()
    assert live.set(tasks__memory__every_n_frames=2).successful  # the periodic task starts
    assert live.peer.wait_for(lambda: len(live.peer.messages("memory/text", since)) >= 2, 60)
    assert live.set(tasks__memory__every_n_frames=0).successful
    assert live.set(engine__max_queued_requests=0).successful
    assert "queue full" in live.ask("no room") or "rejected" in live.ask("no room either")
    assert live.set(engine__max_queued_requests=64, instruction="stack the blocks").successful
    assert live.peer.wait_for(lambda: live.observations[-1].instruction == "stack the blocks", 30)


def test_the_diagnostics_period_changes_live(live):
    assert live.set(diagnostics_period_s=0.1).successful
    assert live.node._diag_timer.timer_period_ns == 100_000_000
    time.sleep(0.5)  # the old 1 s period's next tick has passed
    t0 = time.monotonic()
    assert live.peer.wait_for(lambda: len(live.peer.messages("/diagnostics", t0)) >= 5, 10)
    assert live.set(diagnostics_period_s=1.0).successful


def test_an_unconfigured_node_accepts_every_value_for_configure():
    with domain_id() as dom:
        ctx = Context()
        rclpy.init(
            context=ctx,
            domain_id=dom,
            signal_handler_options=SignalHandlerOptions.NO,
            args=["--ros-args", "--params-file", str(REPO / "config" / "oxygen.yaml"), *ARGS, "-p", "autostart:=false"],
        )
        node = OxygenNode(context=ctx)
        try:
            assert node.set_parameters([Parameter("engine.mode", value="isolated")])[0].successful
            assert node.set_parameters([Parameter("model", value="pi05-tiny")])[0].successful
            assert node.set_parameters([Parameter("diagnostics_period_s", value=0.2)])[0].successful
            node.trigger_configure()
            assert node.engine is not None and node.engine.cfg.mode == "isolated", node.configure_error
            assert node._diag_timer.timer_period_ns == 200_000_000  # read at configure, timer included
        finally:
            node.teardown()
            node.destroy_node()
            ctx.try_shutdown()


def test_adaptive_budget_bounds_change_live(live):
    assert live.set(
        engine__decode_budget="adaptive",
        engine__min_decode_steps=3,
        engine__max_decode_steps=3,
        engine__frame_deadline_s=5.0,
    ).successful
    n = len(live.results)
    live.ask("three steps a frame")
    assert max(r.metrics.decode_steps for r in live.results[n:]) == 3
    assert live.set(
        engine__decode_budget="fixed",
        engine__min_decode_steps=1,
        engine__max_decode_steps=16,
        engine__frame_deadline_s=0.0,
    ).successful


def test_a_tiny_queue_wait_expires_asks_live(live):
    assert live.set(engine__max_queue_wait_s=1e-6).successful
    assert "expired" in live.ask("too late")
    assert live.set(engine__max_queue_wait_s=30.0).successful
