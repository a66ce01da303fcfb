"""The K/V tensor pool and the paged attention views the model runs over.

One preallocated tensor per K and V: ``[num_layers, (num_blocks + 1) * block_size, KVH, D]`` (the
last block is the null block). Writes go
through a slot mapping (one slot id per new valid token); reads gather each row's slot list — the
reference path that runs everywhere (CPU included). The engine's per-step decode reads the pool
through block tables instead (:mod:`.paged`: FlexAttention, or the gather reference).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model.kv import ViewBase
from .block_pool import BlockPool


class KVTensors:
    """The K/V tensors of a pool, ``[num_layers, (num_blocks + 1) * block_size, KVH, D]`` each,
    with slot writes and gathers — everything an attention view needs (no bookkeeping), so a
    compiled step function can rebuild it from its tensor arguments."""

    def __init__(self, k: Tensor, v: Tensor, block_size: int) -> None:
        self.k, self.v = k, v
        self.block_size = block_size
        self.num_layers = k.shape[0]
        self.null_block = k.shape[1] // block_size - 1

    @property
    def null_slot(self) -> int:
        """First slot of the null block (a harmless write target for padding)."""
        return self.null_block * self.block_size

    @property
    def device(self) -> torch.device:
        """Device of the pool tensors."""
        return self.k.device

    def write(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """Store ``k``/``v`` ``[N, KVH, D]`` at ``slots`` ``[N]`` of ``layer``.

        One ``index_put_`` on the whole pool tensor (indices: layer, slot), never a write through
        the ``pool[layer]`` view: inside ``torch.compile`` a mutated *view* of a graph input is
        functionalised into a copy of the whole pool per write (≈ 0.5 s per step at the host-floor
        size), while an ``index_put_`` on the input itself is re-inplaced into a scatter of the
        ``N`` rows (measured with ``bench --host-floor``).
        """
        idx = (torch.full_like(slots, layer), slots)
        self.k.index_put_(idx, k.to(self.k.dtype))
        self.v.index_put_(idx, v.to(self.v.dtype))

    def gather(self, layer: int, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Read ``slots`` ``[B, L]`` of ``layer`` → K and V ``[B, L, KVH, D]``."""
        b, n = slots.shape
        flat = slots.reshape(-1)
        return (
            self.k[layer].index_select(0, flat).view(b, n, *self.k.shape[2:]),
            self.v[layer].index_select(0, flat).view(b, n, *self.v.shape[2:]),
        )


class KVPool(KVTensors):
    """Preallocated K/V storage for every VLM layer plus the :class:`BlockPool` bookkeeping.

    The tensors hold one block more than the bookkeeping: the *null block* (id ``num_blocks``,
    never handed out). Static-shape padding writes there (padded prefix tokens, padded decode
    rows) and padded block-table entries point there; nothing ever reads it unmasked.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.blocks = BlockPool(num_blocks, block_size)
        shape = (num_layers, (num_blocks + 1) * block_size, num_kv_heads, head_dim)
        super().__init__(
            torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device), block_size
        )

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes of K+V for one block over all layers."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """``t`` (a host tensor) on ``device`` without blocking the host.

    On CUDA the tensor is staged in page-locked memory from PyTorch's caching host allocator and
    copied with ``non_blocking=True``: a plain ``.to(cuda)`` of pageable memory waits for the
    stream to drain (a host sync per index tensor on the hot path). The allocator keeps the staging
    block until the copy has run, so the host may rewrite ``t`` at once. Elsewhere: ``t.to(device)``.
    Follows the PyTorch notes on pinned memory ("Use pinned memory buffers", CUDA semantics).
    """
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def pad_slots(rows: list[list[int]] | list[Tensor], device: torch.device) -> tuple[Tensor, Tensor]:
    """Right-pad per-row slot lists (or 1-D tensors) with slot 0 → (``[B, L]`` int64 slots,
    ``[B]`` int64 lengths)."""
    tensors = [r if isinstance(r, Tensor) else torch.as_tensor(r, dtype=torch.long) for r in rows]
    lengths = torch.as_tensor([t.numel() for t in tensors], dtype=torch.long)
    if not tensors or int(lengths.max()) == 0:
        return torch.zeros(len(tensors), 1, dtype=torch.long, device=device), to_device(lengths, device)
    out = torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True)
    return to_device(out, device), to_device(lengths, device)


class PagedExtendView(ViewBase):
    """Causal extension of ``B`` sequences by ``[B, T]`` tokens (text decode or prompt tokens).

    Args:
        pool: the K/V pool.
        read: ``[B, W]`` int64 slot ids of each row's tokens after this step (stored tokens, then
            the new ones), padded with any slot; ``W >= lengths.max()``.
        lengths: ``[B]`` tokens per row after this step; past: ``[B]`` tokens stored before it.
        new_slots: ``[N]`` slot ids of the valid new tokens, row-major (``N = valid.sum()``).
        valid: ``[B, T]`` bool, valid tokens first.

    Positions continue each row's sequence: ``past[b] + i``. Building it copies no K/V: the
    batch is only these index tensors (the engine keeps one slot row per request).
    """

    def __init__(
        self, pool: KVPool, read: Tensor, lengths: Tensor, past: Tensor, new_slots: Tensor, valid: Tensor
    ) -> None:
        self.pool = pool
        dev = pool.device
        rows, cols = valid.nonzero(as_tuple=True)  # on the host when valid is (no device sync)
        self._read = to_device(read, dev)
        lengths, past, valid = to_device(lengths, dev), to_device(past, dev), to_device(valid, dev)
        self.positions = past[:, None] + valid.long().cumsum(-1) - 1
        s = torch.arange(self._read.shape[1], device=dev)
        self.allowed = (s[None, None, :] <= self.positions[:, :, None]) & (s[None, None, :] < lengths[:, None, None])
        self.positions = self.positions.clamp_min(0)
        self._rows, self._cols = to_device(rows, dev), to_device(cols, dev)
        self._new = to_device(new_slots, dev)
        if self._new.numel() != self._rows.numel():
            raise ValueError(f"{self._new.numel()} new slots for {self._rows.numel()} valid new tokens")

    @classmethod
    def from_lists(
        cls, pool: KVPool, past_slots: list[list[int]], new_slots: list[list[int]], valid: Tensor
    ) -> PagedExtendView:
        """Build from per-row slot lists: ``past_slots[b]`` stored tokens, ``new_slots[b]`` slots
        claimed for its valid new tokens."""
        read, lengths = pad_slots([p + n for p, n in zip(past_slots, new_slots)], pool.device)
        past = torch.as_tensor([len(p) for p in past_slots], dtype=torch.long)
        new = torch.as_tensor([x for r in new_slots for x in r], dtype=torch.long)
        return cls(pool, read, lengths, past, new, valid)

    def attend_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.pool.write(layer, self._new, k[self._rows, self._cols], v[self._rows, self._cols])
        return self.pool.gather(layer, self._read)
