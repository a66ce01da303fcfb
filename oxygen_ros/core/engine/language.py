"""The language half of a control frame, written once for both schedules (OxyGen §4).

After a frame's chunk is out, :meth:`LanguageStage.run` takes the frame's :class:`LanguageFrame` —
its config, the requests and cancels submitted before it, the observation's instruction, and the
prefilled prefix requests may start on — and does, in order:

1. queue the new requests, apply the cancels, expire old queued ones, submit the periodic tasks
   due at this frame (only on a frame with an observation);
2. admission onto the frame's prefix (after its prefix-ready event, on the decode lane): the
   scheduler picks what fits, each admitted request attaches to the shared prefix — or, in
   ``isolated`` mode and for an own-prefix task, to a private prefix prefilled here — and gets its
   first token (``isolated``: one request at a time, decoded to completion); the frame's own
   reference on its prefix is dropped right after;
3. batched decode for the frame's budget (the scheduler's :class:`~.plan.FramePlan`): ``unified``
   advances every running request, whatever frame it started in, up to k tokens;
   ``shared_kv`` decodes until this frame's requests are done.

The serial schedule (:class:`~.engine.Engine`) calls it in the stepping thread right after the
chunk; the concurrent one (:mod:`oxygen_ros.core.loops`) hands the frame to its batcher thread,
which calls the same method. They differ only in which thread runs it, when, and whether cancels
that arrive during the decode steps are taken between steps (``late_cancels``).

Fault containment (:mod:`.faults`): a failing start or decode step ends the requests it touched as
FAILED and releases their blocks; an exception outside those stages (a bug) fails every running
request (stage ``frame``). Faults go to this stage's own :class:`~.faults.FaultLog` and leave with
the :class:`LanguageOutput`; the engine counts them with its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import EngineConfig
from ..policy import EncodedObservation
from ..types import TextDelta
from .faults import Fault, FaultLog
from .frame import FramePrefix, task_prefix
from .plan import FramePlan
from .request_book import RequestBook
from .requests import LanguageRequest, RequestResult, RequestStatus
from .runner import Runner
from .scheduler import Scheduler
from .streams import DeviceStreams, StageClock


@dataclass
class LanguageFrame:
    """One control frame's language work: the input of :meth:`LanguageStage.run`.

    Attributes:
        frame_id: the control frame.
        cfg: the engine config of this frame (live settings as of the frame's start).
        new / cancels: requests and cancel ids submitted before this frame.
        instruction: the observation's instruction; ``None`` when the frame had no observation
            (periodic tasks are due-checked only on frames with one).
        enc / prefix: the encoded observation and its prefilled prefix; ``prefix`` is ``None``
            when nothing may start on it. The frame's reference on the prefix moves with it: the
            stage drops it.
        ready: the prefix-ready event (CUDA) or ``None`` (CPU: complete when handed over).
        t_frame: ``perf_counter`` seconds at the start of the frame (the adaptive budget's origin).
    """

    frame_id: int
    cfg: EngineConfig
    new: list[LanguageRequest] = field(default_factory=list)
    cancels: set[int] = field(default_factory=set)
    instruction: str | None = None
    enc: EncodedObservation | None = None
    prefix: FramePrefix | None = None
    ready: object | None = None
    t_frame: float = 0.0


@dataclass
class LanguageOutput:
    """What the language half produced — for one frame, or merged over several (times in seconds).

    Attributes:
        tokens: tokens emitted; decode / decode_steps / decode_batch: batched decode time, steps
            and largest batch (a first token's step in ``isolated`` mode included).
        start: admission and first-token time, less the model time counted in ``vision``,
            ``prefill`` and ``decode``; vision / prefill: private prefixes prefilled at admission.
        busy: wall time of the language half; grants: frames processed.
        deltas / ended: text deltas and ended requests, in order; plans: one per frame processed.
        faults / fault_counts: the faults contained and their counts by kind; cache_emptied:
            how often an out-of-memory fault emptied the CUDA allocator cache.
    """

    tokens: int = 0
    decode: float = 0.0
    decode_steps: int = 0
    decode_batch: int = 0
    start: float = 0.0
    vision: float = 0.0
    prefill: float = 0.0
    busy: float = 0.0
    grants: int = 0
    deltas: list[TextDelta] = field(default_factory=list)
    ended: list[RequestResult] = field(default_factory=list)
    plans: list[FramePlan] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    fault_counts: dict[str, int] = field(default_factory=dict)
    cache_emptied: int = 0

    def merge(self, other: LanguageOutput) -> None:
        """Add ``other`` (a later output) to this one."""
        for name in (
            "tokens",
            "decode",
            "decode_steps",
            "start",
            "vision",
            "prefill",
            "busy",
            "grants",
            "cache_emptied",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.decode_batch = max(self.decode_batch, other.decode_batch)
        self.deltas.extend(other.deltas)
        self.ended.extend(other.ended)
        self.plans.extend(other.plans)
        self.faults.extend(other.faults)
        for kind, n in other.fault_counts.items():
            self.fault_counts[kind] = self.fault_counts.get(kind, 0) + n


class LanguageStage:
    """Runs the language half of frames over one engine's request book, scheduler and runner.

    Args:
        book / scheduler / runner / streams: the engine's parts (the stage is their only user
            in the thread that runs it).
        faults: this stage's fault log (also the request book's).
        policy: ``frame`` (a frame's budget per frame) or ``continuous`` (``unified`` mode: one step
            per frame, more by :meth:`continuous_step` while no frame waits).
        late_cancels: returns cancels that arrived since the frame began, taken before each decode
            step (serial schedule, ``continuous`` policy); ``None``: cancels come with frames only.
    """

    def __init__(
        self,
        book: RequestBook,
        scheduler: Scheduler,
        runner: Runner,
        streams: DeviceStreams,
        faults: FaultLog,
        policy: str = "frame",
        late_cancels: Callable[[], set[int]] | None = None,
    ) -> None:
        self.book, self.scheduler, self.runner, self.streams = book, scheduler, runner, streams
        self.faults = faults
        self.policy = policy
        self.late_cancels = late_cancels
        self.clock = StageClock(streams.cuda)

    # ------------------------------------------------------------------ one frame
    def run(self, f: LanguageFrame) -> LanguageOutput:
        """The language half of frame ``f.frame_id`` (module doc). Never raises an ``Exception``:
        a bug outside the guarded stages fails every running request (stage ``frame``). The
        frame's reference on ``f.prefix`` is dropped here, whatever happens."""
        t0 = time.perf_counter()
        out = LanguageOutput()
        self.faults.begin_frame(f.frame_id)
        self.book.begin_frame()
        plan = FramePlan(f.frame_id)
        held = f.prefix is not None
        try:
            book = self.book
            book.enqueue(f.cfg, f.new)
            book.cancel(f.cancels)
            book.expire(f.cfg)
            if f.instruction is not None:
                book.periodic(f.cfg, f.frame_id, f.instruction)
            if f.prefix is not None:
                self.runner.pool.blocks.reclaim(self.streams.is_done)
                with self.streams.decode(after=f.ready):
                    self._start(f, plan, out)
                held = False
                self.runner.pool.blocks.free(f.prefix.blocks, self.streams.fence())
            self._decode(self._budget(f, plan), out)  # isolated: 0 steps, it decoded in _start
        except Exception as e:  # outside any guarded stage (a bug): fail what is running, go on
            self._fail_running(e)
        finally:
            if held:
                assert f.prefix is not None  # held only while the frame has one
                self.runner.pool.blocks.free(f.prefix.blocks, self.streams.fence())
        self._finish(out, plan, t0)
        return out

    def continuous_step(self) -> LanguageOutput:
        """One decode step of the running batch outside any frame (``continuous`` policy; the
        batcher calls it while no frame waits). Never raises an ``Exception``."""
        t0 = time.perf_counter()
        out = LanguageOutput()
        self.faults.begin_frame(self.faults.frame_id)
        self.book.begin_frame()
        try:
            self._decode(1, out)
        except Exception as e:
            self._fail_running(e)
        self._finish(out, None, t0)
        return out

    def _finish(self, out: LanguageOutput, plan: FramePlan | None, t0: float) -> None:
        self.scheduler.drop_terminal()
        deltas, ended = self.book.end_frame()
        out.deltas.extend(deltas)
        out.ended.extend(ended)
        out.tokens += self.book.tokens_this_frame
        if plan is not None:
            plan.finished = [r.id for r in ended]
            out.plans.append(plan)
            out.grants += 1
        out.faults, out.fault_counts = list(self.faults.frame), dict(self.faults.counts)
        out.cache_emptied, self.faults.counts, self.faults.cache_emptied = self.faults.cache_emptied, {}, 0
        out.busy = time.perf_counter() - t0

    def _fail_running(self, exc: Exception) -> None:
        live = [r for r in self.scheduler.running if not r.status.terminal]
        f = self.faults.record("frame", exc, [r.id for r in live])
        self.book.fail(live, f"failed in frame: {f.error}")

    # ------------------------------------------------------------------ admission and first tokens
    def _start(self, f: LanguageFrame, plan: FramePlan, out: LanguageOutput) -> None:
        """Admission onto ``f.prefix`` and every admitted request's first token. A fault inside is
        contained as stage ``start``: the admitted requests end FAILED and release their blocks."""
        t = time.perf_counter()
        staged = out.vision + out.prefill + out.decode  # model time inside is not "start"
        cfg, prefix, enc = f.cfg, f.prefix, f.enc
        assert prefix is not None and enc is not None  # run() starts only on a prefix (step() keeps it with its enc)
        self.book.prepare_prompts(cfg, f.instruction or "")
        admitted, rejected = self.scheduler.plan_admission(cfg, plan, prefix.length)
        self.book.rejected(rejected)
        if admitted:
            with self.faults.guard("start", [r.id for r in admitted]) as g:
                for r in admitted:
                    if cfg.mode == "isolated" or r.prefix_ids:  # a private prefix (own-prefix task: its prompt)
                        own = self.runner.prefill_new(task_prefix(enc, r.prefix_ids), prefix.frame_id)
                        out.vision += own.stage_times["vision"]
                        out.prefill += own.stage_times["prefill"]
                        self.book.attach(r, own, shared=False)
                    else:
                        self.book.attach(r, prefix, shared=True)
                if cfg.mode == "isolated":
                    for r in admitted:  # openpi-style: one request at a time, to completion
                        self.book.accept([r], *self.runner.start([r]))
                        while r.status == RequestStatus.RUNNING and self._decode_step([r], out):
                            pass
                else:
                    self.book.accept(admitted, *self.runner.start(admitted))
                self.streams.sync()
            if g.fault:  # attached ones release their blocks; unattached ones had reserved nothing
                self.book.fail(admitted, f"failed in start: {g.fault.error}")
        out.start += time.perf_counter() - t - (out.vision + out.prefill + out.decode - staged)

    # ------------------------------------------------------------------ batched decode
    def _budget(self, f: LanguageFrame, plan: FramePlan) -> int:
        """The frame's decode steps from the scheduler's plan (``continuous``: one step now, more
        while no frame waits)."""
        left = None
        if f.cfg.frame_deadline_s > 0:
            left = f.cfg.frame_deadline_s - (time.perf_counter() - f.t_frame)
        self.scheduler.plan_decode(f.cfg, plan, left)
        if self.policy == "continuous" and f.cfg.mode == "unified":
            plan.decode_steps = 1
        return plan.decode_steps

    def _decode(self, steps: int, out: LanguageOutput) -> None:
        with self.streams.decode(after=None):
            for _ in range(steps):
                if self.late_cancels is not None:
                    self.book.cancel(self.late_cancels())
                batch = self.scheduler.decode_batch()
                if not batch or not self._decode_step(batch, out):
                    break

    def _decode_step(self, batch: list[LanguageRequest], out: LanguageOutput) -> bool:
        """One guarded decode step of ``batch``; False if it failed (the batch then ended FAILED)."""
        c0 = self.clock.mark()
        with self.faults.guard("decode", [r.id for r in batch]) as g:
            toks, oks = self.runner.decode(batch)  # token ids reach the host: the decode lane's sync
            self.streams.sync()
        dt = self.clock.seconds(c0, self.clock.mark())
        out.decode += dt
        out.decode_steps += 1
        out.decode_batch = max(out.decode_batch, len(batch))
        if g.fault:
            self.book.fail(batch, f"failed in decode: {g.fault.error}")
            return False
        self.scheduler.costs.update(len(batch), dt)
        self.book.accept(batch, toks, oks)
        return True


__all__ = ["LanguageFrame", "LanguageOutput", "LanguageStage"]
