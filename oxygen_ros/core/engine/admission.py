"""Admission of queued language requests without head-of-line waits (plain Python, no torch).

Rules (vLLM's scheduler is the reference for the first; the aging is ours):
- a request that can never fit — its blocks exceed what the pool holds beside the action path
  (the current frame's prefix and the next frame's reserve) — is rejected with a reason, at
  submission when its budget alone is too large, at its first admission attempt otherwise;
- one that cannot fit *now* stays queued and may be overtaken by later requests that fit; each
  overtake ages it, and after ``max_overtakes`` it holds the queue (nothing behind it starts)
  until running requests have freed enough blocks for it — so it is never starved;
- the queue is bounded in length (``max_queued_requests``, checked at enqueue) and in age
  (``max_queue_wait_s``): a request waiting longer ends as rejected with the reason "expired".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .requests import LanguageRequest, RequestStatus


def never_fits_reason(need: int, capacity: int, pool_blocks: int, reserve: int, block_size: int) -> str:
    """Rejection text for a request needing ``need`` blocks where at most ``capacity`` fit."""
    return (f"request needs {need} KV blocks but at most {capacity} fit beside the action path "
            f"(pool {pool_blocks} blocks of {block_size} tokens, minus {2 * reserve} for the frame prefix "
            f"and the next-frame reserve); raise kv_blocks / the memory budget or lower max_new_tokens")


def admit(queue: deque[LanguageRequest], need: Callable[[LanguageRequest], int], *, free: int, reserve: int,
          capacity: int, slots: int, max_overtakes: int,
          reject_reason: Callable[[int], str]) -> tuple[list[LanguageRequest], list[LanguageRequest]]:
    """Pick the queued requests that start now; remove them (and the rejected) from ``queue``.

    Args:
        queue: waiting requests, oldest first (edited in place: what stays is still queued).
        need: blocks a request reserves at admission.
        free: free blocks now; reserve: blocks that must stay free (next frame's prefix).
        capacity: the most blocks one request can ever get; slots: how many more may run.
        max_overtakes: overtakes a non-fitting request tolerates before it holds the queue.
        reject_reason: reason text for a request needing ``n`` blocks that can never fit.

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
        if n > capacity:
            r.status, r.reason = RequestStatus.REJECTED, reject_reason(n)
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
        r.reason = (f"expired: waited {now - r.t_submit:.1f} s in the queue "
                    f"(engine.max_queue_wait_s = {max_wait_s:g})")
    return gone


__all__ = ["admit", "expire", "never_fits_reason"]
