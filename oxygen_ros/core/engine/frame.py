"""Typed per-frame and per-request engine state: the prefilled prefix and a request's KV state.

One owner per concept: the runner creates :class:`FramePrefix`; the request book attaches a
:class:`RequestState` to a request when it starts and drops it when it ends; the step builder
(:mod:`.step_buffers`) reads both to fill the step tensors. Block bookkeeping is plain Python ints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from ..cache.block_pool import BlockTable
from ..detokenize import IncrementalDetokenizer
from ..policy import EncodedObservation


@dataclass
class FramePrefix:
    """A prefilled observation prefix held in pool blocks.

    ``blocks`` carry one reference for the frame itself plus one per language request using it.
    ``slots[i]`` is the pool slot of the token at position ``i`` (``slot_tensor``: the same as a
    CPU int64 tensor, built once); ``last_hidden`` is ``[1, W]``; ``bucket`` is the padded
    (static-shape) prefix length the frame was prefilled at (``length`` when exact).
    """

    frame_id: int
    blocks: list[int]
    slots: list[int]
    last_hidden: torch.Tensor
    stage_times: dict[str, float] = field(default_factory=dict)
    bucket: int = 0
    slot_tensor: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.slot_tensor = torch.as_tensor(self.slots, dtype=torch.long)
        self.bucket = max(self.bucket, len(self.slots))

    @property
    def length(self) -> int:
        """Valid prefix tokens."""
        return len(self.slots)


@dataclass
class RequestState:
    """KV and decoding state of a running language request (engine-private).

    Attributes:
        prefix: the frame prefix it continues (shared, or a private copy in ``isolated`` mode).
        table: its own blocks (reserved at admission for prompt + ``max_new_tokens``).
        detok: streaming detokenizer of its output.
    """

    prefix: FramePrefix
    table: BlockTable
    detok: IncrementalDetokenizer

    @property
    def past(self) -> int:
        """Tokens stored so far (prefix + own): the RoPE position of the next token."""
        return self.prefix.length + self.table.num_tokens

    @property
    def aligned(self) -> int:
        """Logical slot where the request's own tokens start: the prefix rounded up to whole
        blocks. Logical slots ``prefix.length … aligned - 1`` are a masked hole, so the shared,
        partly filled last prefix block is never written (no copy-on-write needed)."""
        return len(self.prefix.blocks) * self.table.pool.block_size

    def block_row(self) -> list[int]:
        """The sequence's block table — prefix blocks, then its own blocks, in logical order:
        every block this request holds a reference to."""
        return self.prefix.blocks + self.table.blocks


def task_prefix(enc: EncodedObservation, prefix_ids: list[int]) -> EncodedObservation:
    """``enc`` with its prompt replaced by an own-prefix task's ``prefix_ids`` (none: ``enc``).

    The task's prompt then sits inside its own bidirectional prefix (pi0.5 subtask prediction).
    """
    if not prefix_ids:
        return enc
    ids = torch.tensor([prefix_ids], dtype=torch.long)
    return dataclasses.replace(enc, tokens=ids, token_masks=torch.ones_like(ids, dtype=torch.bool))
