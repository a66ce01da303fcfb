"""CUDA path of the engine: streams, events and fenced block reuse give the CPU results."""

import numpy as np
import pytest
import torch

from oxygen_ros.core.config import EngineConfig, TaskConfig
from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.types import Observation

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TASKS = (TaskConfig("conversation", "Q: {text} A: ", max_new_tokens=10),)


def _run(device: str, dtype: torch.dtype):
    policy = Pi05Policy.from_pretrained("pi05-tiny", device=device, dtype=dtype)
    eng = Engine(policy, EngineConfig(tasks=TASKS, tokens_per_frame=2, block_size=8))
    rng = np.random.default_rng(0)
    acts, texts = [], {}
    for f in range(12):
        eng.submit_observation(
            Observation(
                images={"base_0_rgb": rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)},
                state=rng.uniform(-1, 1, 14).astype(np.float32),
                instruction="go",
            )
        )
        if f < 6:
            eng.submit_request("conversation", f"q{f}", temperature=1.0, seed=f)
        r = eng.step()
        eng.check_invariants()
        acts.append(r.action.actions)
        texts.update({e.id: e.token_ids for e in r.ended})
    assert eng.running == 0
    return acts, texts, eng


def test_cuda_fp32_matches_cpu_and_blocks_are_fenced():
    cpu_acts, cpu_texts, _ = _run("cpu", torch.float32)
    gpu_acts, gpu_texts, eng = _run("cuda", torch.float32)
    assert eng.streams.cuda and eng.pool.k.is_cuda
    for a, b in zip(cpu_acts, gpu_acts):
        np.testing.assert_allclose(a, b, atol=2e-3)
    same = sum(cpu_texts[k] == gpu_texts[k] for k in cpu_texts)
    assert same >= len(cpu_texts) - 1  # fp32 kernels differ in the last bits; sampling may diverge rarely
    torch.cuda.synchronize()
    eng.pool.blocks.reclaim(eng.streams.is_done)
    assert eng.pool.blocks.num_fenced == 0 and eng.pool.blocks.num_in_use == 0


def test_cuda_bf16_runs_finite():
    acts, _, eng = _run("cuda", torch.bfloat16)
    assert all(np.isfinite(a).all() for a in acts)
    assert eng.pool.k.dtype == torch.bfloat16


def test_action_path_and_decode_step_never_sync_the_host_before_their_result():
    """Prefill + denoise (up to the chunk's device tensor) and a decode step (up to the sampled
    ids' one transfer) under ``cuda.set_sync_debug_mode("error")``: any blocking copy or
    data-dependent shape raises."""
    from oxygen_ros.core.cache.block_pool import BlockTable
    from oxygen_ros.core.policy import frame_noise

    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cuda")
    eng = Engine(policy, EngineConfig(tasks=TASKS, tokens_per_frame=1, block_size=8))
    eng.streams.host_sync = False
    rng = np.random.default_rng(1)
    obs = Observation(
        images={"base_0_rgb": rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)},
        state=rng.uniform(-1, 1, 14).astype(np.float32),
        instruction="go",
    )
    eng.submit_observation(obs)
    eng.submit_request("conversation", "hello", temperature=1.0, seed=3)
    eng.step()  # admits the request: the next step is a plain decode step
    enc = policy.encode_observation(obs)
    noise = frame_noise(0, 1, policy.cfg.action_horizon, policy.cfg.action_dim)
    batch = eng.scheduler.decode_batch()
    args = eng.runner.decode_args(eng.runner.buffers.decode_batch(batch, [r.state for r in batch]))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        prefix = eng.runner.prefill(enc, 1, BlockTable(eng.pool.blocks))
        x = eng.runner.actions_normalized(prefix, noise, 10)
        ids = eng.runner.decode_stage(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(x).all() and ids.shape[0] >= 1
    eng.pool.blocks.free(prefix.blocks)
