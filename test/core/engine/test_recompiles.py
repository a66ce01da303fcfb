"""No recompiles after warm-up, for any input the engine accepts (issue 24).

Dynamo's guards and graph caches do not depend on the backend, so these tests compile with the
``eager`` backend (dynamo tracing, no inductor code generation: seconds instead of minutes) and
``fullgraph=True`` (a graph break in any stage raises). Compiled-vs-eager numerics with inductor are
in ``test_compiled.py``.
"""

import logging

import numpy as np
import pytest
import torch

from oxygen_ros.core.config import EngineConfig, TaskConfig
from oxygen_ros.core.engine import compiled
from oxygen_ros.core.engine.compiled import RECOMPILE_ALLOWANCE, Stage
from oxygen_ros.core.loops.schedules import make_engine
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.types import Observation

SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
TASKS = (
    TaskConfig("conversation", "Question: {text}\nAnswer: ", max_new_tokens=5),
    TaskConfig("memory", "", max_new_tokens=3, own_prefix=True),
)


@pytest.fixture(scope="module")
def policy():
    return Pi05Policy.from_pretrained(
        "pi05-tiny", device="cpu", config_overrides={"image_slots": SLOTS}, prompt_overflow="truncate"
    )


def _obs(f: int, instruction: str, cameras: int) -> Observation:
    rng = np.random.default_rng(f)
    imgs = {s: rng.integers(0, 256, (30, 40, 3), dtype=np.uint8) if i < cameras else None for i, s in enumerate(SLOTS)}
    return Observation(images=imgs, state=rng.uniform(-1, 1, 14).astype(np.float32), instruction=instruction, stamp=f)


def _expected_graphs(eng) -> dict[str, int]:
    return {
        "vision": len(SLOTS),
        "prefill": len(SLOTS),
        "denoise": len(SLOTS),
        "decode": len(eng.runner.buffers.buckets),
    }


@pytest.mark.parametrize("mode", ["unified", "shared_kv", "isolated"])
def test_warmup_compiles_one_full_graph_per_shape_in_every_mode(policy, fullgraph, mode):
    """Every stage is one graph per static shape (no graph break: fullgraph), and warm-up compiles
    exactly those: vision / prefill / denoise one per camera count, decode one per batch bucket.
    The first denoise step's input (the frame noise) guards like every later step's: one denoise
    graph per camera count, not two."""
    eng = make_engine(
        policy, EngineConfig(mode=mode, tasks=TASKS, max_running_requests=3, num_denoise_steps=2, compile="default")
    )
    eng.warmup()
    try:
        assert {s.name: s.graphs for s in eng.runner.stages} == _expected_graphs(eng)
        assert all(s.compiled and s.recompiles == 0 for s in eng.runner.stages)
        d = eng.diagnostics()
        assert d["compiled_stages"] == "vision,prefill,denoise,decode" and d["graphs_decode"] == 3
        assert not [k for k in d if k.startswith(("recompiles_", "fallback_"))]
    finally:
        eng.close()


def _exact_fill(policy, obs: Observation) -> Observation:
    """``obs`` with the shortest instruction whose prompt is exactly ``max_token_len`` tokens
    (one shorter is not: nothing was cut, the prompt fills its bucket)."""
    full, last = policy.cfg.max_token_len, 0
    for n in range(1, 400):
        cand = Observation(images=obs.images, state=obs.state, instruction="x" * n, stamp=obs.stamp)
        count = int(policy.encode_observation(cand).token_masks.sum())
        if count == full:
            assert last == full - 1, "the prompt grew by more than one token: it may have been cut"
            return cand
        last = count
    raise AssertionError("no instruction fills the prompt")


def _mixed_workload(eng) -> None:
    """After warm-up: a prompt of exactly ``max_token_len`` tokens and prompts cut to it (no
    padding left: the prefix fills its bucket), short and empty instructions, 1 / 2 / 3 cameras,
    requests with and without their own prefix, greedy and sampled, every decode bucket, a cancel.
    Every frame must give its chunk (a recompile under ``error_on_recompile`` raises in a stage
    and drops the frame)."""
    texts = ["pick up the cube", "x" * 44, "then much more " * 30, ""]
    seen_buckets, ids = set(), []
    real_args = eng.runner.decode_args
    eng.runner.decode_args = lambda batch: seen_buckets.add(batch.size) or real_args(batch)
    for f in range(24):
        obs = _obs(f, texts[f % len(texts)], cameras=1 + f % 3)
        eng.submit_observation(_exact_fill(eng.policy, obs) if f % 5 == 4 else obs)
        for _ in range(3 if f in (0, 12) else int(f % 2 == 0 and f < 16)):
            ids.append(eng.submit_request("conversation", f"question {f}", temperature=1.0 if f % 4 else 0.0, seed=f))
        if f % 6 == 3:
            eng.submit_request("memory", "")
        if f == 9:
            eng.cancel(ids[2])
        r = eng.step()
        assert r.error is None and r.action is not None, (f, r.error)
    for _ in range(12):
        eng.step()
    eng.check_invariants()
    assert seen_buckets == set(eng.runner.buffers.buckets)  # every decode bucket ran
    assert all(s.compiled and s.recompiles == 0 for s in eng.runner.stages), eng.diagnostics()
    assert {s.name: s.graphs for s in eng.runner.stages} == _expected_graphs(eng)
    assert eng.faults.total == 0


