"""The one place that builds a decode step's tensors, in persistent (pinned) buffers.

Each step packs every row's integers (token id, block table, prefix length, aligned start,
position, top-k, sampling key and counter) into ONE preallocated host tensor — pinned on CUDA —
and copies it to ONE preallocated device tensor with a single non-blocking transfer; temperatures
travel the same way. With static shapes the batch is padded to a bucket (1, 2, 4, 8, … up to
``max_batch``) with rows that attend nothing and write only the null block, and the block table
has a fixed width, so a compiled / captured step sees the same shapes every time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .frame import RequestState
from .requests import LanguageRequest

# column layout of the packed integer buffer (the block table follows)
_ID, _NBLK, _PLEN, _ALIGN, _POS, _TOPK, _KEY, _CTR, _FIXED = range(9)


def batch_buckets(max_batch: int) -> list[int]:
    """Decode batch-size buckets: powers of two below ``max_batch``, then ``max_batch``."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


@dataclass
class DecodeBatch:
    """Device tensors of one decode step (``B`` = bucket rows, the first ``rows`` real).

    ids ``[B, 1]``; tables ``[B, Wb]``; num_blocks, prefix_len, aligned, pos, top_k, keys,
    counters ``[B]`` int64; temperature ``[B]`` float32. ``greedy_only``: every real row greedy.
    """

    rows: int
    ids: Tensor
    tables: Tensor
    num_blocks: Tensor
    prefix_len: Tensor
    aligned: Tensor
    pos: Tensor
    top_k: Tensor
    keys: Tensor
    counters: Tensor
    temperature: Tensor
    greedy_only: bool
    kv_num: Tensor | None = None
    kv_idx: Tensor | None = None
    p2l: Tensor | None = None
    meta: Tensor | None = None

    @property
    def size(self) -> int:
        """Padded batch size (the bucket)."""
        return int(self.ids.shape[0])

    def tensors(self) -> tuple[Tensor | None, ...]:
        """The step's tensors in the order the step function takes them (the four FlexAttention
        inputs are ``None`` when the buffers are not ``flex``)."""
        return (
            self.ids,
            self.tables,
            self.num_blocks,
            self.prefix_len,
            self.aligned,
            self.pos,
            self.temperature,
            self.top_k,
            self.keys,
            self.counters,
            self.kv_num,
            self.kv_idx,
            self.p2l,
            self.meta,
        )


