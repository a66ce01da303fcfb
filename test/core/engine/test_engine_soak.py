"""3,000-frame unified run: blocks, Python objects and RSS stay flat; every request finishes."""

import gc
import os

import numpy as np
import pytest

from oxygen_ros.core.config import EngineConfig, TaskConfig
from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.engine.requests import RequestStatus
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.types import Observation


def _rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``; no psutil: the core suite runs on a
    bare PyTorch stack)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_three_thousand_frames_flat_memory():
    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cpu")
    tasks = (
        TaskConfig("conversation", "Q: {text} A: ", max_new_tokens=8),
        TaskConfig("memory", "Memory: ", max_new_tokens=4, every_n_frames=10),
    )
    eng = Engine(policy, EngineConfig(tasks=tasks, tokens_per_frame=1, max_running_requests=8))
    rng = np.random.default_rng(0)
    images = [{"base_0_rgb": rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)} for _ in range(4)]
    submitted, ended, samples = 0, {}, {}
    for f in range(3000):
        eng.submit_observation(
            Observation(
                images=images[f % 4],
                state=rng.uniform(-1, 1, 14).astype(np.float32),
                instruction="stack the blocks",
                stamp=f * 0.02,
            )
        )
        if f % 3 == 0 and f < 2980:
            eng.submit_request("conversation", f"step {f}", temperature=1.0, seed=f)
            submitted += 1
        r = eng.step()
        assert r.action is not None
        for e in r.ended:
            ended[e.id] = e
        if f % 100 == 0:
            eng.check_invariants()
        if f in (500, 2999):
            gc.collect()
            samples[f] = (eng.pool.blocks.num_in_use, len(gc.get_objects()), _rss_bytes())
    for _ in range(20):
        eng.submit_observation(Observation(images=images[0], state=np.zeros(14, np.float32), instruction="x"))
        for e in eng.step().ended:
            ended[e.id] = e
    assert eng.running == 0 and eng.queued == 0 and eng.pool.blocks.num_in_use == 0
    conv = [e for e in ended.values() if e.task == "conversation"]
    assert len(conv) == submitted and all(e.status == RequestStatus.FINISHED for e in conv)
    (b0, o0, r0), (b1, o1, r1) = samples[500], samples[2999]
    assert b1 <= b0 + eng.pool.blocks.blocks_for(policy.cfg.max_prefix_len)
    assert o1 - o0 < 5000, f"Python objects grew by {o1 - o0}"
    assert r1 - r0 < 64 * 2**20, f"RSS grew by {(r1 - r0) / 2**20:.1f} MiB"