def _warm_then_mixed(policy, schedule: str, compile_mode: str, steps: int, no_recompile) -> None:
    """A unified engine: warm-up, then ``error_on_recompile``, then :func:`_mixed_workload`."""
    eng = make_engine(
        policy,
        EngineConfig(
            mode="unified",
            schedule=schedule,
            tasks=TASKS,
            tokens_per_frame=2,
            max_running_requests=3,
            num_denoise_steps=steps,
            compile=compile_mode,
            max_queue_wait_s=0.0,
        ),
    )
    eng.warmup()
    no_recompile()
    try:
        _mixed_workload(eng)
    finally:
        eng.close()


@pytest.mark.parametrize("schedule", ["serial", "concurrent"])
def test_mixed_workload_after_warmup_never_recompiles(policy, fullgraph, no_recompile, schedule):
    """The mixed workload (:func:`_mixed_workload`) after warm-up with ``error_on_recompile``, in
    both schedules (the concurrent one runs decode in its batcher thread: warm-up and both loops
    must use the same torch thread count, which the graphs guard on)."""
    _warm_then_mixed(policy, schedule, "default", 2, no_recompile)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("schedule", ["serial", "concurrent"])
def test_no_recompile_after_warmup_on_cuda(no_recompile, schedule):
    """The same on CUDA with inductor and CUDA graphs (``reduce-overhead``): the whole denoise loop
    is one captured region per camera count there, decode one per bucket."""
    gpu = Pi05Policy.from_pretrained(
        "pi05-tiny",
        device="cuda",
        dtype=torch.bfloat16,
        config_overrides={"image_slots": SLOTS},
        prompt_overflow="truncate",
    )
    _warm_then_mixed(gpu, schedule, "reduce-overhead", 10, no_recompile)


def test_engines_of_different_pool_sizes_each_keep_their_compiled_stages(policy, fullgraph, no_recompile):
    """Three engines of different pool sizes in one process, frames interleaved: each stage holds
    only its own engine's graphs (one per shape), none recompiles, none runs eager. With one code
    object shared by every engine (the old lambdas), each engine's graphs count against the same
    recompile limit until the stage silently runs eagerly."""
    engines = [
        make_engine(
            policy,
            EngineConfig(tasks=TASKS[:1], kv_blocks=n, max_running_requests=2, num_denoise_steps=2, compile="default"),
        )
        for n in (40, 64, 96)
    ]
    assert len({e.pool.blocks.num_blocks for e in engines}) == 3
    for e in engines:
        e.warmup()
    no_recompile()
    try:
        for f in range(6):
            for e in engines:
                e.submit_observation(_obs(f, "pick", cameras=1 + f % 3))
                if f < 2:
                    e.submit_request("conversation", f"q{f}")
                r = e.step()
                assert r.error is None, r.error
        codes = set()
        for e in engines:
            assert {s.name: s.graphs for s in e.runner.stages} == _expected_graphs(e)
            assert all(s.compiled and s.recompiles == 0 for s in e.runner.stages), e.diagnostics()
            codes.update(id(s._code) for s in e.runner.stages)
        assert len(codes) == 4 * len(engines)
    finally:
        for e in engines:
            e.close()


def test_a_stage_past_its_budget_falls_back_to_eager_and_says_so(fullgraph, caplog):
    """A stage that keeps meeting new shapes after warm-up: each is a counted, logged recompile;
    past its budget (warmed shapes + the allowance) it runs eager for good with the reason, before
    dynamo's own limit would run it eagerly without a word."""
    calls = []

    def double(x):
        return x * 2

    st = Stage("toy", double, "default", shapes=1)
    st.eager = lambda x: calls.append(x.shape[0]) or double(x)
    st(torch.ones(1))
    st.seal()
    assert st.graphs == 1 and st.budget == 1 + RECOMPILE_ALLOWANCE
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        for n in range(2, 2 + RECOMPILE_ALLOWANCE):
            assert torch.equal(st(torch.ones(n)), torch.full((n,), 2.0))
        assert st.compiled and st.recompiles == RECOMPILE_ALLOWANCE and not calls
        assert "new graph after warm-up" in caplog.text and "float32[2]" in caplog.text
        st(torch.ones(9))  # one graph more than the budget
    assert not st.compiled and st.recompiles == RECOMPILE_ALLOWANCE + 1
    assert "exceed the budget" in st.fallback_reason and "falls back to eager" in caplog.text
    assert torch.equal(st(torch.ones(11)), torch.full((11,), 2.0)) and calls == [11]  # eager from now on
    assert torch._dynamo.config.recompile_limit > st.budget  # the budget check fires before dynamo's limit


def test_a_stage_never_warmed_still_falls_back_past_its_budget(fullgraph):
    """Without warm-up (a library user who never calls ``warmup``) nothing counts as a recompile,
    but more graphs than the budget still switch the stage to eager, with the reason."""
    st = Stage("toy", lambda x: x + 1, "default", shapes=1)
    for n in range(1, st.budget + 1):
        st(torch.ones(n))
    assert st.compiled and st.graphs == st.budget and st.recompiles == 0
    st(torch.ones(50))
    assert not st.compiled and "exceed the budget" in st.fallback_reason
