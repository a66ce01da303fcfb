"""Block pool bookkeeping: allocation, reference counts, fences, invariants, block tables."""

import pytest

from oxygen_ros.core.cache.block_pool import BlockPool, BlockPoolError, BlockTable, PoolExhausted


def test_allocate_free_and_counts():
    pool = BlockPool(8, 4)
    a = pool.allocate(3)
    assert len(set(a)) == 3 and pool.num_free == 5 and pool.num_in_use == 3
    pool.check()
    assert pool.free(a) == 3
    assert pool.num_free == 8 and pool.num_in_use == 0
    pool.check()


def test_exhaustion_takes_nothing():
    pool = BlockPool(4, 4)
    pool.allocate(3)
    with pytest.raises(PoolExhausted, match="need 2 KV blocks, 1 free"):
        pool.allocate(2)
    assert pool.num_free == 1
    assert pool.can_allocate(1) and not pool.can_allocate(2)


def test_shared_block_released_on_last_reference():
    pool = BlockPool(4, 2)
    (b,) = pool.allocate(1)
    pool.incref([b])
    assert pool.refcount(b) == 2
    assert pool.free([b]) == 0 and pool.num_in_use == 1
    assert pool.free([b]) == 1 and pool.num_free == 4


def test_double_free_is_an_error_and_changes_nothing():
    pool = BlockPool(4, 2)
    a = pool.allocate(2)
    pool.free([a[0]])
    with pytest.raises(BlockPoolError, match="double free"):
        pool.free([a[1], a[0]])
    assert pool.refcount(a[1]) == 1
    with pytest.raises(BlockPoolError):
        pool.free([a[1], a[1]])
    with pytest.raises(BlockPoolError, match="unallocated"):
        pool.incref([a[0]])
    pool.check()


def test_fenced_blocks_wait_for_their_fence():
    pool = BlockPool(4, 2)
    a = pool.allocate(4)
    pool.free(a[:2], fence="ev1")
    assert pool.num_free == 0 and pool.num_fenced == 2 and pool.num_in_use == 2
    pool.check()
    assert pool.reclaim(lambda f: False) == 0
    assert pool.reclaim(lambda f: f == "ev1") == 2
    assert pool.num_free == 2 and pool.num_fenced == 0


def test_block_table_slots_and_release():
    pool = BlockPool(6, 4)
    t = BlockTable(pool)
    s1 = t.append(5)
    assert len(t.blocks) == 2 and t.num_tokens == 5
    assert s1 == [t.blocks[0] * 4 + i for i in range(4)] + [t.blocks[1] * 4]
    s2 = t.append(1)
    assert s2 == [t.blocks[1] * 4 + 1] and t.slots == s1 + s2
    t.reserve(12)
    assert len(t.blocks) == 3 and t.num_tokens == 6
    t.release()
    assert pool.num_free == 6 and t.slots == []


def test_invalid_sizes():
    with pytest.raises(ValueError):
        BlockPool(0, 4)
    with pytest.raises(ValueError):
        BlockPool(4, 0)
