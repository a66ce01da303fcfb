"""The K/V tensor pool and the paged attention views the model runs over.

One preallocated tensor per K and V: ``[num_layers, num_blocks * block_size, KVH, D]``. Writes go
through a slot mapping (one slot id per new valid token); reads gather each row's slot list — the
reference path that runs everywhere (CPU included). A paged-attention kernel on CUDA can replace
:meth:`PagedExtendView.attend_kv` without touching the model math (it only sees views).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model.kv import denoise_view, prefix_positions
from .block_pool import BlockPool


class KVPool:
    """Preallocated K/V storage for every VLM layer plus the :class:`BlockPool` bookkeeping."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        self.blocks = BlockPool(num_blocks, block_size)
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_layers = num_layers

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        """Bytes of K+V for one block over all layers."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def device(self) -> torch.device:
        """Device of the pool tensors."""
        return self.k.device

    def write(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """Store ``k``/``v`` ``[N, KVH, D]`` at ``slots`` ``[N]`` of ``layer``."""
        self.k[layer].index_copy_(0, slots, k.to(self.k.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.v.dtype))

    def gather(self, layer: int, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Read ``slots`` ``[B, L]`` of ``layer`` → K and V ``[B, L, KVH, D]``."""
        b, n = slots.shape
        flat = slots.reshape(-1)
        return (self.k[layer].index_select(0, flat).view(b, n, *self.k.shape[2:]),
                self.v[layer].index_select(0, flat).view(b, n, *self.v.shape[2:]))


def pad_slots(rows: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """Right-pad per-row slot lists with slot 0 → (``[B, L]`` int64 slots, ``[B]`` int64 lengths)."""
    lengths = [len(r) for r in rows]
    width = max(lengths) if lengths else 0
    out = torch.zeros(len(rows), max(width, 1), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out.to(device), torch.as_tensor(lengths, dtype=torch.long).to(device)


class PagedPrefillView:
    """Prefill of ``[B, P]`` packed prefix tokens into the pool (bidirectional over valid tokens).

    Args:
        pool: the K/V pool.
        valid: ``[B, P]`` bool, valid tokens first in each row.
        slots: per row, the slot ids for its valid tokens (``len == valid[b].sum()``).
    """

    def __init__(self, pool: KVPool, valid: Tensor, slots: list[list[int]]) -> None:
        self.pool = pool
        self.positions = prefix_positions(valid)
        b, p = valid.shape
        self.allowed = valid[:, None, :].expand(b, p, p)
        self._rows, self._cols = valid.nonzero(as_tuple=True)
        flat = [s for r in slots for s in r]
        if len(flat) != int(self._rows.numel()):
            raise ValueError(f"{len(flat)} slots given for {int(self._rows.numel())} valid prefix tokens")
        self._slots = torch.as_tensor(flat, dtype=torch.long, device=pool.device)

    def attend_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.pool.write(layer, self._slots, k[self._rows, self._cols], v[self._rows, self._cols])
        return k, v


class PagedExtendView:
    """Causal extension of ``B`` sequences by ``[B, T]`` tokens (text decode or prompt tokens).

    Args:
        pool: the K/V pool.
        past_slots: per row, slot ids of the already stored tokens (prefix then own tokens).
        new_slots: per row, slot ids claimed for its valid new tokens (``len == valid[b].sum()``).
        valid: ``[B, T]`` bool, valid tokens first.

    Positions continue the row's sequence: ``len(past_slots[b]) + i``.
    """

    def __init__(self, pool: KVPool, past_slots: list[list[int]], new_slots: list[list[int]], valid: Tensor) -> None:
        self.pool = pool
        dev = pool.device
        rows = [p + n for p, n in zip(past_slots, new_slots)]
        self._read, lengths = pad_slots(rows, dev)
        past = torch.as_tensor([len(p) for p in past_slots], dtype=torch.long, device=dev)
        valid = valid.to(dev)
        self.positions = past[:, None] + valid.long().cumsum(-1) - 1
        s = torch.arange(self._read.shape[1], device=dev)
        self.allowed = (s[None, None, :] <= self.positions[:, :, None]) & (s[None, None, :] < lengths[:, None, None])
        self.positions = self.positions.clamp_min(0)
        self._rows, self._cols = valid.nonzero(as_tuple=True)
        self._new = torch.as_tensor([s for r in new_slots for s in r], dtype=torch.long, device=dev)

    def attend_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.pool.write(layer, self._new, k[self._rows, self._cols], v[self._rows, self._cols])
        return self.pool.gather(layer, self._read)


def paged_denoise_view(pool: KVPool, prefix_slots: list[list[int]], horizon: int):
    """Action-expert view over prefixes stored in the pool (gathered once, then read-only).

    Args:
        prefix_slots: per row, the slot ids of its prefix tokens.
        horizon: ``H`` action tokens.
    """
    read, lengths = pad_slots(prefix_slots, pool.device)
    ks, vs = zip(*(pool.gather(layer, read) for layer in range(pool.num_layers)))
    return denoise_view(list(ks), list(vs), lengths, horizon)
