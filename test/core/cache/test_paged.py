"""Block-table decode attention: FlexAttention over the pool equals the gather reference, and both
equal the slot-list extension view (the original reference), on scrambled, shared, holed tables."""

import random

import pytest
import torch
from paged_reference import PagedPrefillView, flex_index

from oxygen_ros.core.cache.block_pool import BlockTable
from oxygen_ros.core.cache.kv_pool import KVPool, PagedExtendView
from oxygen_ros.core.cache.paged import BlockTableFlexView, BlockTableGatherView
from oxygen_ros.core.config import get_preset
from oxygen_ros.core.model.weights import random_pretrained

CFG = get_preset("pi05-tiny")
BS = 4


def _pool(num_blocks=48):
    pool = KVPool(CFG.vlm.depth, num_blocks, BS, CFG.vlm.num_kv_heads, CFG.vlm.head_dim)
    free = list(pool.blocks._free)
    random.Random(1).shuffle(free)  # non-contiguous, out-of-order blocks
    pool.blocks._free.clear()
    pool.blocks._free.extend(free)
    return pool


def _setup(model, pool):
    """Two prefixes (lengths 7 and 9: partial last blocks), three requests: rows 0 and 1 share
    prefix A, row 2 reads prefix B; each request has 0, 3 or 5 own tokens already stored."""
    torch.manual_seed(0)
    prefixes = []
    for n in (7, 9):
        emb = torch.randn(1, n, CFG.vlm.width)
        t = BlockTable(pool.blocks)
        slots = t.append(n)
        model.prefill(
            emb, torch.ones(1, n, dtype=torch.bool), PagedPrefillView(pool, torch.ones(1, n, dtype=torch.bool), [slots])
        )
        prefixes.append(t)
    rows = []
    for pi, own_n in ((0, 0), (0, 3), (1, 5)):
        own = BlockTable(pool.blocks)
        own.reserve(own_n + 6)
        p = prefixes[pi]
        if own_n:  # store own_n tokens through the reference extension view
            ids = torch.randint(4, CFG.vocab_size, (1, own_n))
            ev = torch.ones(1, own_n, dtype=torch.bool)
            model.decode_step(PagedExtendView.from_lists(pool, [p.slots], [own.append(own_n)], ev), ids, ev)
        rows.append((p, own))
    return rows


def _tensors(pool, rows, width, pad_rows=0):
    tables, nblk, plen, align, pos = [], [], [], [], []
    for p, own in rows:
        row = p.blocks + own.blocks
        tables.append(row + [pool.null_block] * (width - len(row)))
        nblk.append(len(row)), plen.append(p.num_tokens), align.append(len(p.blocks) * BS)
        pos.append(p.num_tokens + own.num_tokens)
    for _ in range(pad_rows):
        tables.append([pool.null_block] * width)
        nblk.append(0), plen.append(0), align.append(0), pos.append(0)

    def t(x):
        return torch.tensor(x, dtype=torch.long)

    return t(tables), t(nblk), t(plen), t(align), t(pos)


@pytest.mark.parametrize("pad_rows", [0, 1])
@torch.inference_mode()
def test_flex_and_gather_views_equal_the_slot_list_reference(pad_rows):
    model = random_pretrained(CFG, seed=3)
    pools = [_pool() for _ in range(3)]
    rows = [_setup(model, p) for p in pools]
    ids = torch.tensor([[11], [12], [13]] + [[0]] * pad_rows)
    ones = torch.ones(3, 1, dtype=torch.bool)
    # reference: slot lists of every stored token + one new slot per row
    ref_rows = rows[0]
    past = [p.slots + own.slots for p, own in ref_rows]
    new = [own.append(1) for _, own in ref_rows]
    ref = model.decode_step(PagedExtendView.from_lists(pools[0], past, new, ones), ids[:3], ones)
    width = 12
    tb, nb, pl, al, ps = _tensors(pools[1], rows[1], width, pad_rows)
    gather = model.decode_step(BlockTableGatherView(pools[1], tb, pl, al, ps), ids, None)
    tb, nb, pl, al, ps = _tensors(pools[2], rows[2], width, pad_rows)
    flex = model.decode_step(
        BlockTableFlexView(pools[2], tb, flex_index(pools[2], tb, nb, pl, al, ps), pl, al, ps), ids, None
    )
    assert torch.isfinite(gather).all() and torch.isfinite(flex).all()
    assert torch.allclose(ref, gather[:3], atol=1e-5)
    assert torch.allclose(ref, flex[:3], atol=1e-5)
    # the new token's K/V landed in the same physical slots in all three pools
    for (_, o0), _, _ in zip(*rows):
        s = o0.slot(o0.num_tokens - 1)
        assert torch.allclose(pools[0].k[:, s], pools[1].k[:, s], atol=1e-6)
        assert torch.allclose(pools[0].k[:, s], pools[2].k[:, s], atol=1e-6)
    # shared prefix blocks were never written
    a = rows[1][0][0]
    for s in a.slots:
        assert torch.allclose(pools[0].k[:, s], pools[1].k[:, s])


@torch.inference_mode()
def test_null_block_is_outside_the_bookkeeping():
    pool = KVPool(CFG.vlm.depth, 8, BS, CFG.vlm.num_kv_heads, CFG.vlm.head_dim)
    assert pool.null_block == 8 and pool.k.shape[1] == 9 * BS
    got = pool.blocks.allocate(8)
    assert pool.null_block not in got and pool.null_slot == 8 * BS
