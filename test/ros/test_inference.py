"""InferenceWorker's frame handling (no ROS node): contained engine faults are reported by kind
with the traceback logged once per kind; a rejected, expired or failed request is counted, reported
and reaches its task's text topic as an end-of-utterance message saying why; an ask made while no
camera streams gets an immediate waiting notice and is still answered."""

import time

import numpy as np
import pytest

from oxygen_ros.bench.injection import FaultInjector
from oxygen_ros.core.config import EngineConfig, TaskConfig
from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.loops.schedules import make_engine
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.types import Observation
from oxygen_ros.ros.diagnostics import ERROR, FrameStats, ProblemLog
from oxygen_ros.ros.inference import InferenceWorker
from oxygen_ros.streams.text import is_waiting_notice


class FakeOutputs:
    model_input = False

    def __init__(self):
        self.texts = []

    def publish_text(self, task, emits):
        self.texts += [(task, e.kind, e.text) for e in emits]


class FakeLog:
    def __init__(self):
        self.errors = []

    def error(self, msg):
        self.errors.append(msg)


def obs(i):
    rng = np.random.default_rng(i)
    return Observation(
        images={"base_0_rgb": rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)},
        state=rng.uniform(-1, 1, 14).astype(np.float32),
        instruction="pick",
        stamp=float(i),
    )


def test_faults_and_rejections_reach_diagnostics_logs_and_the_text_topic():
    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cpu")
    eng = Engine(
        policy,
        EngineConfig(
            tasks=(TaskConfig("conversation", "{text}", max_new_tokens=8),),
            tokens_per_frame=2,
            kv_blocks=20,
            max_running_requests=4,
        ),
    )
    problems, out, log = ProblemLog(), FakeOutputs(), FakeLog()
    reported = []

    def report(kind, message, level):
        reported.append((kind, level))
        problems.report(kind, message, 0.0, level)

    worker = InferenceWorker(eng, None, out, FrameStats(), report, log, frames=None)  # _handle only
    with FaultInjector(eng) as inj:
        eng.submit_observation(obs(0))
        huge = eng.submit_request("conversation", "x", 400)
        worker._handle(eng.step())
        for i in (1, 2):
            eng.submit_observation(obs(i))
            eng.submit_request("conversation", "y", 8)
            inj.arm("decode")
            worker._handle(eng.step())
    assert worker.rejected_requests == 1 and worker.failed_requests == 2
    assert problems.counts()["fault_start"] == 2 and problems.counts()["request_rejected"] == 1
    assert ("fault_start", ERROR) in reported
    assert len([m for m in log.errors if "engine fault in start" in m]) == 1  # traceback once per kind
    assert "injected fault in decode" in log.errors[0]
    notices = [t for t in out.texts if t[1] == "text"]
    assert notices[0][2].startswith(f"[#{huge}] [request {huge} rejected: request needs")
    assert all(n[2].startswith("[#") and "failed: failed in start" in n[2] for n in notices[1:])
    eng.check_invariants()


class NoCamera:
    """The assembler of a node whose cameras never deliver (or have stopped)."""

    instruction = "pick up the cube"

    def __init__(self, images=0, waiting="waiting for camera images on base_0_rgb"):
        self.images, self.waiting = images, waiting

    def wait_new(self, timeout):
        time.sleep(min(timeout, 0.005))
        return False

    def received_images(self):
        return self.images

    def status(self):
        return self.waiting, []


