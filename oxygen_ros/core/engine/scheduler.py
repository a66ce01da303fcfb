"""Per-frame scheduling in plain Python (no torch): queue, admission control, decode budget.

Admission reserves every block a request can ever need (its prompt plus ``max_new_tokens``, and in
``isolated`` mode its private prefix copy) when it starts, so an in-flight request never runs out
of KV and is never evicted; and it always leaves room for the next frame's prefix, so the action
path never waits for blocks. No head-of-line waits (vLLM's scheduler is the reference for the
first rule; the aging is ours):

- a request that can never fit — more blocks than the pool holds beside the action path (the
  current frame's prefix and the next frame's reserve), or wider than the block table — is
  rejected with a reason: at submission when its budget alone is too large, else at its first
  admission attempt;
- one that cannot fit *now* stays queued and may be overtaken by later ones that fit; each
  overtake ages it, and after ``max_overtakes`` it holds the queue (nothing behind it starts)
  until running requests have freed enough blocks — so it is never starved;
- the queue is bounded in length (``max_queued_requests``) and age (``max_queue_wait_s``: older
  requests end as rejected, "expired").

The decode budget is a fixed ``k`` or, in adaptive mode, the number of steps that fit before the
frame deadline according to measured step costs (OxyGen §4 fixes k offline; adapting it is ours).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ..cache.block_pool import BlockPool
from ..config import EngineConfig
from .plan import FramePlan
from .requests import LanguageRequest, RequestStatus


# ------------------------------------------------------------------ admission (pure functions)
def never_fits_reason(need: int, capacity: int, pool_blocks: int, prefix: int, reserve: int, block_size: int) -> str:
    """Rejection text for a request needing ``need`` blocks where at most ``capacity`` fit."""
    return (
        f"request needs {need} KV blocks but at most {capacity} fit beside the action path "
        f"(pool {pool_blocks} blocks of {block_size} tokens, minus {prefix} for the frame prefix and "
        f"{reserve} for the next-frame reserve); raise kv_blocks / the memory budget or lower max_new_tokens"
    )


def admit(
    queue: deque[LanguageRequest],
    need: Callable[[LanguageRequest], int],
    *,
    free: int,
    reserve: int,
    slots: int,
    max_overtakes: int,
    never_fits: Callable[[LanguageRequest, int], str | None],
) -> tuple[list[LanguageRequest], list[LanguageRequest]]:
    """Pick the queued requests that start now; remove them (and the rejected) from ``queue``.

    Args:
        queue: waiting requests, oldest first (edited in place: what stays is still queued).
        need: blocks a request reserves at admission.
        free: free blocks now; reserve: blocks that must stay free (next frame's prefix).
        slots: how many more may run.
        max_overtakes: overtakes a non-fitting request tolerates before it holds the queue.
        never_fits: ``(request, need) -> reason`` if it can never run (too many blocks beside the
            action path, or wider than the block table), else ``None``.

    Returns:
        ``(admitted in queue order, rejected)``; rejected requests have status and reason set.
    """
    admitted: list[LanguageRequest] = []
    rejected: list[LanguageRequest] = []
    waiting: list[LanguageRequest] = []  # did not fit now, ahead of later ones
    held = False  # an aged request holds the queue
    keep: deque[LanguageRequest] = deque()
    for r in queue:
        n = need(r)
        reason = never_fits(r, n)
        if reason is not None:
            r.status, r.reason = RequestStatus.REJECTED, reason
            rejected.append(r)
            continue
        if held or len(admitted) >= slots:
            keep.append(r)
            continue
        if free - n >= reserve:
            free -= n
            admitted.append(r)
            for w in waiting:
                w.overtaken += 1
            continue
        keep.append(r)
        if r.overtaken >= max_overtakes:
            held = True
        else:
            waiting.append(r)
    queue.clear()
    queue.extend(keep)
    return admitted, rejected


def expire(queue: deque[LanguageRequest], now: float, max_wait_s: float) -> list[LanguageRequest]:
    """Remove requests queued longer than ``max_wait_s`` seconds (``now``: ``time.perf_counter``
    seconds); returns them with status REJECTED and an "expired" reason. ``max_wait_s <= 0``: none."""
    if max_wait_s <= 0:
        return []
    gone = [r for r in queue if now - r.t_submit > max_wait_s]
    for r in gone:
        queue.remove(r)
        r.status = RequestStatus.REJECTED
        r.reason = f"expired: waited {now - r.t_submit:.1f} s in the queue (engine.max_queue_wait_s = {max_wait_s:g})"
    return gone


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
    """Owner of the request queue and the running list: admission and decode-budget decisions.

    The live settings (queue bounds, decode budget, mode) come with each call as the frame's
    :class:`~oxygen_ros.core.config.EngineConfig`; the engine holds the one current config and
    swaps it in one place (``Engine.reconfigure``). Only this class edits :attr:`queue` and
    :attr:`running`; the request book asks it to (:meth:`remove`).

    Args:
        pool: the block pool admission reserves from.
        max_prefix_tokens: the longest frame prefix (its blocks are the next frame's reserve).
        max_running: the decode batch cap (``max_running_requests``, resolved by the engine).
    """

    def __init__(self, pool: BlockPool, max_prefix_tokens: int, max_running: int) -> None:
        self.pool = pool
        self.reserve = pool.blocks_for(max_prefix_tokens)
        self.max_running = max(1, int(max_running))
        self.queue: deque[LanguageRequest] = deque()
        self.running: list[LanguageRequest] = []
        self.costs = StepCostModel()

    def capacity(self, prefix_tokens: int) -> int:
        """The most blocks one request may hold beside a frame prefix of ``prefix_tokens`` and the
        next frame's reserve (the longest prefix)."""
        return self.pool.num_blocks - self.reserve - self.pool.blocks_for(prefix_tokens)

    @property
    def usable_blocks(self) -> int:
        """:meth:`capacity` beside the longest prefix (what always fits)."""
        return self.capacity(self.reserve * self.pool.block_size)

    def need_blocks(self, cfg: EngineConfig, r: LanguageRequest, prefix_tokens: int) -> int:
        """Blocks reserved for ``r`` at admission (own tokens; plus its prefix copy if isolated, or
        its own prefix — at most the frame's image tokens and its prompt — for an own-prefix task)."""
        own = self.pool.blocks_for(len(r.prompt_ids) + r.max_new_tokens)
        if r.prefix_ids:
            return self.pool.blocks_for(prefix_tokens + len(r.prefix_ids)) + own
        if cfg.mode == "isolated":
            return self.pool.blocks_for(prefix_tokens) + own
        return own

    def _never_fits(self, cfg: EngineConfig, r: LanguageRequest, need: int, prefix_tokens: int) -> str | None:
        """Why ``r`` (reserving ``need`` blocks) can never run beside a prefix of ``prefix_tokens``."""
        own = len(r.prompt_ids) + r.max_new_tokens
        if own > cfg.max_request_tokens:
            return (
                f"request needs {own} tokens (prompt + max_new_tokens) but "
                f"engine.max_request_tokens is {cfg.max_request_tokens}"
            )
        cap = self.capacity(prefix_tokens)
        if need > cap:
            return never_fits_reason(
                need, cap, self.pool.num_blocks, self.pool.blocks_for(prefix_tokens), self.reserve, self.pool.block_size
            )
        return None

    def submission_check(self, cfg: EngineConfig, r: LanguageRequest) -> str | None:
        """Reason to reject ``r`` at submission — its budget alone can never fit, even beside the
        shortest prefix (prompt and prefix are known at admission, which checks again) — else ``None``."""
        need = self.pool.blocks_for(len(r.prompt_ids) + r.max_new_tokens)
        if cfg.mode == "isolated":
            need += self.reserve
        return self._never_fits(cfg, r, need, 0)

    def enqueue(self, cfg: EngineConfig, r: LanguageRequest) -> str | None:
        """Queue a new request; returns a rejection reason if the queue is full."""
        if len(self.queue) >= cfg.max_queued_requests:
            return f"queue full ({cfg.max_queued_requests} requests waiting, engine.max_queued_requests)"
        self.queue.append(r)
        return None

    def remove(self, reqs: list[LanguageRequest]) -> None:
        """Take ``reqs`` out of the queue (those that are in it): they ended while waiting."""
        gone = {id(r) for r in reqs}
        kept = [r for r in self.queue if id(r) not in gone]
        if len(kept) != len(self.queue):
            self.queue = deque(kept)

    def expire(self, cfg: EngineConfig, now: float) -> list[LanguageRequest]:
        """Queued requests older than ``max_queue_wait_s`` (removed, status and reason set)."""
        return expire(self.queue, now, cfg.max_queue_wait_s)

    def admit(self, cfg: EngineConfig, prefix_tokens: int) -> tuple[list[LanguageRequest], list[LanguageRequest]]:
        """Decide which queued requests start now on a prefix of ``prefix_tokens`` tokens (see
        :func:`admit`: never-fits rejected, smaller ones may overtake, aging holds the queue);
        the admitted ones join :attr:`running`.

        Returns:
            (admitted in order, rejected).
        """
        running = sum(1 for r in self.running if not r.status.terminal)
        admitted, rejected = admit(
            self.queue,
            lambda r: self.need_blocks(cfg, r, prefix_tokens),
            free=self.pool.num_free,
            reserve=self.reserve,
            slots=max(0, self.max_running - running),
            max_overtakes=cfg.max_overtakes,
            never_fits=lambda r, n: self._never_fits(cfg, r, n, prefix_tokens),
        )
        self.running.extend(admitted)
        return admitted, rejected

    def plan_admission(
        self, cfg: EngineConfig, plan: FramePlan, prefix_tokens: int
    ) -> tuple[list[LanguageRequest], list[LanguageRequest]]:
        """:meth:`admit` recorded into ``plan`` (admitted / rejected ids)."""
        admitted, rejected = self.admit(cfg, prefix_tokens)
        plan.admitted += [r.id for r in admitted]
        plan.rejected += [r.id for r in rejected]
        return admitted, rejected

    def plan_decode(self, cfg: EngineConfig, plan: FramePlan, time_left_s: float | None) -> list[LanguageRequest]:
        """Fill ``plan.decoding`` / ``plan.decode_steps`` for the decode phase (``unified``: the
        budget of :meth:`decode_steps`; ``shared_kv``: until this frame's requests are done;
        ``isolated``: none — its requests finished at admission). Returns the batch."""
        batch = self.decode_batch()
        plan.decoding = [r.id for r in batch]
        mode = cfg.mode
        plan.decode_steps = (
            0 if mode == "isolated" else self.decode_steps(cfg, time_left_s) if mode == "unified" else 1 << 30
        )
        return batch

    def decode_batch(self) -> list[LanguageRequest]:
        """Running requests with a token to feed, in admission order (the decode batch)."""
        return [r for r in self.running if r.status == RequestStatus.RUNNING and r.pending >= 0]

    def decode_steps(self, cfg: EngineConfig, time_left_s: float | None) -> int:
        """Decode steps for this frame in ``unified`` mode.

        Fixed budget, or no deadline → ``tokens_per_frame``. Adaptive → as many measured step costs
        as fit in ``time_left_s``, clamped to [min_decode_steps, max_decode_steps]; before any
        measurement, ``max(min_decode_steps, 1)`` steps to learn the cost.
        """
        c = cfg
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


__all__ = ["Scheduler", "StepCostModel", "admit", "expire", "never_fits_reason"]
