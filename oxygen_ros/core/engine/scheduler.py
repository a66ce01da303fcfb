"""Per-frame scheduling in plain Python (no torch): queue, admission control, decode budget.

Admission reserves every block a request can ever need (its prompt plus ``max_new_tokens``, and in
``isolated`` mode its private prefix copy) when it starts, so an in-flight request never runs out
of KV and is never evicted; and it always leaves room for the next frame's prefix, so the action
path never waits for blocks. A request that could never fit is rejected with a reason; one that
cannot fit yet waits in a bounded FIFO queue. The decode budget is a fixed ``k`` or, in adaptive
mode, the number of steps that fit before the frame deadline according to measured step costs
(OxyGen §4 fixes k offline; adapting it is ours).
"""

from __future__ import annotations

from collections import deque

from ..cache.block_pool import BlockPool
from ..config import EngineConfig
from .plan import FramePlan
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
    """Queue + admission + budget decisions for the engine (one instance per engine)."""

    def __init__(self, cfg: EngineConfig, pool: BlockPool, max_prefix_tokens: int) -> None:
        self.cfg = cfg
        self.pool = pool
        self.reserve = pool.blocks_for(max_prefix_tokens)
        self.queue: deque[LanguageRequest] = deque()
        self.running: list[LanguageRequest] = []
        self.costs = StepCostModel()

    @property
    def usable_blocks(self) -> int:
        """Blocks a request may ever hold (the next frame's prefix reserve excluded)."""
        return self.pool.num_blocks - self.reserve

    def need_blocks(self, r: LanguageRequest, prefix_tokens: int) -> int:
        """Blocks reserved for ``r`` at admission (own tokens; plus its prefix copy if isolated)."""
        own = self.pool.blocks_for(len(r.prompt_ids) + r.max_new_tokens)
        if self.cfg.mode == "isolated":
            return self.pool.blocks_for(prefix_tokens) + own
        return own

    def enqueue(self, r: LanguageRequest) -> str | None:
        """Queue a new request; returns a rejection reason if the queue is full."""
        if len(self.queue) >= self.cfg.max_queued_requests:
            return f"queue full ({self.cfg.max_queued_requests} requests waiting)"
        self.queue.append(r)
        return None

    def admit(self, prefix_tokens: int) -> tuple[list[LanguageRequest], list[LanguageRequest]]:
        """Decide which queued requests start now on a prefix of ``prefix_tokens`` tokens.

        FIFO: the first request that does not fit yet blocks the ones behind it (no starvation of
        long requests). Requests that can never fit are rejected (status and reason set here).

        Returns:
            (admitted in order, rejected).
        """
        admitted: list[LanguageRequest] = []
        rejected: list[LanguageRequest] = []
        free = self.pool.num_free
        while self.queue:
            r = self.queue[0]
            need = self.need_blocks(r, prefix_tokens)
            own = len(r.prompt_ids) + r.max_new_tokens
            if own > self.cfg.max_request_tokens:
                self.queue.popleft()
                r.status = RequestStatus.REJECTED
                r.reason = (f"request needs {own} tokens (prompt + max_new_tokens) but "
                            f"engine.max_request_tokens is {self.cfg.max_request_tokens}")
                rejected.append(r)
                continue
            if need > self.usable_blocks:
                self.queue.popleft()
                r.status = RequestStatus.REJECTED
                r.reason = (f"request needs {need} KV blocks but the pool has {self.usable_blocks} usable "
                            f"(of {self.pool.num_blocks}, block_size {self.pool.block_size}); "
                            f"raise kv_blocks or lower max_new_tokens")
                rejected.append(r)
                continue
            if len(self.running) + len(admitted) >= self.cfg.max_running_requests:
                break
            if free - need < self.reserve:
                break
            free -= need
            self.queue.popleft()
            admitted.append(r)
        return admitted, rejected

    def plan_admission(self, plan: FramePlan, prefix_tokens: int) -> tuple[list[LanguageRequest], list[LanguageRequest]]:
        """:meth:`admit` recorded into ``plan`` (admitted / rejected ids)."""
        admitted, rejected = self.admit(prefix_tokens)
        plan.admitted += [r.id for r in admitted]
        plan.rejected += [r.id for r in rejected]
        return admitted, rejected

    def plan_decode(self, plan: FramePlan, time_left_s: float | None) -> list[LanguageRequest]:
        """Fill ``plan.decoding`` / ``plan.decode_steps`` for the decode phase (``unified``: the
        budget of :meth:`decode_steps`; ``shared_kv``: until this frame's requests are done;
        ``isolated``: none — its requests finished at admission). Returns the batch."""
        batch = self.decode_batch()
        plan.decoding = [r.id for r in batch]
        mode = self.cfg.mode
        plan.decode_steps = (0 if mode == "isolated" else self.decode_steps(time_left_s) if mode == "unified"
                             else 1 << 30)
        return batch

    def decode_batch(self) -> list[LanguageRequest]:
        """Running requests with a token to feed, in admission order (the decode batch)."""
        return [r for r in self.running if r.status == RequestStatus.RUNNING and r.pending >= 0]

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
