"""Real-time chunking in the engine (``core.rtc``): the leftover aligned from stamps, relative
action spaces re-expressed through a non-identity normalisation, the counted reasons for unguided
chunks, the inference-delay estimate, bad leftovers dropped with a reason, no recompile when the
delay changes, compiled equal to eager, and the paper's vector–Jacobian form against an explicit
Jacobian. Parity with LeRobot is in ``test_rtc_parity.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oxygen_ros.core.action_space import ActionSpace, ActionSpaceConfig
from oxygen_ros.core.config import ConfigError, EngineConfig
from oxygen_ros.core.engine import engine as engine_mod
from oxygen_ros.core.loops.schedules import make_engine
from oxygen_ros.core.model.flow import euler_times
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.processing import Normalizer
from oxygen_ros.core.robot_io import RobotFrames
from oxygen_ros.core.rtc.config import RTCConfig
from oxygen_ros.core.rtc.guidance import vjp_guided_velocity
from oxygen_ros.core.rtc.handover import ChunkHandover, align_leftover
from oxygen_ros.core.types import NormStats, Observation

P = 0.02  # control period, seconds
T, A = 10, 14


@pytest.fixture(scope="module")
def policy():
    return Pi05Policy.from_pretrained("pi05-tiny", device="cpu")


def obs(stamp: float, state=None, seed: int = 0) -> Observation:
    rng = np.random.default_rng(seed)
    s = rng.uniform(-1, 1, A).astype(np.float32) if state is None else np.asarray(state, np.float32)
    return Observation(
        images={"base_0_rgb": rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)},
        state=s,
        instruction="pick up the cube",
        stamp=stamp,
    )


def handover(normalizer=None, **kw) -> ChunkHandover:
    cfg = RTCConfig(enabled=True, control_period_s=P, inference_delay_mode="fixed", **kw)
    return ChunkHandover(cfg, normalizer or Normalizer.identity(A, A), T, 32, euler_times(10)[0])


def test_leftover_aligned_from_stamps():
    prev = np.random.default_rng(0).normal(size=(T, A)).astype(np.float32)
    h = handover()
    h.emitted(prev, obs(5.0), 0.01)
    rows, why = h.leftover(obs(5.0 + 3 * P))  # three periods later: row 3 is due when new row 0 is
    assert why == "guided"
    np.testing.assert_array_equal(rows, prev[3:])
    rows, _ = h.leftover(obs(5.0 + 2.5 * P))  # between rows: interpolated in time
    np.testing.assert_allclose(rows, 0.5 * (prev[2:-1] + prev[3:]), atol=1e-6)
    assert len(rows) == T - 3  # up to the previous chunk's last row
    np.testing.assert_array_equal(align_leftover(prev, 0.0), prev)
    assert h.leftover(obs(5.0 + (T - 1) * P))[0].shape == (1, A)
    assert h.leftover(obs(5.0 + T * P)) == (None, "gap")
    assert h.leftover(obs(4.9)) == (None, "time_jump")


def test_unguided_chunks_are_counted_by_reason():
    h = handover()
    x = np.zeros((T, 32), np.float32)
    for stamp, expect in (
        (1.0, "first"),
        (1.0 + P, "guided"),
        (0.5, "time_jump"),
        (0.5 + P, "first_after_jump"),
        (9.0, "gap"),
    ):
        g = h.guide(obs(stamp))
        assert g.active == (expect == "guided" or expect == "first_after_jump"), (stamp, expect)
        h.emitted(x, obs(stamp), 0.01)
    h.forget("dropped")
    assert not h.guide(obs(9.0 + P)).active
    h.emitted(x, obs(9.0 + P), 0.01)
    h.forget("reset")
    assert not h.guide(obs(9.0 + 2 * P)).active
    h.emitted(x, obs(9.0 + 2 * P), 0.01)
    assert not h.guide(obs(0.0)).active  # no stamp: nothing to align by
    assert dict(h.counts) == {
        "first": 1,
        "guided": 2,
        "time_jump": 1,
        "gap": 1,
        "dropped": 1,
        "reset": 1,
        "no_stamp": 1,
    }
    d = h.diagnostics()
    assert d["rtc_guided"] == 2 and d["rtc_unguided_gap"] == 1 and d["rtc_unguided_time_jump"] == 1


def test_delta_leftover_is_re_expressed_against_the_new_state_through_the_normaliser():
    """Delta joints: the previous chunk's absolute targets, expressed against the new state, in
    normalised space. Quantiles that are not the identity catch a normalised/unnormalised mix-up."""
    rng = np.random.default_rng(1)
    q01 = rng.uniform(-3, -1, A)
    q99 = q01 + rng.uniform(0.5, 4, A)
    norm = Normalizer(NormStats.identity(A), NormStats(np.zeros(A), np.ones(A), q01, q99))
    space = ActionSpace(ActionSpaceConfig(kind="delta", absolute_joints=("j6", "j13")), [f"j{i}" for i in range(A)])
    h = handover(norm)
    h.relative_to_state(space.delta, space.anchor)
    prev = rng.uniform(-1, 1, (T, A)).astype(np.float32)
    s0, s1 = rng.uniform(-1, 1, A), rng.uniform(-1, 1, A)
    h.emitted(prev, obs(1.0, s0), 0.01)
    rows, _ = h.leftover(obs(1.0 + 2 * P, s1))
    before = space.to_robot(norm.unnormalize_actions(prev[2:]), s0).positions  # what the robot was sent
    after = space.to_robot(norm.unnormalize_actions(rows), s1).positions  # the same targets, new anchor
    np.testing.assert_allclose(after, before, atol=1e-4)
    np.testing.assert_array_equal(rows[:, space.absolute], prev[2:, space.absolute])
    assert np.abs(rows - prev[2:]).max() > 0.1  # it did move


def test_auto_delay_is_a_latency_percentile_in_control_periods():
    h = handover(delay_percentile=90.0)
    h.cfg = RTCConfig(enabled=True, control_period_s=P, delay_percentile=90.0)  # auto
    assert h.current_delay() == 2  # no measurement yet: the configured start value
    for lat in [0.015] * 9 + [0.07]:
        h.latencies.append(lat)
    assert h.current_delay() == 2  # p90 of (0.015 ×9, 0.07) = 0.0205 s → 1.03 periods → 2
    h.latencies.extend([0.07] * 10)
    assert h.current_delay() == 4  # 0.07 s / 0.02 s = 3.5 → 4
    h.latencies.extend([5.0] * 50)
    assert h.current_delay() == T - 1  # never past the chunk


def test_config_errors_name_the_field():
    for bad in (
        dict(schedule="cubic"),
        dict(execution_horizon=0),
        dict(inference_delay=-1),
        dict(guidance="full"),
        dict(max_guidance_weight=float("inf")),
        dict(control_period_s=0.0),
        dict(delay_percentile=0.0),
    ):
        with pytest.raises(ConfigError, match="rtc." + next(iter(bad))):
            RTCConfig(**bad).validate()


def _rtc(**kw) -> RTCConfig:
    base = dict(enabled=True, inference_delay_mode="fixed", inference_delay=3, control_period_s=P)
    return RTCConfig(**{**base, **kw})


def test_engine_freezes_the_rows_executed_during_inference_in_robot_units(policy):
    """Through RobotFrames with a delta action space: the new chunk's first ``d`` rows repeat what
    the robot was already commanded for those times; without RTC they jump."""
    space = ActionSpace(ActionSpaceConfig(kind="delta", absolute_joints=("j6", "j13")), [f"j{i}" for i in range(A)])
    out = {}
    for on in (False, True):
        eng = make_engine(policy, EngineConfig(tasks=()), rtc=_rtc(enabled=on, max_guidance_weight=10.0))
        eng.handover.relative_to_state(space.delta, space.anchor)
        frames, cmds = RobotFrames(space), []
        for i in range(4):
            o = frames.observation(obs(1.0 + 4 * i * P, seed=i))
            eng.submit_observation(o)
            r = eng.step()
            cmds.append((o.stamp, frames.command(r.action).positions))
        jumps = [np.abs(cmds[i + 1][1][:3] - cmds[i][1][4:7]).max() for i in range(3)]
        out[on] = max(jumps)
        assert eng.handover.counts["guided"] == (3 if on else 0)
        assert eng.diagnostics()["rtc_switch_jump_last"] >= 0
    assert out[True] < 0.2 * out[False], out


def test_explicit_leftover_and_bad_ones(policy):
    eng = make_engine(policy, EngineConfig(tasks=()), rtc=_rtc())
    left = np.random.default_rng(2).uniform(-1, 1, (6, A)).astype(np.float32)
    eng.submit_observation(obs(1.0), prev_chunk_left_over=left, inference_delay=2)
    r = eng.step()
    assert r.error is None and eng.handover.counts["explicit"] == 1
    assert np.abs(eng.handover._last.x[:2] - left[:2]).max() < 0.3
    for bad, why in (
        (np.zeros((T + 2, A)), "rows <="),
        (np.full((3, A), np.nan), "not finite"),
        (np.zeros((3, 40)), "dims <="),
    ):
        eng.submit_observation(obs(2.0), prev_chunk_left_over=bad, inference_delay=1)
        r = eng.step()
        assert r.action is None and why in r.error, r.error
    assert eng.dropped_observations == 3 and eng.handover._last is None  # and the next is not guided


def test_changing_the_delay_never_recompiles(policy, fullgraph, no_recompile):
    eng = make_engine(policy, EngineConfig(tasks=(), num_denoise_steps=3, compile="default"), rtc=_rtc())
    eng.warmup()
    graphs = {s.name: s.graphs for s in eng.runner.stages}
    no_recompile()
    for i, d in enumerate([0, 1, 5, 9, 2]):
        eng.handover.cfg = _rtc(inference_delay=d, schedule=("linear", "exp", "ones", "zeros", "linear")[i])
        eng.submit_observation(obs(1.0 + i * 3 * P, seed=i))
        assert eng.step().error is None
    assert {s.name: s.graphs for s in eng.runner.stages} == graphs
    assert eng.handover.counts["guided"] == 4 and all(s.recompiles == 0 for s in eng.runner.stages)


@pytest.mark.slow
def test_compiled_equals_eager_with_rtc(policy):
    def run(compile_mode):
        eng = make_engine(policy, EngineConfig(tasks=(), num_denoise_steps=3, compile=compile_mode), rtc=_rtc())
        chunks = []
        for i in range(3):
            eng.submit_observation(obs(1.0 + i * 3 * P, seed=i))
            chunks.append(eng.step().action.actions)
        return chunks

    for a, b in zip(run("none"), run("default")):
        assert np.abs(a - b).max() < 1e-5


def test_vjp_form_is_the_jacobian_transpose_product(policy):
    """The paper's correction ``Jᵀ (W ⊙ (Y - x̂₁))`` with ``J = ∂x̂₁/∂x``, against the explicit Jacobian."""
    torch.manual_seed(0)
    w_in = torch.randn(T * 4, T * 4) * 0.1

    def velocity(x):  # a small nonlinear stand-in with a dense Jacobian
        return torch.tanh(x.reshape(1, -1) @ w_in).reshape(x.shape)

    x = torch.randn(1, T, 4)
    y, w = torch.randn(1, T, 4), torch.rand(1, T, 1)
    t, g = torch.tensor(0.7), torch.tensor(3.0)
    got = vjp_guided_velocity(velocity, x, t, g, y, w)
    jac = torch.autograd.functional.jacobian(lambda z: z - t * velocity(z), x).reshape(T * 4, T * 4)
    err = (w * (y - (x - t * velocity(x)))).reshape(-1)
    want = velocity(x) - g * (jac.T @ err).reshape(x.shape)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_vjp_form_in_the_engine_equals_the_policy_path(policy):
    left = np.random.default_rng(3).uniform(-1, 1, (8, A)).astype(np.float32)
    cfg = _rtc(guidance="vjp", inference_delay=2)
    noise = torch.randn(1, T, 32, generator=torch.Generator().manual_seed(5))
    ref = policy.sample_actions(obs(1.0), noise, rtc=cfg, prev_chunk_left_over=left, inference_delay=2)
    elementwise = policy.sample_actions(obs(1.0), noise, rtc=_rtc(inference_delay=2), prev_chunk_left_over=left)
    assert np.abs(ref - elementwise).max() > 1e-3  # a different guidance, not the same one twice
    mp = pytest.MonkeyPatch()
    mp.setattr(engine_mod, "frame_noise", lambda *a, **k: noise.clone())
    try:
        eng = make_engine(policy, EngineConfig(tasks=()), rtc=cfg)
        eng.submit_observation(obs(1.0), prev_chunk_left_over=left, inference_delay=2)
        got = eng.step().action.actions
    finally:
        mp.undo()
    assert np.abs(got - ref).max() < 1e-5


