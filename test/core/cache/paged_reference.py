"""Reference constructions the tests check the engine's paged K/V paths against (not used by the
engine): a packed multi-row prefill view into the pool, a denoise view gathered from slot lists,
and the FlexAttention block index built on the device from block tables (the engine builds it on
the host, :mod:`oxygen_ros.core.engine.step_buffers`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from oxygen_ros.core.cache.kv_pool import KVPool, KVTensors, pad_slots, to_device
from oxygen_ros.core.model.kv import ViewBase, denoise_view, prefix_positions


class PagedPrefillView(ViewBase):
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
        if int(self._rows.numel()) == b * p:
            self.allowed = None  # nothing to mask: no mask reaches the kernel
        flat = [s for r in slots for s in r]
        if len(flat) != int(self._rows.numel()):
            raise ValueError(f"{len(flat)} slots given for {int(self._rows.numel())} valid prefix tokens")
        self._slots = to_device(torch.as_tensor(flat, dtype=torch.long), pool.device)

    def attend_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.pool.write(layer, self._slots, k[self._rows, self._cols], v[self._rows, self._cols])
        return k, v


def paged_denoise_view(pool: KVPool, prefix_slots: list[list[int]] | list[Tensor], horizon: int):
    """Action-expert view over prefixes stored in the pool (gathered once, then read-only).

    Args:
        prefix_slots: per row, the slot ids of its prefix tokens (lists or 1-D int64 tensors).
        horizon: ``H`` action tokens.
    """
    read, lengths = pad_slots(prefix_slots, pool.device)
    ks, vs = zip(*(pool.gather(layer, read) for layer in range(pool.num_layers)))
    return denoise_view(list(ks), list(vs), lengths, horizon)


def flex_index(
    pool: KVTensors, tables: Tensor, num_blocks: Tensor, prefix_len: Tensor, aligned: Tensor, pos: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(kv_num, kv_idx, p2l, meta)`` of :func:`paged_block_mask` from ``[B, Wb]`` tables (tests
    and one-off callers; the engine builds them on the host)."""
    b, w = tables.shape
    total = pool.null_block + 1
    p2l = torch.full((b, total), -1, dtype=torch.int64, device=tables.device)
    p2l.scatter_(1, tables, torch.arange(w, device=tables.device).expand(b, w))
    p2l[:, pool.null_block] = -1
    idx = F.pad(tables, (0, total - w)).to(torch.int32)[:, None, None, :]
    meta = torch.stack([prefix_len, aligned, pos], 1).contiguous()
    return num_blocks.to(torch.int32)[:, None, None], idx, p2l, meta
