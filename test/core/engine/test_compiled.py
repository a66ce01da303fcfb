"""Compiled engine stages: eager fallback on non-finite output (fast, no real compile), warm-up
readiness, and compiled vs eager equivalence in every mode (slow: real torch.compile on CPU)."""

import numpy as np
import pytest
import torch

from oxygen_ros.core.config import ConfigError, EngineConfig, TaskConfig
from oxygen_ros.core.engine.compiled import Stage
from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.types import Observation

TASKS = (
    TaskConfig("conversation", "Question: {text}\nAnswer: ", max_new_tokens=6),
    TaskConfig("narration", "", max_new_tokens=5),
)
SLOTS = ("base_0_rgb", "left_wrist_0_rgb")


def obs(i: int, masked: bool = False) -> Observation:
    rng = np.random.default_rng(40 + i)
    imgs = {
        "base_0_rgb": rng.integers(0, 256, (30, 40, 3), dtype=np.uint8),
        "left_wrist_0_rgb": None if masked else rng.integers(0, 256, (30, 40, 3), dtype=np.uint8),
    }
    return Observation(images=imgs, state=rng.uniform(-1, 1, 14).astype(np.float32), instruction="pick", stamp=i)


def run(policy, frames=5, **kw):
    """Frames alternate masked / unmasked wrist camera; greedy and seeded sampled requests."""
    # no queue age bound: a compile stall (tens of seconds on a loaded CPU) must not expire a queued
    # request in one run and not in the other — the equivalence is about outputs, not wall time
    eng = Engine(
        policy,
        EngineConfig(
            tokens_per_frame=2, tasks=TASKS, max_running_requests=2, num_denoise_steps=2, max_queue_wait_s=0.0, **kw
        ),
    )
    acts, toks = [], {}
    for f in range(frames):
        eng.submit_observation(obs(f, masked=f % 2 == 1))
        if f in (0, 1):
            eng.submit_request("conversation", f"q{f}", 5)
            eng.submit_request("narration", "", 4, temperature=1.0, seed=f)
        r = eng.step()
        eng.check_invariants()
        acts.append(r.action.actions)
        toks.update({e.id: e.token_ids for e in r.ended})
    return eng, acts, toks


@pytest.fixture(scope="module")
def policy():
    return Pi05Policy.from_pretrained("pi05-tiny", device="cpu", config_overrides={"image_slots": SLOTS})


def _poison(stage: Stage, make_bad):
    stage._compiled = lambda *a: make_bad(stage.eager(*a))  # a "compiled" stage gone wrong


def test_non_finite_compiled_stages_fall_back_to_eager_with_a_diagnostic(policy):
    _, ref_acts, ref_toks = run(policy)
    eng = Engine(policy, EngineConfig(tokens_per_frame=2, tasks=TASKS, max_running_requests=2, num_denoise_steps=2))
    _poison(eng.runner.denoise_stage, lambda x: x * float("nan"))
    _poison(eng.runner.decode_stage, lambda t: torch.full_like(t, -1))
    assert eng.runner.denoise_stage.compiled and eng.runner.decode_stage.compiled
    acts, toks = [], {}
    for f in range(5):
        eng.submit_observation(obs(f, masked=f % 2 == 1))
        if f in (0, 1):
            eng.submit_request("conversation", f"q{f}", 5)
            eng.submit_request("narration", "", 4, temperature=1.0, seed=f)
        r = eng.step()
        acts.append(r.action.actions)
        toks.update({e.id: e.token_ids for e in r.ended})
    assert all(np.array_equal(a, b) for a, b in zip(acts, ref_acts)) and toks == ref_toks
    d = eng.diagnostics()
    assert "non-finite" in d["fallback_denoise"] and "non-finite" in d["fallback_decode"]
    assert not eng.runner.denoise_stage.compiled and not eng.runner.decode_stage.compiled


def test_a_genuinely_non_finite_model_does_not_fall_back(policy):
    eng = Engine(policy, EngineConfig(tasks=TASKS, num_denoise_steps=2))
    st = eng.runner.denoise_stage
    real = st.eager
    st.eager = lambda *a: real(*a) * float("nan")
    _poison(st, lambda x: x)
    eng.submit_observation(obs(0))
    r = eng.step()
    assert r.action is None and "non-finite" in r.error  # dropped, never published
    assert st.fallback_reason is None


