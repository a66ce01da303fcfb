"""Batched next-token sampling on the device: greedy, temperature and top-k per row.

Every row of a ``[B, V]`` logits batch is handled by ONE fixed kernel sequence (no per-row Python,
no host sync): temperature scaling, a per-row top-k threshold, the Gumbel-max trick for the draw
(``argmax(logits / T + G)`` with ``G ~ Gumbel(0, 1)`` samples ``softmax(logits / T)``, Gumbel 1954;
the form used by JAX's ``random.categorical``), greedy rows take ``argmax(logits)``. The only host
transfer is the ``[B]`` token ids (``-1`` marks a row whose distribution is not finite, so the
engine fails that request instead of crashing the batch).

Reproducibility without per-row generators: the Gumbel noise is counter-based — a stateless hash
of (row key, token index, vocabulary id), as in counter-based RNGs (Salmon et al., "Parallel random
numbers: as easy as 1, 2, 3", SC'11) — so a request's ``n``-th token depends only on its seed and
``n``, never on which batch, bucket or frame it ran in. The hash is Chris Wellons' ``lowbias32``
integer mixer, evaluated in int64 with 16-bit partial products so that nothing overflows on any
backend (CPU, CUDA, inductor). Requests without a seed get a key from the global torch RNG when
they are created. Logits-processor order follows transformers' ``generate``: temperature, top-k.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0
    seed: int | None = None

    def validate(self) -> SamplingParams:
        """Raise ``ValueError`` naming a bad field."""
        if not (self.temperature >= 0.0) or self.temperature != self.temperature or self.temperature == float("inf"):
            raise ValueError(f"temperature={self.temperature!r} must be a finite number >= 0")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be >= 0 (0 = no top-k)")
        return self

    def key(self) -> int:
        """The counter-based sampling key: the seed, or a fresh draw from the global torch RNG."""
        if self.seed is not None:
            return int(self.seed)
        return int(torch.randint(0, 2**62, (1,)).item())


def _mul32(x: Tensor, c: int) -> Tensor:
    """``(x * c) mod 2^32`` for ``x`` in [0, 2^32) int64 without any int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def mix32(x: Tensor) -> Tensor:
    """``lowbias32`` integer hash of int64 values in [0, 2^32) → [0, 2^32) (elementwise)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def gumbel_noise(keys: Tensor, counters: Tensor, vocab: int) -> Tensor:
    """Counter-based standard Gumbel noise ``[B, vocab]`` float32 from ``keys`` and ``counters``
    ``[B]`` int64 (any int64 key; the counter is the index of the token being sampled)."""
    k = keys & _M32
    k = mix32(k ^ mix32((keys >> 32) & _M32))
    k = mix32(k ^ mix32(counters & _M32))
    ids = torch.arange(vocab, device=keys.device, dtype=torch.int64)
    h = mix32(mix32(k[:, None] ^ ids[None, :]) ^ 0x9E3779B9)
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # (0, 1), 24 random bits
    return -torch.log(-torch.log(u))


def sample_batch(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    keys: Tensor,
    counters: Tensor,
    top_k_cap: int,
    greedy_only: bool = False,
) -> Tensor:
    """Sample one token per row on the logits' device.

    Args:
        logits: ``[B, V]`` float logits.
        temperature: ``[B]`` float32 (0 → greedy row).
        top_k: ``[B]`` int64 (0 → no top-k; must be <= ``top_k_cap``).
        keys, counters: ``[B]`` int64 sampling key and token index (see module doc).
        top_k_cap: static bound of ``top_k`` (``min(cap, V)`` values are ranked).
        greedy_only: every row is greedy (skips the sampling kernels; same result).

    Returns:
        ``[B]`` int64 token ids, ``-1`` where the row's distribution is not finite.
    """
    logits = logits.float()
    finite = torch.isfinite(logits).all(-1)
    greedy_ids = logits.argmax(-1)
    if greedy_only:
        return torch.where(finite, greedy_ids, torch.full_like(greedy_ids, -1))
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    kcap = max(1, min(int(top_k_cap), logits.shape[-1]))
    ranked = torch.topk(scaled, kcap, dim=-1).values
    kth = ranked.gather(1, (top_k - 1).clamp(0, kcap - 1)[:, None])
    keep = (top_k[:, None] <= 0) | (scaled >= kth)
    noisy = torch.where(
        keep, scaled + gumbel_noise(keys, counters, logits.shape[-1]), torch.full_like(scaled, float("-inf"))
    )
    drawn = noisy.argmax(-1)
    ok = finite & (greedy | torch.isfinite(scaled).all(-1))
    ids = torch.where(greedy, greedy_ids, drawn)
    return torch.where(ok, ids, torch.full_like(ids, -1))


def sample_rows(
    logits: Tensor, params: list[SamplingParams], keys: list[int], counters: list[int]
) -> tuple[list[int], list[bool]]:
    """List front end of :func:`sample_batch` (the single-request policy, tests).

    Returns:
        (token ids, ok flags) — ``ok[b]`` false when row ``b`` is not finite (id ``-1``).
    """
    dev = logits.device
    temps = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)
    tks = torch.tensor([p.top_k for p in params], dtype=torch.int64, device=dev)
    cap = max([p.top_k for p in params] + [1])
    ids = sample_batch(
        logits,
        temps,
        tks,
        torch.tensor(keys, dtype=torch.int64, device=dev),
        torch.tensor(counters, dtype=torch.int64, device=dev),
        cap,
        greedy_only=all(p.temperature == 0 for p in params),
    ).tolist()
    return ids, [i >= 0 for i in ids]
