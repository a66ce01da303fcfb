"""The concurrent schedule: the action loop in the caller's thread, the batcher loop beside it.

:meth:`ConcurrentEngine.step` is :meth:`Engine.step` — newest observation → prefill into fresh
blocks → denoise over the read-only prefix → chunk handed out (``on_action``), on the
high-priority action lane — with the frame's language half (a
:class:`~oxygen_ros.core.engine.language.LanguageFrame`) handed to the **batcher loop** (own
thread, decode lane) instead of run in place; the step returns without waiting for any language
work, and its result carries the text deltas and ended requests the batcher produced since the
previous step (docs/architecture.md, "Schedules").

Cross-lane lifetimes (rules in :mod:`oxygen_ros.core.engine.streams`): prefix blocks are reserved
before the action unit starts (so a wait for blocks never holds the action lane and a host fence
can always pass); the prefix-ready event is recorded right after prefill and the batcher's decode
stream waits for it on the device; ``last_hidden`` is handed over with ``record_stream``; the
frame's reference on its prefix moves to the batcher, which drops it through a fence of both lanes.
A frame on which nothing can start (no new, queued or periodic request, and no frame still pending)
releases its prefix itself. Host synchronisation happens only where a result reaches the host: the
chunk here, the sampled token ids in the batcher; stage times come from :class:`StageClock`.

Same observations, requests, cancels and seeds → the same chunks and the same token streams as
the serial :class:`~oxygen_ros.core.engine.engine.Engine` (tests/core/test_concurrent.py), as long
as admission is not limited by the pool (admission timing then differs, never correctness).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..cache.block_pool import BlockTable, PoolExhausted
from ..config import EngineConfig
from ..engine.engine import Engine
from ..engine.language import LanguageFrame, LanguageOutput
from ..engine.requests import FrameResult, LanguageRequest, RequestResult
from ..policy import Pi05Policy
from ..rtc.config import RTCConfig
from ..types import FrameMetrics
from .batcher import BatcherLoop


class ConcurrentEngine(Engine):
    """:class:`Engine` with the two-loop schedule (same inputs, outputs and invariants).

    Args:
        policy / cfg: as for :class:`Engine` (``cfg.batcher_policy`` picks ``frame`` or
            ``continuous``).
        intra_op_threads: on the CPU, torch intra-op threads of each loop (1: one core per loop
            on a 2-core machine; 0: the creating thread's torch setting). Applied to the thread
            that warms up or steps, and to the batcher thread: compiled graphs guard on the thread
            count, so warm-up and both loops must run with the same one.
        prefix_wait_s: how long the action loop waits for the batcher to free blocks for a prefix
            before the frame fails with :class:`PoolExhausted` (contained: the chunk is dropped).
        max_pending: grants the batcher may lag behind before the action loop waits for it
            (overload only: the frame policy owes every frame its k steps; counted in
            ``lag_waits``). A step without an observation has no action work and always waits
            until the batcher has caught up, so language-only stepping is paced by the batcher.
    """

    schedule = "concurrent"

    def __init__(
        self,
        policy: Pi05Policy,
        cfg: EngineConfig | None = None,
        intra_op_threads: int = 1,
        prefix_wait_s: float = 30.0,
        max_pending: int = 4,
        rtc: RTCConfig | None = None,
        **handover: Any,
    ) -> None:
        super().__init__(policy, cfg, rtc, **handover)
        self.streams.host_sync = False  # results reach the host; stage times come from events
        self.streams.wait_default()  # everything the parts allocated on the default stream
        self.threads = intra_op_threads if intra_op_threads > 0 else torch.get_num_threads()
        self.batcher = BatcherLoop(self.language, self.threads)
        self.prefix_wait_s = prefix_wait_s
        self.prefix_waits = 0
        self.max_pending = max_pending
        self.lag_waits = 0
        self._serial = False  # warm-up runs the language half in place (same stages and shapes, no thread)

    # ------------------------------------------------------------------ schedule hooks (the action loop)
    def _before_step(self) -> None:
        if not self._serial:
            self._pin_threads()
            self.batcher.start()

    def _language(self, frame: LanguageFrame) -> LanguageOutput:
        """Hand the frame's language half to the batcher; return what it finished since the last step.

        Raises:
            RuntimeError: the batcher thread died of a non-``Exception`` (its error is the cause).
        """
        if self._serial:
            return self.language.run(frame)
        self._wait_lag(frame.instruction is not None)
        self.batcher.submit(frame)
        return self.batcher.take()

    def _language_pending(self) -> int:
        return self.batcher.pending

    def _wait_lag(self, has_obs: bool) -> None:
        """A frame without an observation waits until the batcher caught up (nothing else to do);
        one with an observation only when the batcher lags ``max_pending`` frames (overload)."""
        limit = self.max_pending if has_obs else 1
        if self.batcher.pending >= limit:
            self.lag_waits += int(has_obs)
            while self.batcher.pending >= limit and self.batcher.alive:
                self.batcher.wait_progress(0.01)

    def _prefix_table(self, tokens: int) -> BlockTable:
        """Blocks for a prefix of ``tokens``, reserved outside any lane unit; waits for the batcher
        to release blocks if the pool is momentarily full (counted in ``prefix_waits``).

        Raises:
            PoolExhausted: no blocks within ``prefix_wait_s`` (contained by the step: the chunk is
                dropped with the reason, a ``frame`` fault).
        """
        blocks = self.pool.blocks
        need = blocks.blocks_for(tokens)
        deadline = time.perf_counter() + self.prefix_wait_s
        waited = False
        while True:
            blocks.reclaim(self.streams.is_done)
            with blocks.lock:
                if blocks.can_allocate(need):
                    table = BlockTable(blocks)
                    table.reserve(tokens)
                    self.prefix_waits += int(waited)
                    return table
            if time.perf_counter() > deadline:
                raise PoolExhausted(
                    f"no {need} free KV blocks for a frame prefix after {self.prefix_wait_s} s "
                    f"({blocks.num_free} free, {blocks.num_fenced} fenced of {blocks.num_blocks})"
                )
            waited = True
            self.batcher.wait_progress(0.002)

    # ------------------------------------------------------------------ control
    @property
    def busy(self) -> bool:
        """Whether the batcher still has granted work or outputs not yet returned by a step."""
        return self.batcher.pending > 0 or self.batcher.has_output

    def flush(self) -> FrameResult:
        """Wait until the batcher finished every handed-out frame; its outputs since the last step
        (``action=None``, ``frame_id`` = next frame). For tests, replays and shutdown."""
        with self.batcher.paused():
            pass
        out = self.batcher.take()
        m = FrameMetrics(
            frame_id=self.frame_id,
            blocks_total=self.pool.blocks.num_blocks,
            tokens_emitted=out.tokens,
            decode=out.decode,
            decode_steps=out.decode_steps,
            decode_batch=out.decode_batch,
            blocks_in_use=self.pool.blocks.num_in_use,
        )
        return FrameResult(
            self.frame_id, None, out.deltas, out.ended, m, None, out.plans[-1] if out.plans else None, self._absorb(out)
        )

    def warmup(self, frames: int = 1, cameras: list[int] | None = None) -> float:
        """:meth:`Engine.warmup` through the serial step, with the batcher paused: the same stages
        and shapes get compiled, and the persistent step buffers are never used by two threads.
        With a compiled CUDA engine the decode buckets are warmed once more in the batcher thread
        (CUDA graph trees are per thread). Returns the warm-up time in seconds."""
        self._pin_threads()
        with self.batcher.paused():
            self._serial = self.streams.host_sync = True
            try:
                super().warmup(frames, cameras)
            finally:
                self._serial = self.streams.host_sync = False
        if self.streams.cuda and self.cfg.compile != "none":  # CUDA graph trees are per thread
            t0 = time.perf_counter()
            self.batcher.start()
            self.batcher.call(self._warm_decode_here)
            self.runner.seal()
            self.warmup_s += time.perf_counter() - t0
        return self.warmup_s

    def _pin_threads(self) -> None:
        """CPU: the calling thread runs with the loops' intra-op thread count."""
        if not self.streams.cuda and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    def _warm_decode_here(self) -> None:
        with torch.inference_mode(), self.streams.decode(after=None):
            self.runner.warm_decode_buckets()
            torch.cuda.current_stream(self.streams.device).synchronize()

    def check_invariants(self) -> None:
        """:meth:`Engine.check_invariants` with the batcher paused (no grant pending, no step
        running), so every reference is held by a running request and every accepted request is
        not yet drained, in a grant, queued or running."""
        with self.batcher.paused():
            super().check_invariants()

    def _located(self) -> list[LanguageRequest]:
        return super()._located() + self.batcher.handed_out_requests()

    def cancel_all(self, reason: str = "cancelled") -> list[RequestResult]:
        """Finish the granted work, then cancel every request with ``reason``; returns the requests
        that ended since the last step (the batcher keeps running). The granted work's deltas are
        not returned: call :meth:`flush` first to keep them (as the node does on deactivation)."""
        ended = self.flush().ended
        return ended + super().cancel_all(reason)

    def close(self) -> list[RequestResult]:
        """Cancel every request (:meth:`cancel_all`), release all blocks, stop the batcher;
        returns the requests that ended since the last step."""
        ended = self.cancel_all()
        self.batcher.stop()
        return ended


__all__ = ["ConcurrentEngine"]
