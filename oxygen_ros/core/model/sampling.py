"""Next-token sampling: greedy, temperature and top-k, with a finite-distribution check.

A row whose logits contain NaN/inf cannot be sampled; it is reported (``ok`` false) instead of
crashing the batch, so the engine ends that request with an error status. Follows the usual
logits-processor order of transformers' ``generate`` (temperature, then top-k, then softmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0
    seed: int | None = None

    def validate(self) -> "SamplingParams":
        """Raise ``ValueError`` naming a bad field."""
        if not (self.temperature >= 0.0) or self.temperature != self.temperature or self.temperature == float("inf"):
            raise ValueError(f"temperature={self.temperature!r} must be a finite number >= 0")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be >= 0 (0 = no top-k)")
        return self


def sample_rows(logits: Tensor, params: list[SamplingParams],
                generators: list[torch.Generator | None]) -> tuple[list[int], list[bool]]:
    """Sample one token per row.

    Args:
        logits: ``[B, V]`` float32.
        params: per row sampling parameters.
        generators: per row RNG (used when temperature > 0; ``None`` → global RNG).

    Returns:
        (token ids, ok flags) — ``ok[b]`` is false when row ``b``'s distribution is not finite
        (its token id is then -1).
    """
    # One device->host transfer; a row's sum is non-finite iff the row holds a NaN/inf (finite
    # logits of any realistic size cannot overflow float32 when summed).
    greedy, finite = torch.stack((logits.argmax(-1), torch.isfinite(logits.sum(-1)).long())).tolist()
    out, ok = [], []
    for b, p in enumerate(params):
        if not finite[b]:
            out.append(-1)
            ok.append(False)
            continue
        if p.temperature == 0.0:
            out.append(int(greedy[b]))
            ok.append(True)
            continue
        row = logits[b].float() / p.temperature
        if p.top_k and p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, -1)
        if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
            out.append(-1)
            ok.append(False)
            continue
        out.append(int(torch.multinomial(probs.cpu(), 1, generator=generators[b]).item()))
        ok.append(True)
    return out, ok
