"""Per-frame scheduling in plain Python (no torch): queue, admission control, decode budget.

Admission reserves every block a request can ever need (its prompt plus ``max_new_tokens``, and in
``isolated`` mode its private prefix copy) when it starts, so an in-flight request never runs out
of KV and is never evicted; and it always leaves room for the next frame's prefix, so the action
path never waits for blocks. A request that could never fit is rejected with a reason; one that
cannot fit yet waits in a bounded queue and may be overtaken, with aging (:mod:`.admission`). The decode budget is a fixed ``k`` or, in adaptive
mode, the number of steps that fit before the frame deadline according to measured step costs
(OxyGen §4 fixes k offline; adapting it is ours).
"""

from __future__ import annotations

from collections import deque

from ..cache.block_pool import BlockPool
from ..config import EngineConfig
from .admission import admit, expire, never_fits_reason
from .requests import LanguageRequest, RequestStatus


class StepCostModel:
    """Exponential moving average of one decode step's wall time per batch size (seconds)."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self._ema: dict[int, float] = {}

    def update(self, batch: int, seconds: float) -> None:
        """Record one measured step."""
        old = self._ema.get(batch)
        self._ema[batch] = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds

    def estimate(self, batch: int) -> float | None:
        """Expected step time at ``batch`` (the closest larger measured batch, else linear from the
        largest smaller one); ``None`` before any measurement."""
        if not self._ema:
            return None
        if batch in self._ema:
            return self._ema[batch]
        larger = [b for b in self._ema if b > batch]
        if larger:
            return self._ema[min(larger)]
        b0 = max(self._ema)
        return self._ema[b0] * batch / b0


class Scheduler:
    """Queue + admission + budget decisions for the engine (one instance per engine).

    ``max_running`` is the decode batch cap (``cfg.max_running_requests``, or the engine's
    workload-derived figure when that is 0).
    """

    def __init__(self, cfg: EngineConfig, pool: BlockPool, max_prefix_tokens: int,
                 max_running: int | None = None) -> None:
        self.cfg = cfg
        self.pool = pool
        self.reserve = pool.blocks_for(max_prefix_tokens)
        self.max_running = max_running or cfg.max_running_requests or 1
        self.queue: deque[LanguageRequest] = deque()
        self.running: list[LanguageRequest] = []
        self.costs = StepCostModel()

    @property
    def usable_blocks(self) -> int:
        """The most blocks one request may ever hold: the pool minus the current frame's prefix
        and the next frame's reserve (both at the longest prefix)."""
        return self.pool.num_blocks - 2 * self.reserve

    def need_blocks(self, r: LanguageRequest, prefix_tokens: int) -> int:
        """Blocks reserved for ``r`` at admission (own tokens; plus its prefix copy if isolated)."""
        own = self.pool.blocks_for(len(r.prompt_ids) + r.max_new_tokens)
        if self.cfg.mode == "isolated":
            return self.pool.blocks_for(prefix_tokens) + own
        return own

    def _reason(self, need: int) -> str:
        return never_fits_reason(need, self.usable_blocks, self.pool.num_blocks, self.reserve, self.pool.block_size)

    def submission_check(self, r: LanguageRequest) -> str | None:
        """Reason to reject ``r`` at submission — its budget alone (prompt not yet known, longest
        prefix assumed) can never fit — else ``None``."""
        need = self.pool.blocks_for(r.max_new_tokens)
        if self.cfg.mode == "isolated":
            need += self.reserve
        return self._reason(need) if need > self.usable_blocks else None

    def enqueue(self, r: LanguageRequest) -> str | None:
        """Queue a new request; returns a rejection reason if the queue is full."""
        if len(self.queue) >= self.cfg.max_queued_requests:
            return f"queue full ({self.cfg.max_queued_requests} requests waiting, engine.max_queued_requests)"
        self.queue.append(r)
        return None

    def expire(self, now: float) -> list[LanguageRequest]:
        """Queued requests older than ``max_queue_wait_s`` (removed, status and reason set)."""
        return expire(self.queue, now, self.cfg.max_queue_wait_s)

    def admit(self, prefix_tokens: int) -> tuple[list[LanguageRequest], list[LanguageRequest]]:
        """Decide which queued requests start now on a prefix of ``prefix_tokens`` tokens (see
        :mod:`.admission`: never-fits rejected, smaller ones may overtake, aging holds the queue).

        Returns:
            (admitted in order, rejected).
        """
        running = sum(1 for r in self.running if not r.status.terminal)
        return admit(self.queue, lambda r: self.need_blocks(r, prefix_tokens), free=self.pool.num_free,
                     reserve=self.reserve, capacity=self.usable_blocks, slots=max(0, self.max_running - running),
                     max_overtakes=self.cfg.max_overtakes, reject_reason=self._reason)

    def decode_steps(self, time_left_s: float | None) -> int:
        """Decode steps for this frame in ``unified`` mode.

        Fixed budget, or no deadline → ``tokens_per_frame``. Adaptive → as many measured step costs
        as fit in ``time_left_s``, clamped to [min_decode_steps, max_decode_steps]; before any
        measurement, ``max(min_decode_steps, 1)`` steps to learn the cost.
        """
        c = self.cfg
        if c.decode_budget == "fixed" or c.frame_deadline_s <= 0 or time_left_s is None:
            return c.tokens_per_frame
        batch = sum(1 for r in self.running if not r.status.terminal)
        est = self.costs.estimate(max(batch, 1))
        if est is None or est <= 0:
            return max(c.min_decode_steps, 1)
        n = int(max(time_left_s, 0.0) // est)
        return max(c.min_decode_steps, min(c.max_decode_steps, n))

    def drop_terminal(self) -> None:
        """Forget running requests that have ended."""
        self.running = [r for r in self.running if not r.status.terminal]
