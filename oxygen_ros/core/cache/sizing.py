"""KV pool sizing for a configured workload (plain arithmetic over blocks and bytes).

What the pool must hold at once (docs/architecture.md, 'The KV block pool'): the current frame's prefix, the reserve
for the next
frame's prefix (so the action path never waits for blocks), and every language request in flight
— each with its own frame's prefix (requests admitted in different frames do not share one) plus
its own prompt and token budget. The concurrent schedule holds one prefix more: the batcher still
owns the previous frame's prefix (its grant, not yet started) while the action loop prefills the
next one. How many requests are in flight follows from the arrival rate
and k: a request of N tokens decoded at k tokens per frame lives ``ceil(N / k)`` frames
(Little's law: in flight = arrival rate × lifetime; vLLM sizes its KV cache from a memory budget
the same way, ``gpu_memory_utilization`` × free memory).

:func:`plan_pool` takes the budget (bytes) and the workload, chooses the block count and says
what load it sustains; a budget that cannot hold one request beside the action path is a
:class:`PoolSizeError` that names the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..config import ConfigError, EngineConfig, ModelConfig
from .kv_pool import KVPool

PROMPT_ALLOWANCE = 64  # prompt tokens planned per request beside its max_new_tokens
CPU_KV_MEMORY_MB = 1024  # memory budget of the automatic pool on the CPU when kv_memory_mb is 0


class PoolSizeError(ValueError):
    """The pool cannot hold even one language request beside the action path."""


@dataclass(frozen=True)
class PoolPlan:
    """The chosen pool and the load it sustains.

    Attributes:
        blocks: pool size in blocks; bytes_per_block: K+V bytes of one block over all layers.
        prefix_blocks: blocks of the longest frame prefix (also the next-frame reserve).
        extra_prefixes: prefixes held beyond the serial schedule's (1 for ``concurrent``).
        request_blocks: blocks one longest request holds in flight (its frame's prefix + prompt
            allowance + token budget).
        in_flight: requests in flight the configured workload needs (0 for no language task).
        sustained: requests in flight this pool holds beside the action path.
        frames_per_request: frames one longest request lives at the configured k.
        source: where the size came from (``kv_blocks``, a MiB budget, the workload).
    """

    blocks: int
    bytes_per_block: int
    prefix_blocks: int
    request_blocks: int
    extra_prefixes: int
    in_flight: int
    sustained: int
    frames_per_request: int
    source: str

    @property
    def nbytes(self) -> int:
        """Pool bytes (K and V, all layers)."""
        return self.blocks * self.bytes_per_block

    @property
    def sustained_rate(self) -> float:
        """Requests per frame the pool sustains without the queue growing (longest requests)."""
        return self.sustained / max(self.frames_per_request, 1)

    def describe(self) -> str:
        """One line for the configure-time log."""
        extra = f" + {self.extra_prefixes} prefix(es) in the batcher's hand-over" if self.extra_prefixes else ""
        return (
            f"KV pool: {self.blocks} blocks ({self.nbytes / 2**20:.1f} MiB, {self.source}); "
            f"action path {(2 + self.extra_prefixes) * self.prefix_blocks} blocks (prefix + next-frame "
            f"reserve{extra}), "
            f"{self.request_blocks} blocks per request; holds {self.sustained} requests in flight "
            f"(workload needs {self.in_flight}), i.e. {self.sustained_rate:.2f} requests/frame of "
            f"{self.frames_per_request} frames each"
        )


def in_flight_requests(
    rate_per_frame: float, max_new_tokens: int, tokens_per_frame: int, cross_frame: bool
) -> tuple[int, int]:
    """Requests in flight at once and frames each lives.

    Args:
        rate_per_frame: arrivals per control frame (asked + periodic).
        max_new_tokens: the longest task budget N; tokens_per_frame: k (worst case for adaptive k).
        cross_frame: ``unified`` mode (requests span frames); otherwise each ends in its frame.

    Returns:
        ``(in_flight, frames_per_request)`` with ``in_flight = ceil(rate × frames) + 1`` (the
        request admitted this frame next to those still running); 0 in flight for no arrivals.
    """
    frames = math.ceil(max_new_tokens / max(tokens_per_frame, 1)) if cross_frame else 1
    if rate_per_frame <= 0:
        return 0, frames
    return math.ceil(rate_per_frame * frames - 1e-9) + 1, frames


def plan_pool(
    *,
    bytes_per_block: int,
    prefix_blocks: int,
    own_blocks: int,
    in_flight: int,
    frames_per_request: int,
    min_own_blocks: int = 0,
    kv_blocks: int = 0,
    budget_bytes: int = 0,
    budget_source: str = "",
    extra_prefixes: int = 0,
) -> PoolPlan:
    """Choose the pool size.

    ``n`` requests in flight, each on its own frame's prefix ``P`` with ``O`` own blocks, plus the
    next frame's reserve need ``P + n (P + O)`` blocks (the current frame's prefix is the newest
    request's). ``kv_blocks > 0`` is taken as given; otherwise that need for ``in_flight``
    requests, capped by ``budget_bytes``. ``extra_prefixes`` adds that many prefixes to the need
    and the minimum (the concurrent schedule's hand-over: 1).

    Args:
        bytes_per_block: K+V bytes of one block over all layers; prefix_blocks: P (longest
            prefix); own_blocks: O (longest prompt allowance + token budget; 0 → no language task);
            min_own_blocks: the least one request needs (its token budget alone; default O).

    Raises:
        PoolSizeError: the chosen size cannot hold the action path plus one request
            (``(2 + extra_prefixes) P + min_own_blocks``); the message names the blocks needed and available and the
            budget.
    """
    per_request = prefix_blocks + own_blocks if own_blocks else 0
    min_own = min_own_blocks or own_blocks
    held = (1 + extra_prefixes) * prefix_blocks  # next-frame reserve (+ the hand-over) beside the requests
    minimum = prefix_blocks + held + min_own
    need = held + max(in_flight, 1) * per_request if own_blocks else prefix_blocks + held
    if kv_blocks:
        blocks, source = kv_blocks, "engine.kv_blocks"
    else:
        fit = budget_bytes // bytes_per_block
        blocks = min(need, fit)
        source = f"sized for the workload within {budget_source}" if fit >= need else f"capped by {budget_source}"
    sustained = max(0, (blocks - held) // per_request) if per_request else 0
    if blocks < minimum:
        mib = bytes_per_block / 2**20
        raise PoolSizeError(
            f"KV pool of {blocks} blocks ({blocks * mib:.1f} MiB, {source}) cannot hold one language request "
            f"beside the action path: needs {minimum} blocks ({minimum * mib:.1f} MiB) = prefix {prefix_blocks} "
            f"+ next-frame reserve {prefix_blocks}"
            + (f" + batcher hand-over {extra_prefixes * prefix_blocks}" if extra_prefixes else "")
            + f" + {min_own} for the longest task's max_new_tokens; "
            "raise the memory budget or kv_blocks, or lower max_new_tokens"
        )
    return PoolPlan(
        blocks,
        bytes_per_block,
        prefix_blocks,
        per_request,
        extra_prefixes,
        in_flight,
        sustained,
        frames_per_request,
        source,
    )


def size_for(cfg: EngineConfig, model: ModelConfig, dtype: torch.dtype, device: torch.device) -> PoolPlan:
    """:func:`plan_pool` for an engine configuration over ``model``'s VLM K/V (``dtype`` on ``device``).

    Budget: ``kv_memory_mb`` if set, else ``kv_memory_fraction`` of free CUDA memory
    (``torch.cuda.mem_get_info``) or :data:`CPU_KV_MEMORY_MB` on the CPU. Workload: asked requests at
    ``requests_per_frame`` (if a task is asked) plus ``1 / every_n_frames`` per periodic task, each
    of the longest budget N plus :data:`PROMPT_ALLOWANCE` prompt tokens, living ``ceil(N / k)``
    frames (k = ``tokens_per_frame``; ``min_decode_steps`` for the adaptive budget). The
    ``concurrent`` schedule budgets one prefix more (the batcher's hand-over).

    Raises:
        ConfigError: the pool cannot hold one request beside the action path (numbers named).
    """
    bytes_per_block = KVPool.bytes_per_block(
        model.vlm.depth, cfg.block_size, model.vlm.num_kv_heads, model.vlm.head_dim, dtype
    )
    if cfg.kv_memory_mb:
        budget, src = int(cfg.kv_memory_mb * 2**20), f"engine.kv_memory_mb={cfg.kv_memory_mb:g}"
    elif device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        budget = int(free * cfg.kv_memory_fraction)
        src = f"engine.kv_memory_fraction={cfg.kv_memory_fraction:g} of {free / 2**20:.0f} MiB free"
    else:
        budget, src = CPU_KV_MEMORY_MB * 2**20, f"the CPU default of {CPU_KV_MEMORY_MB} MiB (engine.kv_memory_mb=0)"
    longest = max((t.max_new_tokens for t in cfg.tasks), default=0)
    asked = cfg.requests_per_frame if any(not t.every_n_frames for t in cfg.tasks) else 0.0
    rate = asked + sum(1.0 / t.every_n_frames for t in cfg.tasks if t.every_n_frames)
    k = cfg.tokens_per_frame if cfg.decode_budget == "fixed" else max(cfg.min_decode_steps, 1)
    in_flight, frames = in_flight_requests(rate, max(longest, 1), k, cfg.mode == "unified")

    def blocks_for(n: int) -> int:
        return -(-n // cfg.block_size)

    try:
        return plan_pool(
            bytes_per_block=bytes_per_block,
            prefix_blocks=blocks_for(model.max_prefix_len),
            own_blocks=blocks_for(PROMPT_ALLOWANCE + longest) if cfg.tasks else 0,
            min_own_blocks=blocks_for(longest),
            in_flight=in_flight,
            frames_per_request=frames,
            kv_blocks=cfg.kv_blocks,
            budget_bytes=budget,
            budget_source=src,
            extra_prefixes=int(cfg.schedule == "concurrent"),
        )
    except PoolSizeError as e:
        raise ConfigError(f"engine: {e}") from None


__all__ = [
    "CPU_KV_MEMORY_MB",
    "PROMPT_ALLOWANCE",
    "PoolPlan",
    "PoolSizeError",
    "in_flight_requests",
    "plan_pool",
    "size_for",
]
