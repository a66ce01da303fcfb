"""Decode-step attention over the pool through block tables: the gather reference and FlexAttention.

A decode row is a sequence ``[prefix ‖ own tokens]`` described by its block table (prefix blocks,
then its own blocks, padded with the pool's null block to a fixed width ``Wb``). Logical slot ``s``
of a row lives at physical slot ``table[s // bs] * bs + s % bs``. The prefix fills logical slots
``0 … n_p - 1``; the row's own tokens start at ``aligned = (#prefix blocks) * bs`` (the slots in
between are a masked hole, so a shared, half-filled last prefix block is never written). Token
``j`` of the row's own part has RoPE position ``n_p + j``.

* :class:`BlockTableGatherView` — the readable reference: expands the tables to slot rows and
  gathers every row's K/V (``[B, Wb * bs]`` per layer per step) for SDPA;
* :class:`BlockTableFlexView` — reads the pool in place with PyTorch FlexAttention
  (``torch.nn.attention.flex_attention``) and a *paged* block mask built from the tables
  (``BlockMask.from_kv_blocks``: each row visits only its own physical blocks; a ``mask_mod`` maps a
  physical slot back to its logical slot, as vLLM's FlexAttention backend does). No K/V is copied.
  It is a fused kernel only under ``torch.compile``; eager it runs PyTorch's unfused reference.

Both write the new token's K/V to the pool first and see exactly the same keys.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from ..model.kv import ViewBase
from .kv_pool import KVTensors


def logical_allowed(s: Tensor, prefix_len: Tensor, aligned: Tensor, pos: Tensor) -> Tensor:
    """Whether logical slot ``s`` is visible to a row's new token (broadcasting int64 tensors):
    a prefix slot, or one of the row's own tokens up to and including the new one."""
    return (s < prefix_len) | ((s >= aligned) & (s - aligned + prefix_len <= pos))


class _BlockTableView(ViewBase):
    """Common part: positions and the new token's physical slot (one new token per row)."""

    def __init__(self, pool: KVTensors, tables: Tensor, prefix_len: Tensor, aligned: Tensor, pos: Tensor) -> None:
        self.pool = pool
        self.bs = pool.block_size
        self.tables, self.prefix_len, self.aligned, self.pos = tables, prefix_len, aligned, pos
        self.positions = pos[:, None]
        own = aligned + pos - prefix_len  # logical slot of the new token
        blk = tables.gather(1, (own // self.bs)[:, None])[:, 0]
        self.new_slots = blk * self.bs + own % self.bs

    def _write(self, layer: int, k: Tensor, v: Tensor) -> None:
        self.pool.write(layer, self.new_slots, k[:, 0], v[:, 0])


class BlockTableGatherView(_BlockTableView):
    """Reference decode view: gathers each row's ``Wb * bs`` slots per layer (see module doc).

    Args:
        pool: the K/V pool. tables: ``[B, Wb]`` int64 physical block ids (null-block padded).
        prefix_len, aligned, pos: ``[B]`` int64 — prefix tokens, first own logical slot, and the
            RoPE position of the new token (= tokens stored before it).
    """

    def __init__(self, pool: KVTensors, tables: Tensor, prefix_len: Tensor, aligned: Tensor, pos: Tensor) -> None:
        super().__init__(pool, tables, prefix_len, aligned, pos)
        b, w = tables.shape
        offs = torch.arange(self.bs, device=tables.device)
        self._read = (tables[:, :, None] * self.bs + offs).reshape(b, w * self.bs)
        s = torch.arange(w * self.bs, device=tables.device)[None, :]
        self.allowed = logical_allowed(s, prefix_len[:, None], aligned[:, None], pos[:, None])[:, None, :]

    def attend_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self._write(layer, k, v)
        return self.pool.gather(layer, self._read)


def paged_block_mask(block_size: int, kv_num: Tensor, kv_idx: Tensor, p2l: Tensor, meta: Tensor) -> BlockMask:
    """FlexAttention block mask of one decode step over the whole pool (KV length = pool slots).

    Args:
        kv_num: ``[B, 1, 1]`` int32 table entries in use per row; kv_idx: ``[B, 1, 1, NB]`` int32
            physical blocks in logical order (``NB`` = all pool blocks incl. the null block);
        p2l: ``[B, NB]`` int64 physical → logical block of each row (``-1``: not the row's).
        meta: ``[B, 3]`` int64 contiguous ``(prefix_len, aligned, pos)`` per row (module doc).

    Row ``b`` visits only its own blocks; ``mask_mod`` maps a physical slot to the row's logical
    slot and applies :func:`logical_allowed`. The index tensors are step inputs built on the host
    (:class:`~oxygen_ros.core.engine.step_buffers.StepBuffers`), so a compiled step sees them as
    realised buffers.
    """
    bs = block_size

    def mask_mod(bi: Tensor, hi: Tensor, qi: Tensor, kv: Tensor) -> Tensor:
        lb = p2l[bi, kv // bs]
        s = lb * bs + kv % bs
        return (lb >= 0) & logical_allowed(s, meta[bi, 0], meta[bi, 1], meta[bi, 2])

    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        BLOCK_SIZE=(1, bs),
        mask_mod=mask_mod,
        seq_lengths=(1, kv_idx.shape[-1] * bs),
        compute_q_blocks=False,
    )


class BlockTableFlexView(_BlockTableView):
    """Paged decode view: FlexAttention reads the pool in place (no per-step K/V gather).

    Args: as :class:`BlockTableGatherView`, plus ``index`` = ``(kv_num, kv_idx, p2l, meta)`` of
    :func:`paged_block_mask` (a padded batch row has ``kv_num`` 0: it attends nothing, outputs 0).
    """

    def __init__(
        self,
        pool: KVTensors,
        tables: Tensor,
        index: tuple[Tensor, ...],
        prefix_len: Tensor,
        aligned: Tensor,
        pos: Tensor,
    ) -> None:
        super().__init__(pool, tables, prefix_len, aligned, pos)
        self.allowed = None
        self.block_mask = paged_block_mask(pool.block_size, *index)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        self._write(layer, k, v)
        b = q.shape[0]
        kp = self.pool.k[layer].permute(1, 0, 2)[None].expand(b, -1, -1, -1)  # [B, KVH, slots, D] view
        vp = self.pool.v[layer].permute(1, 0, 2)[None].expand(b, -1, -1, -1)
        out = flex_attention(
            q.transpose(1, 2).to(kp.dtype).contiguous(),
            kp,
            vp,
            block_mask=self.block_mask,
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(1, 2).to(q.dtype)