@pytest.mark.parametrize("schedule", ["serial", "concurrent"])
def test_an_ask_while_no_camera_streams_is_answered_with_the_reason(schedule):
    """Issue 19: with no observation and nothing running, the inference loop used to skip the
    frame, so an ask stayed in the engine's inbox for ever — never decoded, never ended, shown
    nowhere (running 0, queued 0). Now the loop steps while any request is in flight: the ask
    waits in the queue and ends as expired, and its utterance says so."""
    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cpu")
    eng = make_engine(
        policy,
        EngineConfig(
            tasks=(TaskConfig("conversation", "{text}", max_new_tokens=8),), schedule=schedule, max_queue_wait_s=0.2
        ),
    )
    eng.warmup()
    out, log = FakeOutputs(), FakeLog()
    worker = InferenceWorker(eng, NoCamera(), out, FrameStats(), lambda *a: None, log, frames=None)
    rid = worker.ask("conversation", "anyone there?")
    # at once, before any frame: the waiting notice, on the text topic only, without a header
    assert out.texts == [
        (
            "conversation",
            "text",
            f"[request {rid} waiting: no camera input yet; it waits up to "
            "0.2 s (engine.max_queue_wait_s) for an observation]",
        )
    ]
    end = time.monotonic() + 30
    while time.monotonic() < end and len([t for t in out.texts if t[1] == "text"]) < 2:
        worker._once()
    texts = [t[2] for t in out.texts if t[1] == "text"]
    assert len(texts) == 2 and is_waiting_notice(texts[0]), out.texts
    assert texts[1].startswith(f"[#{rid} Q: anyone there?] [request {rid} expired: waited"), out.texts
    assert worker.expired_requests == 1 and eng.in_flight == 0
    assert worker.snapshot["requests_conversation_expired"] == 1
    assert worker.snapshot["requests_conversation_submitted"] == 1
    eng.check_invariants()
    eng.close()


@pytest.mark.parametrize("schedule", ["serial", "concurrent"])
def test_deactivation_ends_every_request_in_flight_with_the_reason(schedule):
    """A request running or queued when the node deactivates is cancelled and its utterance
    closes with ``node deactivated``; the deltas of the last frame (run while stopping) go out
    first, so the deltas still add up to the text. Nothing is left in flight."""
    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cpu")
    eng = make_engine(
        policy,
        EngineConfig(
            tasks=(TaskConfig("conversation", "{text}", max_new_tokens=64),),
            schedule=schedule,
            tokens_per_frame=1,
            max_running_requests=1,
        ),
    )
    eng.warmup()
    out, log = FakeOutputs(), FakeLog()
    worker = InferenceWorker(eng, NoCamera(), out, FrameStats(), lambda *a: None, log, frames=None)
    running, queued = worker.ask("conversation", "first?"), worker.ask("conversation", "second?")
    assert [is_waiting_notice(t[2]) for t in out.texts] == [True, True]  # no observation yet
    del out.texts[:]
    for i in range(3):  # the first request decodes a few tokens; the second waits (one may run)
        eng.submit_observation(obs(i))
        worker._handle(eng.step())
    worker._stop.set()  # a frame run while the node stops: held back, not lost
    eng.submit_observation(obs(3))
    worker._handle(eng.step())
    assert worker.end_requests("node deactivated") == 2
    texts = {t[2][: t[2].index("]") + 1]: t[2] for t in out.texts if t[1] == "text"}
    assert set(texts) == {f"[#{running} Q: first?]", f"[#{queued} Q: second?]"}, out.texts
    for rid in (running, queued):
        assert next(t for t in texts.values() if t.startswith(f"[#{rid} ")).endswith(
            f"[request {rid} cancelled: node deactivated]"
        )
    deltas = "".join(t[2] for t in out.texts if t[1] == "delta")
    assert deltas == "".join(t[2] for t in out.texts if t[1] == "text")
    assert (
        len(texts[f"[#{running} Q: first?]"])
        > len(f"[#{running} Q: first?] [request {running} cancelled: node deactivated]") + 1
    )  # it had decoded tokens
    assert eng.in_flight == 0 and worker.ended["cancelled"] == 2
    row = worker.snapshot
    assert row["requests_conversation_submitted"] == 2 and row["requests_conversation_cancelled"] == 2
    assert row["requests_conversation_in_flight"] == 0
    eng.check_invariants()
    eng.close()


