"""Attention views: how one forward reads and writes K/V, independent of where K/V are stored.

The model math (``gemma.py``) only ever calls ``view.attend_kv(layer, k, v)`` and reads
``view.positions`` / ``view.allowed``. A view decides where the new tokens' K/V go and which keys
each query may see. Storage backends provide views:

* :class:`DenseKVCache` here — contiguous per-row buffers, used by the single-request reference
  (:class:`~oxygen_ros.core.policy.Pi05Policy`) and the tests;
* the paged block pool of :mod:`oxygen_ros.core.cache` — the engine.

Cache layout convention (shared by both): a sequence's K/V slot ``i`` holds the token at RoPE
position ``i``. Prefixes are stored compacted (only valid tokens), so positions count valid tokens
only, as in openpi (``cumsum(mask) - 1``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

# Additive mask value used by openpi / big_vision; finite in fp32 and bf16 (no NaN on empty rows).
MASK_VALUE = -2.3819763e38


class AttentionView(Protocol):
    """What the model needs from storage for one forward over ``[B, T]`` new tokens.

    Attributes:
        positions: ``[B, T]`` int64 RoPE positions of the new tokens.
        allowed: ``[B, T, S]`` bool — query ``t`` may attend key ``s`` of ``attend_kv``'s output —
            or ``None`` when nothing is masked (no mask is passed to the kernel then).
    """

    positions: Tensor
    allowed: Tensor | None

    def rope(self, rotary: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], x: Tensor) -> tuple[Tensor, Tensor]:
        """cos/sin of ``positions`` (computed once per view, reused by every layer and step)."""
        ...

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        """Store the new tokens' K/V if this view writes and attend: q ``[B, T, H, D]``, k/v
        ``[B, T, KVH, D]`` → ``[B, T, H, D]``."""
        ...


class ViewBase:
    """Shared view behaviour: cached rotary tables and additive mask, SDPA over ``attend_kv``.

    Subclasses set ``positions`` / ``allowed`` and implement ``attend_kv(layer, k, v)`` returning
    the keys/values ``[B, S, KVH, D]`` the queries attend over.
    """

    positions: Tensor
    allowed: Tensor | None
    _rope: tuple[Tensor, Tensor] | None = None
    _mask: Tensor | None = None

    def rope(self, rotary: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], x: Tensor) -> tuple[Tensor, Tensor]:
        if self._rope is None:
            self._rope = rotary(x, self.positions)
        return self._rope

    def additive_mask(self, dtype: torch.dtype) -> Tensor | None:
        """``[B, 1, T, S]`` additive float mask of ``allowed`` (``None`` when unmasked), cached."""
        if self.allowed is None:
            return None
        if self._mask is None or self._mask.dtype != dtype:
            zero = torch.zeros((), dtype=dtype, device=self.allowed.device)
            neg = torch.full((), MASK_VALUE, dtype=dtype, device=self.allowed.device)
            self._mask = torch.where(self.allowed, zero, neg)[:, None]
        return self._mask

    def attend_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:  # pragma: no cover
        """Abstract: store this step's ``k``/``v`` (``[B, T, H_kv, D]``) where the view keeps them and
        return the ``[B, S, H_kv, D]`` keys/values the queries attend to. Every concrete view
        (contiguous cache, paged pool, denoise scratch) overrides it."""
        raise NotImplementedError(f"{type(self).__name__} must implement attend_kv")

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        k_all, v_all = self.attend_kv(layer, k, v)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k_all.transpose(1, 2),
            v_all.transpose(1, 2),
            attn_mask=self.additive_mask(q.dtype),
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(1, 2)


class SelfView(ViewBase):
    """No storage: the new tokens attend only to each other (uncached reference forwards)."""

    def __init__(self, positions: Tensor, allowed: Tensor | None) -> None:
        self.positions = positions
        self.allowed = allowed

    def attend_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return k, v


def prefix_positions(valid: Tensor) -> Tensor:
    """Positions of a prefix: ``cumsum(valid) - 1`` clamped at 0 (``[B, P]`` bool → int64)."""
    return (valid.long().cumsum(-1) - 1).clamp_min(0)


class _WriteView(ViewBase):
    """Writes the valid new tokens at ``positions`` of a dense buffer, returns the buffer prefix."""

    def __init__(
        self, cache: DenseKVCache, valid: Tensor, positions: Tensor, allowed: Tensor, read_len: int, return_new: bool
    ) -> None:
        self.cache = cache
        self.positions = positions
        self.allowed = allowed
        self._rows, self._cols = valid.nonzero(as_tuple=True)
        self._dst = positions[self._rows, self._cols]
        self._read_len = read_len
        self._return_new = return_new

    def attend_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        ck, cv = self.cache.k[layer], self.cache.v[layer]
        ck[self._rows, self._dst] = k[self._rows, self._cols]
        cv[self._rows, self._dst] = v[self._rows, self._cols]
        if self._return_new:
            return k, v
        return ck[:, : self._read_len], cv[:, : self._read_len]


class DenoiseView(ViewBase):
    """Action-expert view: read-only prefix plus the suffix slots of one scratch buffer.

    ``k``/``v`` are ``[L, B, P + H, KVH, D]`` scratch holding the prefix K/V in ``[0, P)`` (copied
    once per frame, see :func:`denoise_scratch`); every denoise step overwrites only the last
    ``H`` slots. The cache itself is never written. Build it once per frame and reuse it for all
    S steps: positions, rotary tables and the mask are computed once.
    """

    def __init__(self, k: Tensor, v: Tensor, lengths: Tensor, horizon: int, padded: bool = True) -> None:
        self._k, self._v = k, v
        b, total = k.shape[1], k.shape[2]
        p = total - horizon
        self._p = p
        device = lengths.device
        self.positions = lengths[:, None] + torch.arange(horizon, device=device)[None, :]
        s = torch.arange(total, device=device)
        keys = (s[None, :] < lengths[:, None]) | (s[None, :] >= p)
        self.allowed = keys[:, None, :].expand(b, horizon, total) if padded else None

    def attend_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self._k[layer, :, self._p :] = k
        self._v[layer, :, self._p :] = v
        return self._k[layer], self._v[layer]

    def for_grad(self) -> DenoiseView:
        """A copy that autograd can differentiate through (RTC's vector–Jacobian form): normal
        tensors even when this view was built under ``inference_mode``, and the step's K/V
        concatenated to the prefix instead of written into the shared scratch in place."""
        with torch.inference_mode(False):
            view = _GradDenoiseView.__new__(_GradDenoiseView)
            view._k, view._v = self._k[:, :, : self._p].clone(), self._v[:, :, : self._p].clone()
            view._p, view.positions = self._p, self.positions.clone()
            view.allowed = None if self.allowed is None else self.allowed.clone()
        return view


class _GradDenoiseView(DenoiseView):
    """:meth:`DenoiseView.for_grad`: the prefix K/V ``[L, B, P, KVH, D]`` read-only, no in-place writes."""

    def attend_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return torch.cat([self._k[layer], k], dim=1), torch.cat([self._v[layer], v], dim=1)


def denoise_scratch(
    prefix_k: list[Tensor] | Tensor, prefix_v: list[Tensor] | Tensor, horizon: int
) -> tuple[Tensor, Tensor]:
    """``[L, B, P + H, KVH, D]`` K and V scratch with the prefix (per layer ``[B, P, KVH, D]``)
    copied into ``[0, P)`` — the one copy of the prefix per frame."""
    b, p = prefix_k[0].shape[:2]
    tail = prefix_k[0].shape[2:]
    n = len(prefix_k)
    k = prefix_k[0].new_empty((n, b, p + horizon, *tail))
    v = prefix_v[0].new_empty((n, b, p + horizon, *tail))
    for i in range(n):
        k[i, :, :p] = prefix_k[i]
        v[i, :, :p] = prefix_v[i]
    return k, v


def denoise_view(
    prefix_k: list[Tensor], prefix_v: list[Tensor], lengths: Tensor, horizon: int, padded: bool = True
) -> DenoiseView:
    """Build the action expert's view over gathered prefix K/V.

    Args:
        prefix_k, prefix_v: per layer ``[B, P, KVH, D]``; row ``b`` valid in ``[0, lengths[b])``.
        lengths: ``[B]`` int64 valid prefix length per row.
        horizon: action chunk length ``H`` (suffix tokens).
        padded: some row is shorter than ``P`` (a key mask is needed); ``False`` when the caller
            knows every row fills ``P`` (no mask is passed then).
    """
    k, v = denoise_scratch(prefix_k, prefix_v, horizon)
    return DenoiseView(k, v, lengths, horizon, padded)


class DenseKVCache:
    """Contiguous K/V for ``B`` sequences: ``k[layer]`` is ``[B, capacity, KVH, D]``.

    Used by the single-request reference path; the engine uses the paged pool instead.
    ``lengths[b]`` is the number of stored tokens of row ``b``.
    """

    def __init__(
        self,
        num_layers: int,
        batch: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (batch, capacity, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.capacity = capacity

    def _check_room(self, new_lengths: Tensor) -> None:
        if int(new_lengths.max()) > self.capacity:
            raise RuntimeError(f"DenseKVCache overflow: need {int(new_lengths.max())} slots, capacity {self.capacity}")

    def prefill_view(self, valid: Tensor) -> _WriteView:
        """View for a prefix prefill over ``[B, P]`` tokens (``valid`` bool): bidirectional among
        valid tokens; valid tokens stored compacted at slots ``0..n_b-1``."""
        if int(self.lengths.max()) != 0:
            raise RuntimeError("prefill_view needs an empty cache")
        positions = prefix_positions(valid)
        new_lengths = valid.long().sum(-1)
        self._check_room(new_lengths)
        allowed = valid[:, None, :].expand(valid.shape[0], valid.shape[1], valid.shape[1])
        view = _WriteView(self, valid, positions, allowed, 0, return_new=True)
        self.lengths = new_lengths
        return view

    def extend_view(self, valid: Tensor) -> _WriteView:
        """View for appending ``[B, T]`` tokens causally (text decode / prompt extension).

        Query ``t`` of row ``b`` sees stored tokens and new tokens up to itself.
        """
        positions = self.lengths[:, None] + valid.long().cumsum(-1) - 1
        new_lengths = self.lengths + valid.long().sum(-1)
        self._check_room(new_lengths)
        read_len = int(new_lengths.max())
        s = torch.arange(read_len, device=valid.device)
        allowed = (s[None, None, :] <= positions[:, :, None]) & (s[None, None, :] < new_lengths[:, None, None])
        view = _WriteView(self, valid, positions.clamp_min(0), allowed, read_len, return_new=False)
        self.lengths = new_lengths
        return view

    def denoise_view(self, horizon: int) -> DenoiseView:
        """Read-only view of the stored prefix for ``horizon`` action tokens."""
        p = int(self.lengths.max())
        return denoise_view([k[:, :p] for k in self.k], [v[:, :p] for v in self.v], self.lengths, horizon)
