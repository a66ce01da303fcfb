"""Block pool bookkeeping in plain Python (no torch): free list, reference counts, block tables.

The K/V of every sequence lives in fixed-size blocks of ``block_size`` token slots inside one
preallocated tensor pool (:mod:`.kv_pool`). A slot id is ``block * block_size + offset``. A block
may be referenced by several sequences (a frame's prefix shared by the action path and by the
language requests of that frame); it returns to the free list when its last reference is dropped.

Freed blocks can be *fenced*: on CUDA a block just read by an in-flight kernel must not be handed
out again before that stream has passed an event. ``free(blocks, fence)`` parks them until
``reclaim(is_done)`` sees the fence as done. Every update holds one re-entrant lock, so the
action loop (prefix blocks) and the batcher loop (request blocks) may share the pool from two
threads (issue 13). Follows the paged KV cache of vLLM (Kwon et al., 2023)
and docs/architecture.md, 'The KV block pool'; written from scratch.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Concatenate, ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")


class PoolExhausted(RuntimeError):
    """Not enough free blocks for an allocation."""


class BlockPoolError(RuntimeError):
    """Invariant violation: double free, unknown block, bad reference count."""


def _locked(method: Callable[Concatenate[BlockPool, _P], _R]) -> Callable[Concatenate[BlockPool, _P], _R]:
    """Run a :class:`BlockPool` method under the pool's lock."""

    @functools.wraps(method)
    def run(self: BlockPool, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self.lock:
            return method(self, *args, **kwargs)

    return run


class BlockPool:
    """Free list + reference counts over ``num_blocks`` blocks of ``block_size`` slots."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks} and block_size={block_size} must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._ref = [0] * num_blocks
        self._fenced: list[tuple[object, list[int]]] = []
        self.lock = threading.RLock()

    # ------------------------------------------------------------------ queries
    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` token slots."""
        return -(-max(num_tokens, 0) // self.block_size)

    @property
    def num_free(self) -> int:
        """Blocks ready to hand out now."""
        return len(self._free)

    @property
    def num_fenced(self) -> int:
        """Blocks released but waiting for a device fence."""
        return sum(len(b) for _, b in self._fenced)

    @property
    def num_in_use(self) -> int:
        """Blocks with a reference count > 0."""
        return self.num_blocks - self.num_free - self.num_fenced

    def refcount(self, block: int) -> int:
        """Current reference count of ``block``."""
        return self._ref[block]

    def can_allocate(self, n: int) -> bool:
        """Whether ``n`` blocks can be allocated right now."""
        return n <= len(self._free)

    # ------------------------------------------------------------------ updates
    @_locked
    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks with reference count 1.

        Raises:
            PoolExhausted: fewer than ``n`` free blocks (nothing is taken).
        """
        if n > len(self._free):
            raise PoolExhausted(f"need {n} KV blocks, {len(self._free)} free of {self.num_blocks}")
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self._ref[b] = 1
        return out

    @_locked
    def incref(self, blocks: Iterable[int]) -> None:
        """Add a reference to each (already allocated) block.

        Raises:
            BlockPoolError: a block is not allocated.
        """
        blocks = list(blocks)
        for b in blocks:
            if not 0 <= b < self.num_blocks or self._ref[b] <= 0:
                raise BlockPoolError(f"incref of unallocated block {b}")
        for b in blocks:
            self._ref[b] += 1

    @_locked
    def free(self, blocks: Iterable[int], fence: object | None = None) -> int:
        """Drop one reference from each block; blocks reaching 0 are released.

        Args:
            blocks: block ids (each dropped once).
            fence: opaque device marker; released blocks wait for it in :meth:`reclaim`.

        Returns:
            Number of blocks released (reference count reached 0).

        Raises:
            BlockPoolError: double free / unknown block (no block is changed).
        """
        blocks = list(blocks)
        seen: dict[int, int] = {}
        for b in blocks:
            seen[b] = seen.get(b, 0) + 1
            if not 0 <= b < self.num_blocks or self._ref[b] < seen[b]:
                raise BlockPoolError(f"double free of block {b}")
        released = []
        for b in blocks:
            self._ref[b] -= 1
            if self._ref[b] == 0:
                released.append(b)
        if released:
            if fence is None:
                self._free.extend(released)
            else:
                self._fenced.append((fence, released))
        return len(released)

    @_locked
    def reclaim(self, is_done: Callable[[object], bool]) -> int:
        """Move fenced blocks whose fence ``is_done`` to the free list; returns how many."""
        keep, n = [], 0
        for fence, blocks in self._fenced:
            if is_done(fence):
                self._free.extend(blocks)
                n += len(blocks)
            else:
                keep.append((fence, blocks))
        self._fenced = keep
        return n

    @_locked
    def check(self) -> None:
        """Assert the invariants: free + fenced + in-use = total, no block both free and used.

        Raises:
            BlockPoolError: an invariant does not hold.
        """
        free = list(self._free) + [b for _, bl in self._fenced for b in bl]
        if len(set(free)) != len(free):
            raise BlockPoolError("a block is on the free list twice")
        used = [b for b in range(self.num_blocks) if self._ref[b] > 0]
        if set(used) & set(free):
            raise BlockPoolError("a block is both free and referenced")
        if len(used) + len(free) != self.num_blocks:
            raise BlockPoolError(f"free {len(free)} + in-use {len(used)} != total {self.num_blocks}")
        if any(r < 0 for r in self._ref):
            raise BlockPoolError("negative reference count")


class BlockTable:
    """Token slots of one sequence segment: blocks plus the number of filled slots.

    A language request's full sequence is its frame's prefix table followed by its own table; the
    slot of token ``i`` of a table is ``blocks[i // bs] * bs + i % bs``.
    """

    def __init__(self, pool: BlockPool, blocks: list[int] | None = None, num_tokens: int = 0) -> None:
        self.pool = pool
        self.blocks: list[int] = blocks or []
        self.num_tokens = num_tokens

    @property
    def capacity(self) -> int:
        """Token slots available without allocating."""
        return len(self.blocks) * self.pool.block_size

    def slot(self, i: int) -> int:
        """Slot id of token ``i`` of this segment."""
        bs = self.pool.block_size
        return self.blocks[i // bs] * bs + i % bs

    def reserve(self, num_tokens: int) -> None:
        """Allocate blocks so that ``num_tokens`` tokens fit (raises :class:`PoolExhausted`)."""
        need = self.pool.blocks_for(num_tokens) - len(self.blocks)
        if need > 0:
            self.blocks.extend(self.pool.allocate(need))

    def append(self, n: int) -> list[int]:
        """Claim the next ``n`` slots (allocating blocks if needed); returns their slot ids."""
        first = self.num_tokens
        self.advance(n)
        return [self.slot(first + i) for i in range(n)]

    def advance(self, n: int) -> None:
        """Claim the next ``n`` slots without listing them (allocating blocks if needed)."""
        self.reserve(self.num_tokens + n)
        self.num_tokens += n

    @property
    def slots(self) -> list[int]:
        """Slot ids of all filled tokens, in order."""
        return [self.slot(i) for i in range(self.num_tokens)]

    def release(self, fence: object | None = None) -> None:
        """Drop this table's reference to all its blocks."""
        if self.blocks:
            self.pool.free(self.blocks, fence)
        self.blocks = []
        self.num_tokens = 0