def test_waiting_notice_only_before_the_first_observation_and_says_what_is_missing():
    """After the first observation since activation an ask gets no waiting notice until the
    observations stop for longer than input_timeout_s; with camera
    images but no observation (no joint state yet) the notice says what the assembler waits for;
    ``start()`` (activation) forgets the observation."""
    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cpu")
    eng = make_engine(policy, EngineConfig(tasks=(TaskConfig("conversation", "{text}", max_new_tokens=2),)))
    out = FakeOutputs()
    worker = InferenceWorker(
        eng,
        NoCamera(images=3, waiting="waiting for joint states"),
        out,
        FrameStats(),
        lambda *a: None,
        FakeLog(),
        frames=None,
    )
    rid = worker.ask("conversation", "a?")
    assert out.texts == [
        (
            "conversation",
            "text",
            f"[request {rid} waiting: no observation yet (waiting for "
            "joint states); it waits up to 30.0 s (engine.max_queue_wait_s) "
            "for an observation]",
        )
    ]
    worker.observed = True  # what _once sets when it hands an observation to the engine
    worker.ask("conversation", "b?")
    assert len(out.texts) == 1
    worker.camera_silence = lambda: 5.0  # every camera stopped 5 s ago (the node's input liveness)
    rid = worker.ask("conversation", "c?")
    assert out.texts[-1][2].startswith(f"[request {rid} waiting: no camera image for 5.0 s (the inputs stopped)")
    worker.start()
    worker.stop()
    assert not worker.observed
    eng.close()


class FlakyOutputs(FakeOutputs):
    """Publishing raises once, on the message kind ``fail_on`` (a fault of the node's own glue)."""

    def __init__(self, fail_on):
        super().__init__()
        self.fail_on = fail_on

    def publish_text(self, task, emits):
        for e in emits:
            if e.kind == self.fail_on:
                self.fail_on = None
                raise RuntimeError("publish failed")
            self.texts.append((task, e.kind, e.text))


class RestartLog(FakeLog):
    def warning(self, msg):
        self.errors.append(msg)


@pytest.mark.parametrize("schedule", ["serial", "concurrent"])
@pytest.mark.parametrize("fail_on", ["text", "delta"])
def test_a_publish_that_raises_loses_no_text_the_restart_publishes_it_first(fail_on, schedule):
    """A frame whose text publish raises (the supervisor restarts the loop): what that frame had
    not yet published goes out when the restart runs, before the notices of the requests it ends —
    once, in order. Before, a request that finished in that frame vanished: its end was dropped
    with the frame, and the restart found nothing in flight to end."""
    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cpu")
    eng = make_engine(
        policy,
        EngineConfig(
            tasks=(
                TaskConfig("conversation", "{text}", max_new_tokens=1),
                TaskConfig("memory", "{text}", max_new_tokens=50),
            ),
            tokens_per_frame=1,
            schedule=schedule,
        ),
    )
    out = FlakyOutputs(fail_on)
    worker = InferenceWorker(eng, NoCamera(), out, FrameStats(), lambda *a: None, RestartLog(), frames=None)
    worker.observed = True  # no waiting notices
    short = worker.ask("conversation", "short?")  # finishes in its first frame (one token)
    long = worker.ask("memory", "long?")  # still decoding when the loop restarts
    with pytest.raises(RuntimeError, match="publish failed"):
        for i in range(4):  # the concurrent schedule hands a frame's text out one frame later
            eng.submit_observation(obs(i))
            worker._handle(eng.step())
    worker._restart_after(RuntimeError("publish failed"), 0.1)
    texts = [t for t in out.texts if t[1] == "text"]
    assert [t[0] for t in texts] == ["conversation", "memory"], out.texts
    assert texts[0][2].startswith(f"[#{short} Q: short?] ") and "[request" not in texts[0][2], out.texts
    assert texts[1][2].startswith(f"[#{long} Q: long?] ") and texts[1][2].endswith(
        f"[request {long} cancelled: inference restarted after an error: RuntimeError: publish failed]"
    )
    for task in ("conversation", "memory"):  # the deltas add up to the text: nothing lost, nothing twice
        assert "".join(t[2] for t in out.texts if t[:2] == (task, "delta")) == next(
            t[2] for t in texts if t[0] == task
        ), out.texts
    assert worker.restarts == 1 and eng.in_flight == 0 and not worker._unsent
    eng.check_invariants()
    eng.close()