def test_a_delay_past_the_horizon_is_reported():
    h = handover(inference_delay=6, execution_horizon=4)
    h.guide(obs(1.0))
    assert "raise rtc.execution_horizon" in h.diagnostics()["rtc_note"]
    h = handover(inference_delay=2, execution_horizon=8)
    h.guide(obs(1.0))
    assert "rtc_note" not in h.diagnostics()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compile_mode", ["default", "reduce-overhead"])
def test_compiled_equals_eager_with_rtc_on_cuda(no_recompile, compile_mode):  # noqa: F811
    """On CUDA the whole guided S-step loop is one compiled (and, with reduce-overhead, captured)
    region: equal to eager within 1e-5 (float32), and a new delay or schedule never recompiles."""
    gpu = Pi05Policy.from_pretrained("pi05-tiny", device="cuda")

    def run(mode, check):
        eng = make_engine(gpu, EngineConfig(tasks=()), rtc=_rtc())
        if mode != "none":
            eng = make_engine(gpu, EngineConfig(tasks=(), compile=mode), rtc=_rtc())
            eng.warmup()
            if check:
                no_recompile()
        chunks = []
        for i, d in enumerate([0, 3, 7, 2]):
            eng.handover.cfg = _rtc(inference_delay=d, schedule=("linear", "exp", "ones", "zeros")[i])
            eng.submit_observation(obs(1.0 + i * 3 * P, seed=i))
            chunks.append(eng.step().action.actions)
        assert eng.handover.counts["guided"] == 3 and all(s.recompiles == 0 for s in eng.runner.stages)
        return chunks

    for a, b in zip(run("none", False), run(compile_mode, True)):
        assert np.abs(a - b).max() < 1e-5