class StepBuffers:
    """Persistent host/device buffers for decode steps of up to ``max_batch`` rows.

    Args:
        max_batch: largest decode batch (the engine's ``max_running_requests``).
        width_blocks: fixed block-table width ``Wb`` (longest sequence in blocks).
        null_block: the pool's null block id (padding of tables and rows).
        device: where the step runs. static: pad to buckets and ``Wb`` (else exact shapes).
        flex: also build the FlexAttention paged-mask inputs over all ``null_block + 1`` pool blocks
            (``kv_num`` ``[B, 1, 1]`` and ``kv_idx`` ``[B, 1, 1, NB + 1]`` int32, physical → logical
            block map ``p2l`` ``[B, NB + 1]`` int64; rebuilt only when the batch changes — block
            tables are fixed at admission).
    """

    def __init__(
        self,
        max_batch: int,
        width_blocks: int,
        null_block: int,
        device: torch.device,
        static: bool = True,
        flex: bool = False,
    ) -> None:
        self.static = static
        self.buckets = batch_buckets(max_batch)
        self.width = width_blocks
        self.null_block = null_block
        self.device = device
        pin = device.type == "cuda"
        cap = self.buckets[-1]
        self._host_i = torch.zeros(cap, _FIXED + width_blocks, dtype=torch.int64, pin_memory=pin)
        self._host_f = torch.zeros(cap, dtype=torch.float32, pin_memory=pin)
        self._np_i, self._np_f = self._host_i.numpy(), self._host_f.numpy()
        self._dev_i = torch.zeros_like(self._host_i, device=device)
        self._dev_f = torch.zeros_like(self._host_f, device=device)
        self.flex = flex
        self._flex_key: tuple[int, tuple[int, ...]] | None = None  # (bucket, request ids)
        if flex:
            nb = null_block + 1
            self._host_m = torch.zeros(cap, 1 + nb, dtype=torch.int32, pin_memory=pin)
            self._host_p = torch.zeros(cap, nb, dtype=torch.int64, pin_memory=pin)
            self._host_q = torch.zeros(cap, 3, dtype=torch.int64, pin_memory=pin)  # prefix_len, aligned, pos
            self._np_m, self._np_p, self._np_q = self._host_m.numpy(), self._host_p.numpy(), self._host_q.numpy()
            self._dev_m = torch.zeros_like(self._host_m, device=device)
            self._dev_p = torch.zeros_like(self._host_p, device=device)
            self._dev_q = torch.zeros_like(self._host_q, device=device)

    def bucket(self, n: int) -> int:
        """Rows of the padded batch for ``n`` requests (``n`` itself with exact shapes)."""
        if not self.static:
            return n
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"decode batch of {n} exceeds the largest bucket {self.buckets[-1]}")

    def padding_batch(self, b: int) -> DecodeBatch:
        """A bucket of ``b`` padding rows only (warm-up of a decode shape; touches the null block)."""
        return self._build([], [], b)

    def decode_batch(self, reqs: list[LanguageRequest], states: list[RequestState]) -> DecodeBatch:
        """Fill the buffers for one step of ``reqs`` (each feeding its ``pending`` token at
        position ``state.past``) and return the device views. Call before advancing the tables."""
        return self._build(reqs, states, self.bucket(len(reqs)))

    def _build(self, reqs: list[LanguageRequest], states: list[RequestState], b: int) -> DecodeBatch:
        n = len(reqs)
        rows = [st.block_row() for st in states]
        longest = max((len(r) for r in rows), default=1)
        w = self.width if self.static else longest
        if longest > self.width:
            raise ValueError(f"a sequence needs more than the {self.width} block-table columns")
        hi, hf = self._np_i[:b, : _FIXED + w], self._np_f[:b]
        hi[:] = 0
        hi[:, _FIXED:] = self.null_block
        hf[:] = 0.0
        for i, (r, st, row) in enumerate(zip(reqs, states, rows)):
            hi[i, _ID] = r.pending
            hi[i, _NBLK] = len(row)
            hi[i, _PLEN] = st.prefix.length
            hi[i, _ALIGN] = st.aligned
            hi[i, _POS] = st.past
            hi[i, _TOPK] = r.top_k
            hi[i, _KEY] = r.sample_key
            hi[i, _CTR] = len(r.output_ids)
            hi[i, _FIXED : _FIXED + len(row)] = row
            hf[i] = r.temperature
        di, df = self._dev_i[:b, : _FIXED + w], self._dev_f[:b]
        if di.device.type == "cpu":
            di, df = self._host_i[:b, : _FIXED + w], self._host_f[:b]
        else:
            di.copy_(self._host_i[:b, : _FIXED + w], non_blocking=True)
            df.copy_(self._host_f[:b], non_blocking=True)
        out = DecodeBatch(
            n,
            di[:, _ID : _ID + 1],
            di[:, _FIXED:],
            di[:, _NBLK],
            di[:, _PLEN],
            di[:, _ALIGN],
            di[:, _POS],
            di[:, _TOPK],
            di[:, _KEY],
            di[:, _CTR],
            df,
            greedy_only=all(r.temperature == 0 for r in reqs),
        )
        if self.flex:
            self._fill_flex(b, [r.id for r in reqs], rows, out)
        return out

    def _fill_flex(self, b: int, ids: list[int], rows: list[list[int]], out: DecodeBatch) -> None:
        # the mask_mod's per-row scalars as one small contiguous buffer (updated every step)
        self._np_q[:b] = self._np_i[:b, [_PLEN, _ALIGN, _POS]]
        on_host = self._dev_m.device.type == "cpu"
        if not on_host:
            self._dev_q[:b].copy_(self._host_q[:b], non_blocking=True)
        key = (b, tuple(ids))
        if key != self._flex_key:
            hm, hp = self._np_m[:b], self._np_p[:b]
            hm[:] = 0
            hp[:] = -1
            for i, row in enumerate(rows):
                hm[i, 0] = len(row)
                hm[i, 1 : 1 + len(row)] = row
                hp[i, row] = range(len(row))
            if not on_host:
                self._dev_m[:b].copy_(self._host_m[:b], non_blocking=True)
                self._dev_p[:b].copy_(self._host_p[:b], non_blocking=True)
            self._flex_key = key
        dm, dp, dq = (self._host_m, self._host_p, self._host_q) if on_host else (self._dev_m, self._dev_p, self._dev_q)
        out.kv_num = dm[:b, :1][:, :, None]
        out.kv_idx = dm[:b, 1:][:, None, None, :]
        out.p2l, out.meta = dp[:b], dq[:b]


__all__ = ["StepBuffers", "DecodeBatch", "batch_buckets"]
