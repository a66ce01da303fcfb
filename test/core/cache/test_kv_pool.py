"""Paged attention views give exactly what the contiguous reference cache gives."""

import random

import torch
from paged_reference import PagedPrefillView, paged_denoise_view

from oxygen_ros.core.cache.block_pool import BlockTable
from oxygen_ros.core.cache.kv_pool import KVPool, PagedExtendView
from oxygen_ros.core.config import get_preset
from oxygen_ros.core.model.kv import DenseKVCache
from oxygen_ros.core.model.weights import random_pretrained

CFG = get_preset("pi05-tiny")


def _model():
    return random_pretrained(CFG, seed=3)


def _scrambled_pool(num_blocks=64, block_size=4):
    pool = KVPool(CFG.vlm.depth, num_blocks, block_size, CFG.vlm.num_kv_heads, CFG.vlm.head_dim)
    # Shuffle the free list so tables get non-contiguous, out-of-order blocks.
    free = list(pool.blocks._free)
    random.Random(0).shuffle(free)
    pool.blocks._free.clear()
    pool.blocks._free.extend(free)
    return pool


@torch.inference_mode()
def test_paged_prefill_extend_denoise_match_dense():
    m = _model()
    torch.manual_seed(0)
    b, p = 2, 23
    emb = torch.randn(b, p, CFG.vlm.width)
    valid = torch.zeros(b, p, dtype=torch.bool)
    valid[0, :23] = True
    valid[1, :17] = True
    dense = DenseKVCache(CFG.vlm.depth, b, 40, CFG.vlm.num_kv_heads, CFG.vlm.head_dim)
    h_dense = m.prefill(emb, valid, dense.prefill_view(valid))

    pool = _scrambled_pool()
    tables = [BlockTable(pool.blocks) for _ in range(b)]
    slots = [t.append(int(valid[i].sum())) for i, t in enumerate(tables)]
    h_paged = m.prefill(emb, valid, PagedPrefillView(pool, valid, slots))
    assert torch.allclose(h_dense, h_paged, atol=1e-6)
    for layer in range(CFG.vlm.depth):
        for i in range(b):
            n = int(valid[i].sum())
            k_p, _ = pool.gather(layer, torch.tensor([tables[i].slots]))
            assert torch.equal(k_p[0, :n], dense.k[layer][i, :n])

    # Action path over the paged prefix equals the dense one.
    x = torch.randn(b, CFG.action_horizon, CFG.action_dim)
    t = torch.tensor([0.9, 0.4])
    v_dense = m.denoise_step(dense.denoise_view(CFG.action_horizon), x, t)
    v_paged = m.denoise_step(paged_denoise_view(pool, [tb.slots for tb in tables], CFG.action_horizon), x, t)
    assert torch.allclose(v_dense, v_paged, atol=1e-6)

    # Ragged extension (3 tokens for row 0, 1 for row 1), then a one-token step.
    ids = torch.tensor([[5, 6, 7], [9, 0, 0]])
    ev = torch.tensor([[True, True, True], [True, False, False]])
    own = [BlockTable(pool.blocks) for _ in range(b)]
    past = [tables[i].slots + own[i].slots for i in range(b)]
    new = [own[i].append(int(ev[i].sum())) for i in range(b)]
    l_paged = m.decode_step(PagedExtendView.from_lists(pool, past, new, ev), ids, ev)
    l_dense = m.decode_step(dense.extend_view(ev), ids, ev)
    assert torch.allclose(l_dense, l_paged, atol=1e-5)
    ids2 = torch.tensor([[11], [12]])
    ev2 = torch.ones(b, 1, dtype=torch.bool)
    past = [tables[i].slots + own[i].slots for i in range(b)]
    new = [own[i].append(1) for i in range(b)]
    assert torch.allclose(
        m.decode_step(dense.extend_view(ev2), ids2, ev2),
        m.decode_step(PagedExtendView.from_lists(pool, past, new, ev2), ids2, ev2),
        atol=1e-5,
    )


def test_bytes_per_block():
    assert KVPool.bytes_per_block(18, 16, 1, 256, torch.bfloat16) == 2 * 18 * 16 * 256 * 2
