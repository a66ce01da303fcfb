"""What the batcher does with one grant: the language half of a control frame (DESIGN §5 steps 4–5).

Exactly the serial ``Engine.step`` after the chunk — queue, cancel, expire, periodic tasks,
admission onto the frame's prefix (after its ready event, on the decode lane), the first token,
then the frame's decode budget from the scheduler's :class:`~oxygen_ros.core.engine.plan.FramePlan`
— with the same fault containment (:mod:`oxygen_ros.core.engine.faults`): a failing start or
decode step ends the requests it touched as FAILED and releases their blocks. Runs in the batcher
thread only; the frame's own reference on its prefix is dropped through a fence of every lane.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..engine.faults import Fault, FaultLog
from ..engine.plan import FramePlan
from ..engine.requests import LanguageRequest, RequestResult
from ..engine.streams import StageClock
from ..types import Observation, TextDelta

@dataclass
class Grant:
    """One control frame's language work, handed from the action loop to the batcher.

    Attributes:
        frame_id: the frame; ``periodic``: whether periodic tasks are due-checked (the frame had
            an observation, as in the serial schedule).
        new / cancels: requests and cancel ids submitted before this frame.
        obs, enc, prefix: the observation, its encoding and its prefilled prefix (``prefix`` is
            ``None`` when nothing may start on it; it then was released by the action loop).
        ready: the prefix-ready event (CUDA) or ``None`` (CPU: complete when handed over).
        t_frame: ``perf_counter`` at the start of the frame (adaptive-k deadline origin).
    """

    frame_id: int
    periodic: bool
    new: list[LanguageRequest]
    cancels: set[int]
    obs: Observation | None = None
    enc: Any = None
    prefix: Any = None
    ready: object | None = None
    t_frame: float = 0.0


@dataclass
class BatchStats:
    """Language work finished since the last :meth:`BatcherLoop.take` (times in seconds)."""

    tokens: int = 0
    decode: float = 0.0
    decode_steps: int = 0
    decode_batch: int = 0
    busy: float = 0.0
    grants: int = 0
    deltas: list[TextDelta] = field(default_factory=list)
    ended: list[RequestResult] = field(default_factory=list)
    plans: list[FramePlan] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    fault_counts: dict[str, int] = field(default_factory=dict)


class FrameWork:
    """The language work of grants over one engine's scheduler, book, runner and lanes.

    Args:
        engine: the engine whose parts it drives; policy: ``frame`` or ``continuous``.
        faults: the batcher thread's fault log (the request book records into it too).
    """

    def __init__(self, engine: Any, policy: str, faults: FaultLog) -> None:
        self.e = engine
        engine.book.faults = faults  # the request book runs in this thread: it records here
        self.policy = policy
        self.faults = faults
        self.clock = StageClock(engine.streams.cuda)

    def process(self, g: Grant, out: BatchStats) -> None:
        """Everything the serial step does for language in frame ``g.frame_id``. The frame's own
        reference on its prefix is dropped right after admission — or, if anything raised, on the
        way out (never leaked)."""
        held = g.prefix is not None
        try:
            e, book = self.e, self.e.book
            plan = FramePlan(g.frame_id)
            book.begin_frame()
            book.enqueue(g.new)
            book.cancel(g.cancels)
            book.expire()
            if g.periodic:
                book.periodic(g.frame_id, g.obs.instruction)
            if g.prefix is not None:
                e.pool.blocks.reclaim(e.streams.is_done)
                with e.streams.decode(after=g.ready):
                    self._start(g, plan, out)
                held = False
                e.pool.blocks.free(g.prefix.blocks, e.streams.fence())
            self._decode(self._budget(g, plan), out)  # isolated: 0 steps, it decoded inside _start
            e.scheduler.drop_terminal()
            self._collect(out, plan)
            out.grants += 1
        finally:
            if held:
                self.e.pool.blocks.free(g.prefix.blocks, self.e.streams.fence())

    def _collect(self, out: BatchStats, plan: FramePlan | None) -> None:
        deltas, ended = self.e.book.end_frame()
        out.deltas.extend(deltas)
        out.ended.extend(ended)
        out.tokens += self.e.book.tokens_this_frame
        if plan is not None:
            plan.finished = [r.id for r in ended]
            out.plans.append(plan)

    def _budget(self, g: Grant, plan: FramePlan) -> int:
        """The frame's decode steps from the scheduler's plan (``continuous``: one step now, more
        while no grant waits)."""
        e = self.e
        left = None
        if e.cfg.frame_deadline_s > 0:
            left = e.cfg.frame_deadline_s - (time.perf_counter() - g.t_frame)
        e.scheduler.plan_decode(plan, left)
        if self.policy == "continuous" and e.cfg.mode == "unified":
            plan.decode_steps = 1
        return plan.decode_steps

    def _start(self, g: Grant, plan: FramePlan, out: BatchStats) -> None:
        """Admission onto ``g.prefix`` and the first tokens (the serial engine's own code,
        :meth:`RequestBook.start_on`; faults go to the batcher's log)."""
        e = self.e
        e.book.start_on(g.prefix, g.enc, g.obs.instruction, plan, self.faults, e._prefill, e.runner.start,
                        lambda batch: self._step(batch, out))

    def _decode(self, steps: int, out: BatchStats) -> None:
        with self.e.streams.decode(after=None):
            for _ in range(steps):
                if self.policy == "continuous":
                    self.e.book.cancel(self.e._drain_cancels())
                batch = self.e.scheduler.decode_batch()
                if not batch or not self._step(batch, out):
                    break

    def _step(self, batch: list[LanguageRequest], out: BatchStats) -> bool:
        """One guarded decode step; False if it failed (the batch then ended FAILED)."""
        c0 = self.clock.mark()
        with self.faults.guard("decode", [r.id for r in batch]) as g:
            toks, oks = self.e.runner.decode(batch)  # token ids reach the host: the decode stream's sync
        dt = self.clock.seconds(c0, self.clock.mark())
        out.decode += dt
        out.decode_steps += 1
        out.decode_batch = max(out.decode_batch, len(batch))
        if g.fault:
            self.e.book.fail(batch, f"failed in decode: {g.fault.error}")
            return False
        self.e.scheduler.costs.update(len(batch), dt)
        self.e.book.accept(batch, toks, oks)
        return True

    def continuous_step(self, out: BatchStats) -> None:
        """One decode step of the running batch outside any frame (``continuous`` policy)."""
        book = self.e.book
        book.begin_frame()
        self._decode(1, out)
        self.e.scheduler.drop_terminal()
        self._collect(out, None)

    def contain(self, exc: Exception, out: BatchStats) -> None:
        """The serial engine's frame-level containment: every running request ends FAILED."""
        e = self.e
        live = [r for r in e.scheduler.running if not r.status.terminal]
        f = self.faults.record("frame", exc, [r.id for r in live])
        e.book.fail(live, f"failed in frame: {f.error}")
        e.scheduler.drop_terminal()
        self._collect(out, None)


__all__ = ["BatchStats", "FrameWork", "Grant"]
