"""CUDA lifetime rules that can fail: a fence observed pending before any synchronisation, blocks
freed while the decode stream still reads them are not reused (outputs unchanged), and the
concurrent engine on CUDA gives the serial engine's chunks and texts."""

import numpy as np
import pytest
import torch

from oxygen_ros.core.cache.block_pool import PoolExhausted
from oxygen_ros.core.cache.kv_pool import KVPool
from oxygen_ros.core.config import EngineConfig, TaskConfig
from oxygen_ros.core.engine.streams import DeviceStreams
from oxygen_ros.core.loops.schedules import make_engine
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.types import Observation

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SLEEP = 200_000_000  # GPU cycles (~0.1 s): keeps a stream busy while the host looks at fences


def test_fence_is_pending_before_sync():
    dev = torch.device("cuda")
    s = DeviceStreams(dev, host_sync=False)
    pool = KVPool(1, 8, 4, 1, 8, device=dev)
    blocks = pool.blocks.allocate(3)
    with s.decode(after=None):
        torch.cuda._sleep(SLEEP)
        fence = s.fence()
    assert not s.is_done(fence)  # observed BEFORE any synchronisation
    pool.blocks.free(blocks, fence)
    assert pool.blocks.num_fenced == 3 and pool.blocks.reclaim(s.is_done) == 0
    torch.cuda.synchronize()
    assert s.is_done(fence) and pool.blocks.reclaim(s.is_done) == 3 and pool.blocks.num_free == 8


def test_blocks_freed_while_decode_reads_are_not_reused():
    dev = torch.device("cuda")
    s = DeviceStreams(dev, host_sync=False)
    pool = KVPool(1, 4, 4, 1, 8, device=dev)
    req = pool.blocks.allocate(2)
    slots = torch.as_tensor([b * 4 + i for b in req for i in range(4)], device=dev)
    expect = torch.arange(8 * 8, dtype=torch.float32, device=dev).view(8, 1, 8)
    s.wait_default()  # the pool's zero-fill and these inputs were made on the default stream
    with s.action():
        pool.write(0, slots, expect, expect)
        ready = s.event()
    with s.decode(after=ready):
        torch.cuda._sleep(SLEEP)  # the read below runs late on the device
        k, v = pool.gather(0, slots[None])
        fence = s.fence()
    pool.blocks.free(req, fence)  # the host frees while the decode stream still has to read
    other = pool.blocks.allocate(2)  # a new prefix: must get the two other blocks
    assert set(other).isdisjoint(req)
    with pytest.raises(PoolExhausted):
        pool.blocks.allocate(1)
    with s.action():  # high priority, no sleep: runs before the delayed read on the device
        junk = torch.as_tensor([b * 4 + i for b in other for i in range(4)], device=dev)
        pool.write(0, junk, -expect, -expect)
    torch.cuda.synchronize()
    assert torch.equal(k[0], expect) and torch.equal(v[0], expect)


@pytest.mark.parametrize("dtype", [torch.float32])
def test_concurrent_engine_on_cuda_matches_serial(dtype):
    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cuda", dtype=dtype)
    tasks = (TaskConfig("conversation", "Q: {text} A: ", max_new_tokens=10),)
    out = {}
    for schedule in ("serial", "concurrent"):
        eng = make_engine(policy, EngineConfig(tasks=tasks, tokens_per_frame=2, block_size=8, schedule=schedule))
        rng = np.random.default_rng(0)
        acts, texts = [], {}
        for f in range(14):
            eng.submit_observation(
                Observation(
                    images={"base_0_rgb": rng.integers(0, 256, (40, 40, 3), np.uint8)},
                    state=rng.uniform(-1, 1, 14).astype(np.float32),
                    instruction="go",
                )
            )
            if f < 8:
                eng.submit_request("conversation", f"q{f}")
            r = eng.step()
            eng.pool.blocks.check()
            acts.append(r.action.actions)
            texts.update({e.id: e.token_ids for e in r.ended})
        texts.update({e.id: e.token_ids for e in eng.flush().ended})
        eng.check_invariants()
        assert eng.running == 0
        torch.cuda.synchronize()
        eng.pool.blocks.reclaim(eng.streams.is_done)
        assert eng.pool.blocks.num_in_use == 0 and eng.pool.blocks.num_fenced == 0
        out[schedule] = (acts, texts)
        eng.close()
    for a, b in zip(out["serial"][0], out["concurrent"][0]):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert out["serial"][1] == out["concurrent"][1]
