"""Step buffers: batch buckets, padding rows, fixed block-table width, FlexAttention index inputs."""

import pytest
import torch

from oxygen_ros.core.cache.block_pool import BlockPool, BlockTable
from oxygen_ros.core.engine.frame import FramePrefix, RequestState
from oxygen_ros.core.engine.requests import LanguageRequest
from oxygen_ros.core.engine.step_buffers import StepBuffers, batch_buckets


def test_buckets():
    assert batch_buckets(1) == [1] and batch_buckets(30) == [1, 2, 4, 8, 16, 30] and batch_buckets(8) == [1, 2, 4, 8]


def _req(pool, i, prefix, own_tokens, temp=0.0):
    r = LanguageRequest(id=i, task="t", text="", max_new_tokens=8, temperature=temp, top_k=2 * i, sample_key=100 + i)
    r.pending, r.output_ids = 40 + i, [1] * i
    t = BlockTable(pool)
    t.reserve(own_tokens + 8)
    t.advance(own_tokens)
    st = RequestState(prefix, t, detok=None)
    r.state = st
    return r, st


@pytest.mark.parametrize("static", [True, False])
def test_decode_batch_rows_and_padding(static):
    pool = BlockPool(40, 4)
    pt = BlockTable(pool)
    slots = pt.append(6)  # 2 blocks, the last half full
    prefix = FramePrefix(0, list(pt.blocks), slots, torch.zeros(1, 4))
    assert len(prefix.blocks) == 2
    reqs = [_req(pool, i, prefix, n, temp) for i, (n, temp) in enumerate([(0, 0.0), (3, 1.0), (5, 0.0)])]
    buf = StepBuffers(8, 10, null_block=40, device=torch.device("cpu"), static=static, flex=True)
    b = buf.decode_batch([r for r, _ in reqs], [s for _, s in reqs])
    assert b.rows == 3 and b.size == (4 if static else 3) and not b.greedy_only
    assert b.tables.shape[1] == (10 if static else 6)  # prefix 2 + own 4 blocks
    assert b.ids[:, 0].tolist()[:3] == [40, 41, 42] and b.pos.tolist()[:3] == [6, 9, 11]
    assert b.prefix_len.tolist()[:3] == [6] * 3 and b.aligned.tolist()[:3] == [8] * 3
    assert b.counters.tolist()[:3] == [0, 1, 2] and b.keys.tolist()[:3] == [100, 101, 102]
    assert b.top_k.tolist()[:3] == [0, 2, 4] and b.temperature.tolist()[:3] == [0.0, 1.0, 0.0]
    for i, (_, st) in enumerate(reqs):
        row = st.block_row()
        assert b.tables[i, : len(row)].tolist() == row and (b.tables[i, len(row) :] == 40).all()
        assert b.num_blocks[i] == len(row) and b.kv_num[i, 0, 0] == len(row)
        assert b.kv_idx[i, 0, 0, : len(row)].tolist() == row
        assert [int(b.p2l[i, blk]) for blk in row] == list(range(len(row)))
        assert int((b.p2l[i] >= 0).sum()) == len(row)
        assert b.meta[i].tolist() == [6, 8, int(b.pos[i])]
    if static:  # the padding row attends nothing and writes only the null block
        assert b.num_blocks[3] == 0 and (b.tables[3] == 40).all() and b.kv_num[3, 0, 0] == 0
        assert (b.p2l[3] == -1).all() and b.ids[3, 0] == 0 and b.temperature[3] == 0


def test_too_wide_sequence_raises():
    pool = BlockPool(40, 4)
    pt = BlockTable(pool)
    slots = pt.append(12)
    prefix = FramePrefix(0, list(pt.blocks), slots, torch.zeros(1, 4))
    r, st = _req(pool, 0, prefix, 10)
    with pytest.raises(ValueError, match="block-table columns"):
        StepBuffers(4, 5, 40, torch.device("cpu")).decode_batch([r], [st])
    with pytest.raises(ValueError, match="largest bucket"):
        StepBuffers(2, 50, 40, torch.device("cpu")).bucket(3)