def test_warmup_runs_every_shape_and_reports_ready(policy, monkeypatch):
    cfg = EngineConfig(tasks=TASKS, max_running_requests=5, num_denoise_steps=2, static_shapes=True)
    eng = Engine(policy, cfg)
    seen = []
    real = eng.runner.decode_stage.eager
    monkeypatch.setattr(eng.runner.decode_stage, "eager", lambda *a: seen.append(a[4].shape[0]) or real(*a))
    buckets = set()
    real_pf = eng.runner.prefill_stage.eager
    monkeypatch.setattr(eng.runner.prefill_stage, "eager", lambda *a: buckets.add(a[5].shape[1]) or real_pf(*a))
    assert not eng.ready and eng.diagnostics()["ready"] is False
    eng.warmup()
    assert eng.ready and eng.warmup_s > 0 and eng.frame_id == 0 and eng.pool.blocks.num_in_use == 0
    assert seen == [1, 2, 4, 5]  # every decode batch bucket
    n = policy.cfg.vision.num_tokens
    assert buckets == {n + policy.cfg.max_token_len, 2 * n + policy.cfg.max_token_len}  # both camera counts


def test_bad_compile_options_are_config_errors():
    with pytest.raises(ConfigError, match="compile"):
        EngineConfig(compile="turbo").validate()
    with pytest.raises(ConfigError, match="attention"):
        EngineConfig(attention="paged").validate()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["unified", "shared_kv", "isolated"])
def test_compiled_equals_eager_in_every_mode(policy, mode):
    """torch.compile (inductor, CPU) of vision / prefill / denoise / decode (gather attention, the
    CPU default): actions within 1e-5, identical greedy and seeded tokens, masked-camera frames
    included. Compiled graphs are shared by the engines of the three modes (same model, shapes)."""
    _, ea, et = run(policy, mode=mode)
    _, ga, gt = run(policy, mode=mode, attention="flex")  # eager FlexAttention (unfused reference)
    eng, ca, ct = run(policy, mode=mode, compile="default")
    assert all(np.abs(a - b).max() < 1e-5 for a, b in zip(ea, ca))
    assert all(np.abs(a - b).max() < 1e-5 for a, b in zip(ea, ga))
    assert et == ct == gt and len(et) == 4
    assert not eng.runner.flex and all(s.compiled for s in eng.runner.stages), eng.diagnostics()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compile_mode", ["default", "reduce-overhead"])
def test_compiled_equals_eager_on_cuda(compile_mode):
    """Same check on CUDA: the whole denoise loop is one compiled (captured) region there."""
    gpu = Pi05Policy.from_pretrained(
        "pi05-tiny", device="cuda", dtype=torch.float32, config_overrides={"image_slots": SLOTS}
    )
    _, ea, et = run(gpu)
    eng, ca, ct = run(gpu, compile=compile_mode)
    assert eng.runner.denoise_loop and all(s.compiled for s in eng.runner.stages), eng.diagnostics()
    assert all(np.abs(a - b).max() < 1e-4 for a, b in zip(ea, ca)) and et == ct


def test_compiled_stages_always_run_static_shapes_and_eager_ones_exact_by_default(policy):
    """Padding buys a reusable graph only when a stage is compiled: an eager engine prefills the
    exact prefix (no padded prompt to compute), a compiled one pads whatever ``static_shapes`` says."""
    n, pad = policy.cfg.vision.num_tokens, policy.cfg.max_token_len
    eager = Engine(policy, EngineConfig(tasks=TASKS))
    assert not eager.runner.static and eager.runner.prefix_bucket(2, 7) == 2 * n + 7
    padded = Engine(policy, EngineConfig(tasks=TASKS, static_shapes=True))
    assert padded.runner.static and padded.runner.prefix_bucket(2, 7) == 2 * n + pad
    compiled_ = Engine(policy, EngineConfig(tasks=TASKS, compile="default", static_shapes=False))
    assert compiled_.runner.static and compiled_.runner.prefix_bucket(2, 7) == 2 * n + pad
