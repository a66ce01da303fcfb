"""The batcher loop: the language half of the engine in its own thread, on the decode lane.

The action loop hands it one :class:`Grant` per control frame (in frame order): the requests and
cancels submitted before that frame, and — when requests may start on it — the frame's prefix,
whose frame reference moves to the batcher together with the prefix-ready event. For each grant
the batcher does exactly what the serial ``Engine.step`` does after the chunk (DESIGN §5 steps
4–5): queue, cancel, periodic tasks, admission onto the prefix (after its ready event, on the
decode stream), the first token, then the frame's decode budget — ≤ k steps per request in
``unified`` with the ``frame`` policy, to completion in ``shared_kv`` / ``isolated``. The frame's
prefix reference is released through a fence of every lane. Because grants carry the frame's
inputs and budget, token streams are the serial schedule's, whatever the timing.

The ``continuous`` policy keeps stepping the running batch while no grant is waiting (cancels are
then also taken between steps): more tokens per second, token timing no longer tied to frames.

Threading: the scheduler and the request book are touched by this thread only (requests are
created by ``Engine.submit_request`` on any thread, as in the serial schedule); the block pool is
shared with the action loop under its lock; outputs go to an outbox the action loop drains.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from ..cache.block_pool import BlockTable
from ..engine.plan import FramePlan
from ..engine.requests import LanguageRequest, RequestResult, RequestStatus
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


class BatcherLoop:
    """The language loop over one engine's scheduler, request book, runner and lanes.

    Args:
        engine: the :class:`~oxygen_ros.core.engine.engine.Engine` whose parts it drives.
        policy: ``frame`` or ``continuous`` (see module doc).
        intra_op_threads: torch intra-op threads of this thread on the CPU (0: unchanged).
    """

    def __init__(self, engine: Any, policy: str = "frame", intra_op_threads: int = 1) -> None:
        self.e = engine
        self.policy = policy
        self.threads = intra_op_threads
        self.clock = StageClock(engine.streams.cuda)
        self._cv = threading.Condition()
        self._grants: deque[Grant] = deque()
        self._out = BatchStats()
        self._busy = False
        self._in_grant = False
        self._paused = 0
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control (action thread)
    def start(self) -> None:
        """Start the thread (no-op if running)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="oxygen-batcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish the granted work, then end the thread."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._thread = None

    def submit(self, grant: Grant) -> None:
        """Queue a frame's grant (frame order)."""
        with self._cv:
            self._grants.append(grant)
            self._cv.notify_all()

    @property
    def pending(self) -> int:
        """Grants not yet processed (the one in progress included)."""
        with self._cv:
            return len(self._grants) + int(self._in_grant)

    @property
    def alive(self) -> bool:
        """Whether the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def has_output(self) -> bool:
        """Whether deltas, ended requests or an error wait for :meth:`take`."""
        with self._cv:
            return bool(self._out.deltas or self._out.ended or self._error is not None)

    def take(self) -> BatchStats:
        """Outputs and stats since the last call; re-raises an error of the batcher thread.

        Raises:
            RuntimeError: the batcher thread failed (the original error is its cause).
        """
        with self._cv:
            out, self._out = self._out, BatchStats()
            err, self._error = self._error, None
        if err is not None:
            raise RuntimeError(f"language batcher failed: {err}") from err
        return out

    def wait_progress(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds for the batcher to finish a unit of work."""
        with self._cv:
            self._cv.wait(timeout)

    def paused(self) -> "_Pause":
        """Context: wait until every grant is processed and no step runs; none starts inside."""
        return _Pause(self)

    # ------------------------------------------------------------------ the loop (own thread)
    def _has_work(self) -> bool:
        if self._paused:
            return False
        if self._grants or self._stop:
            return True
        return self.policy == "continuous" and any(
            r.status == RequestStatus.RUNNING for r in self.e.scheduler.running)

    def _run(self) -> None:
        if not self.e.streams.cuda and self.threads > 0:
            torch.set_num_threads(self.threads)
        while True:
            with self._cv:
                while not self._has_work():
                    self._cv.wait()
                if self._stop and not self._grants:
                    return
                grant = self._grants.popleft() if self._grants else None
                self._busy, self._in_grant = True, grant is not None
            t0 = time.perf_counter()
            out = BatchStats()
            try:
                with torch.inference_mode():
                    if grant is not None:
                        self._process(grant, out)
                    else:
                        self._continuous_step(out)
            except BaseException as e:  # surfaced to the action loop by take()
                self._error = e
            out.busy = time.perf_counter() - t0
            with self._cv:
                self._merge(out)
                self._busy = self._in_grant = False
                self._cv.notify_all()

    def _merge(self, out: BatchStats) -> None:
        o = self._out
        o.tokens += out.tokens
        o.decode += out.decode
        o.decode_steps += out.decode_steps
        o.decode_batch = max(o.decode_batch, out.decode_batch)
        o.busy += out.busy
        o.grants += out.grants
        o.deltas.extend(out.deltas)
        o.ended.extend(out.ended)
        o.plans.extend(out.plans)

    # ------------------------------------------------------------------ one grant
    def _process(self, g: Grant, out: BatchStats) -> None:
        e, book = self.e, self.e.book
        plan = FramePlan(g.frame_id)
        book.begin_frame()
        book.enqueue(g.new)
        book.cancel(g.cancels)
        if g.periodic:
            book.periodic(g.frame_id)
        if g.prefix is not None:
            e.pool.blocks.reclaim(e.streams.is_done)
            with e.streams.decode(after=g.ready):
                self._start(g, plan, out)
            e.pool.blocks.free(g.prefix.blocks, e.streams.fence())  # the frame's own reference
        self._decode(self._budget(g, plan), out)  # isolated: 0 steps, it decoded inside _start
        e.scheduler.drop_terminal()
        self._collect(out, plan)
        out.grants += 1

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
        """Admission onto ``g.prefix`` and the first token (the serial ``_start_requests``)."""
        e = self.e
        e.book.prepare_prompts(g.obs.instruction)
        admitted, rejected = e.scheduler.plan_admission(plan, g.prefix.length)
        e.book.rejected(rejected)
        if not admitted:
            return
        for r in admitted:
            if e.cfg.mode == "isolated":
                e.book.attach(r, e.runner.prefill(g.enc, g.prefix.frame_id, BlockTable(e.pool.blocks)), shared=False)
            else:
                e.book.attach(r, g.prefix, shared=True)
        if e.cfg.mode == "isolated":
            for r in admitted:  # openpi-style: one request at a time, to completion
                e.book.accept([r], *e.runner.start([r]))
                while r.status == RequestStatus.RUNNING:
                    self._step([r], out)
        else:
            e.book.accept(admitted, *e.runner.start(admitted))

    def _decode(self, steps: int, out: BatchStats) -> None:
        with self.e.streams.decode(after=None):
            for _ in range(steps):
                if self.policy == "continuous":
                    self.e.book.cancel(self.e._drain_cancels())
                batch = self.e.scheduler.decode_batch()
                if not batch:
                    break
                self._step(batch, out)

    def _step(self, batch: list[LanguageRequest], out: BatchStats) -> None:
        c0 = self.clock.mark()
        toks, oks = self.e.runner.decode(batch)  # token ids reach the host: the decode stream's sync
        dt = self.clock.seconds(c0, self.clock.mark())
        self.e.scheduler.costs.update(len(batch), dt)
        out.decode += dt
        out.decode_steps += 1
        out.decode_batch = max(out.decode_batch, len(batch))
        self.e.book.accept(batch, toks, oks)

    def _continuous_step(self, out: BatchStats) -> None:
        book = self.e.book
        book.begin_frame()
        self._decode(1, out)
        self.e.scheduler.drop_terminal()
        self._collect(out, None)


class _Pause:
    """See :meth:`BatcherLoop.paused`."""

    def __init__(self, loop: BatcherLoop) -> None:
        self.loop = loop

    def __enter__(self) -> None:
        lp = self.loop
        with lp._cv:
            while lp._grants or lp._busy:
                if lp._thread is None or not lp._thread.is_alive():
                    break
                lp._cv.wait(0.05)
            lp._paused += 1

    def __exit__(self, *exc: object) -> None:
        lp = self.loop
        with lp._cv:
            lp._paused -= 1
            lp._cv.notify_all()


__all__ = ["BatchStats", "BatcherLoop", "Grant"]
