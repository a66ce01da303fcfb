"""Engine: modes agree with each other and with the single-request policy; the KV pool stays
consistent through mixed traffic; admission control, cancellation and failures behave."""

import numpy as np
import pytest
import torch

from oxygen_ros.core.config import EngineConfig, TaskConfig
from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.engine.requests import RequestStatus
from oxygen_ros.core.model.sampling import SamplingParams
from oxygen_ros.core.policy import Pi05Policy, frame_noise
from oxygen_ros.core.rtc.config import RTCConfig
from oxygen_ros.core.types import Observation

TASKS = (
    TaskConfig("conversation", "Question: {text}\nAnswer: ", max_new_tokens=12),
    TaskConfig("narration", "", max_new_tokens=6),
    TaskConfig("memory", "Memory of {instruction}: ", max_new_tokens=5, every_n_frames=0),
)


@pytest.fixture(scope="module")
def policy():
    return Pi05Policy.from_pretrained("pi05-tiny", device="cpu")


def make_obs(i: int, masked_wrist: bool = False, instruction: str = "pick up the cube") -> Observation:
    rng = np.random.default_rng(100 + i)
    imgs = {
        "base_0_rgb": rng.integers(0, 256, (30, 40, 3), dtype=np.uint8),
        "left_wrist_0_rgb": None if masked_wrist else rng.integers(0, 256, (30, 40, 3), dtype=np.uint8),
        "right_wrist_0_rgb": rng.integers(0, 256, (30, 40, 3), dtype=np.uint8),
    }
    return Observation(
        images=imgs,
        state=rng.uniform(-1, 1, 14).astype(np.float32),
        instruction=instruction + " " * (i % 3),
        stamp=float(i),
    )


# (frame, task, text, max_new_tokens, temperature, seed)
PLAN = [
    (0, "conversation", "what do you see?", 12, 0.0, None),
    (0, "narration", "", 6, 1.0, 7),
    (1, "conversation", "where is the cube", 9, 1.0, 3),
    (3, "conversation", "hi", 12, 0.0, None),
    (3, "memory", "", 5, 1.0, 11),
]


def run_plan(policy, mode, frames=10, rtc=None, **kw):
    eng = Engine(policy, EngineConfig(mode=mode, tokens_per_frame=2, tasks=TASKS, **kw), rtc)
    actions, results, deltas, ids = [], {}, {}, {}
    for f in range(frames):
        eng.submit_observation(make_obs(f, masked_wrist=(f % 2 == 1)))
        for pf, task, text, n, temp, seed in PLAN:
            if pf == f:
                rid = eng.submit_request(task, text, n, temperature=temp, seed=seed)
                ids[rid] = (pf, task, text, n, temp, seed)
        r = eng.step()
        eng.check_invariants()
        actions.append(r.action.actions)
        for d in r.deltas:
            deltas.setdefault(d.request_id, []).append(d.text)
        for e in r.ended:
            results[e.id] = e
    assert eng.running == 0 and eng.queued == 0
    assert eng.pool.blocks.num_in_use == 0
    return actions, results, deltas, ids


def test_modes_agree_with_each_other_and_with_the_policy(policy):
    runs = {m: run_plan(policy, m) for m in ("unified", "shared_kv", "isolated")}
    ua, ur, ud, uids = runs["unified"]
    assert len(ur) == len(PLAN)
    for mode in ("shared_kv", "isolated"):
        a, r, _, _ = runs[mode]
        assert all(np.array_equal(x, y) for x, y in zip(ua, a)), mode
        assert {k: v.token_ids for k, v in r.items()} == {k: v.token_ids for k, v in ur.items()}, mode
        assert {k: v.text for k, v in r.items()} == {k: v.text for k, v in ur.items()}, mode
    texts = set()
    for rid, res in ur.items():
        pf, task, text, n, temp, seed = uids[rid]
        assert res.status == RequestStatus.FINISHED and res.frame_id == pf
        assert "".join(ud[rid]) == res.text  # streamed deltas add up to the final text
        obs = make_obs(pf, masked_wrist=(pf % 2 == 1))
        tmpl = {t.name: t.template for t in TASKS}[task]
        prompt = tmpl.format(text=text, instruction=obs.instruction)
        ref = policy.generate_text(obs, prompt, n, greedy=(temp == 0.0), sampling=SamplingParams(temp, 0, seed))
        assert ref.token_ids == res.token_ids, rid
        assert ref.text == res.text
        texts.add(tuple(res.token_ids))
    assert len(texts) > 1
    # Frame f's chunk is the policy's chunk for the same noise: within 1e-5 with the prefix padded
    # to its static bucket (masked keys change the summation order only), bit-exact without.
    ref = policy.sample_actions(make_obs(2), noise=frame_noise(0, 2, policy.cfg.action_horizon, policy.cfg.action_dim))
    assert np.abs(ref - ua[2]).max() < 1e-5
    exact, _, _, _ = run_plan(policy, "unified", static_shapes=False)
    assert np.array_equal(ref, exact[2])


def test_modes_agree_with_rtc_on(policy):
    """The mode-equivalence suite with real-time chunking: every mode guides the same chunks the
    same way (fixed delay), text untouched by it; frame 0 is the plain chunk (nothing to follow)."""
    rtc = RTCConfig(
        enabled=True, schedule="exp", inference_delay_mode="fixed", inference_delay=1, control_period_s=0.25
    )
    runs = {m: run_plan(policy, m, rtc=rtc) for m in ("unified", "shared_kv", "isolated")}
    plain = run_plan(policy, "unified")
    for mode in ("shared_kv", "isolated"):
        assert all(np.array_equal(x, y) for x, y in zip(runs["unified"][0], runs[mode][0])), mode
        assert {k: v.token_ids for k, v in runs[mode][1].items()} == {k: v.token_ids for k, v in plain[1].items()}
    guided = runs["unified"][0]  # frame 0: nothing to follow; frame 1: frame 0 has no stamp (0.0)
    assert np.array_equal(guided[0], plain[0][0]) and np.array_equal(guided[1], plain[0][1])
    assert all(not np.array_equal(g, p) for g, p in zip(guided[2:], plain[0][2:]))


def test_unified_spreads_decoding_over_frames(policy):
    eng = Engine(policy, EngineConfig(tokens_per_frame=1, tasks=TASKS))
    eng.submit_observation(make_obs(0))
    rid = eng.submit_request("conversation", "x", 6)
    frames = 0
    done = None
    while done is None:
        eng.submit_observation(make_obs(frames))
        r = eng.step()
        frames += 1
        assert r.action is not None and r.metrics.decode_steps <= 1
        done = next((e for e in r.ended if e.id == rid), None)
        assert frames < 20
    assert frames >= 5  # 1 token at admission + 1 per frame


def test_history_independence(policy):
    def run(with_traffic: bool, warmup_frames: int):
        eng = Engine(policy, EngineConfig(tokens_per_frame=3, tasks=TASKS))
        for f in range(warmup_frames):
            eng.submit_observation(make_obs(50 + f))
            if with_traffic:
                eng.submit_request("conversation", f"earlier {f}", 7, temperature=1.0, seed=f)
            eng.step()
        eng.submit_observation(make_obs(7))
        target = eng.submit_request("conversation", "what now?", 10, temperature=1.0, seed=99)
        if with_traffic:
            eng.submit_request("narration", "", 6)
        for f in range(12):
            r = eng.step()
            for e in r.ended:
                if e.id == target:
                    return e.token_ids
            eng.submit_observation(make_obs(60 + f))
        raise AssertionError("target never finished")

    alone = run(False, 0)
    assert run(True, 0) == alone
    assert run(True, 4) == alone
    assert run(False, 3) == alone


def test_invariants_through_mixed_traffic_and_small_pool(policy):
    rng = np.random.default_rng(5)
    prefix_blocks = -(-policy.cfg.max_prefix_len // 8)
    eng = Engine(
        policy,
        EngineConfig(
            tasks=TASKS,
            block_size=8,
            kv_blocks=2 * prefix_blocks + 6,
            max_running_requests=4,
            max_queued_requests=2,
            tokens_per_frame=2,
        ),
    )
    statuses, live = {}, []
    stop_ids = tuple(int(x) for x in rng.choice(np.arange(4, 512), 40, replace=False))
    for f in range(60):
        eng.submit_observation(make_obs(f, masked_wrist=bool(f % 3 == 0)))
        for _ in range(int(rng.integers(0, 3))):
            n = int(rng.choice([3, 8, 40, 200]))
            live.append(eng.submit_request("conversation", f"q{f}", n, temperature=1.0, seed=f, stop_ids=stop_ids))
        live = [i for i in live if eng.book.is_live(i)]
        if live and rng.random() < 0.2:
            eng.cancel(int(rng.choice(live)))
        r = eng.step()
        assert r.action is not None and np.isfinite(r.action.actions).all()
        eng.check_invariants()
        assert r.metrics.blocks_in_use == eng.pool.blocks.num_in_use
        for e in r.ended:
            statuses[e.id] = e
    while eng.running or eng.queued:
        eng.submit_observation(make_obs(0))
        eng.step()
        eng.check_invariants()
    assert eng.pool.blocks.num_in_use == 0 and eng.pool.blocks.num_free == eng.pool.blocks.num_blocks
    kinds = {e.status for e in statuses.values()}
    assert {RequestStatus.FINISHED, RequestStatus.CANCELLED, RequestStatus.REJECTED} <= kinds
    reasons = {e.reason for e in statuses.values()}
    assert {"length", "stop"} <= reasons
    assert any("KV blocks" in x for x in reasons) and any("queue full" in x for x in reasons)


def test_pool_full_queues_then_completes_intact(policy):
    prefix_blocks = -(-policy.cfg.max_prefix_len // 8)
    eng = Engine(policy, EngineConfig(tasks=TASKS, block_size=8, kv_blocks=2 * prefix_blocks + 4, tokens_per_frame=4))
    eng.submit_observation(make_obs(0))
    ids = [eng.submit_request("conversation", "hello", 12) for _ in range(3)]  # 3 blocks each
    r = eng.step()
    assert eng.running == 1 and eng.queued == 2  # only one fits next to the reserve
    ended = {e.id: e for e in r.ended}
    for f in range(1, 30):
        eng.submit_observation(make_obs(f))
        r = eng.step()
        assert r.action is not None
        eng.check_invariants()
        ended.update({e.id: e for e in r.ended})
        if len(ended) == 3:
            break
    assert all(ended[i].status == RequestStatus.FINISHED for i in ids)
    for i in ids:  # each continues the prefix of the frame it was admitted on, intact
        fid = ended[i].frame_id
        ref = policy.generate_text(make_obs(fid), "Question: hello\nAnswer: ", 12)
        assert ref.token_ids == ended[i].token_ids
    assert eng.pool.blocks.num_in_use == 0


def test_cancel_mid_stream(policy):
    eng = Engine(policy, EngineConfig(tokens_per_frame=2, tasks=TASKS))
    baseline = None
    eng.submit_observation(make_obs(0))
    rid = eng.submit_request("conversation", "talk", 30, temperature=1.0, seed=1)
    got = []
    for f in range(3):
        r = eng.step()
        baseline = baseline if baseline is not None else eng.pool.blocks.num_in_use
        got += [d for d in r.deltas if d.request_id == rid]
        eng.submit_observation(make_obs(f + 1))
    assert got and eng.running == 1
    assert eng.cancel(rid)
    r = eng.step()
    assert not [d for d in r.deltas if d.request_id == rid]
    (res,) = [e for e in r.ended if e.id == rid]
    assert res.status == RequestStatus.CANCELLED and res.reason == "cancelled"
    assert eng.pool.blocks.num_in_use == 0
    eng.check_invariants()
    assert not eng.cancel(rid)  # already over
    assert not eng.cancel(12345)


def test_bad_observation_is_dropped_and_counted(policy):
    eng = Engine(policy, EngineConfig(tasks=TASKS))
    bad = make_obs(0)
    bad.state[3] = np.nan
    eng.submit_observation(bad)
    r = eng.step()
    assert r.action is None and "observation dropped" in r.error and "state" in r.error
    assert eng.dropped_observations == 1
    eng.submit_observation(make_obs(1))
    assert eng.step().action is not None


def test_non_finite_distribution_fails_only_that_request(policy, monkeypatch):
    eng = Engine(policy, EngineConfig(tokens_per_frame=2, tasks=TASKS))
    eng.submit_observation(make_obs(0))
    good = eng.submit_request("conversation", "a", 6)
    bad = eng.submit_request("conversation", "b", 6)
    real = policy.model.decode_step

    def poisoned(view, ids, valid):
        out = real(view, ids, valid)
        if out.shape[0] == 2:
            out[1] = float("nan")  # the second row is the 'bad' request
        return out

    monkeypatch.setattr(policy.model, "decode_step", poisoned)
    r = eng.step()
    monkeypatch.setattr(policy.model, "decode_step", real)
    ended = {e.id: e for e in r.ended}
    assert ended[bad].status == RequestStatus.FAILED and "non-finite" in ended[bad].reason
    assert good not in ended or ended[good].status == RequestStatus.FINISHED
    eng.check_invariants()


def test_periodic_task_and_bad_requests(policy):
    tasks = TASKS[:2] + (TaskConfig("memory", "Memory: ", max_new_tokens=3, every_n_frames=3),)
    eng = Engine(policy, EngineConfig(tasks=tasks, tokens_per_frame=4))
    seen = []
    for f in range(7):
        eng.submit_observation(make_obs(f))
        seen += [e for e in eng.step().ended if e.task == "memory"]
    assert [e.frame_id for e in seen] == [0, 3, 6]
    with pytest.raises(KeyError, match="unknown language task"):
        eng.submit_request("nope")
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.submit_request("conversation", "x", 0)
    with pytest.raises(ValueError, match="temperature"):
        eng.submit_request("conversation", "x", 3, temperature=-1.0)


def test_request_before_any_observation_waits(policy):
    eng = Engine(policy, EngineConfig(tasks=TASKS))
    rid = eng.submit_request("conversation", "early", 3)
    r = eng.step()
    assert r.action is None and r.error is None and eng.queued == 1
    eng.submit_observation(make_obs(0))
    r = eng.step()
    assert any(e.id == rid for e in r.ended) or eng.running == 1


def test_adaptive_budget_uses_measured_costs(policy):
    eng = Engine(policy, EngineConfig(decode_budget="adaptive", frame_deadline_s=10.0, max_decode_steps=5, tasks=TASKS))
    eng.submit_observation(make_obs(0))
    eng.submit_request("conversation", "x", 12)
    steps = []
    for f in range(3):
        r = eng.step()
        steps.append(r.metrics.decode_steps)
        eng.submit_observation(make_obs(f + 1))
    assert steps[0] == 1 and steps[1] == 5  # first frame measures, then fills the budget


def test_metrics_are_filled(policy):
    eng = Engine(policy, EngineConfig(tasks=TASKS))
    eng.submit_observation(make_obs(0))
    eng.submit_request("conversation", "x", 4)
    m = eng.step().metrics
    assert m.frame_time > 0 and m.vision > 0 and m.prefill > 0 and m.denoise > 0 and m.decode > 0
    assert m.decode_batch == 1 and m.tokens_emitted >= 1 and m.blocks_total == eng.pool.blocks.num_blocks
    assert m.frame_time >= m.vision + m.prefill + m.denoise + m.decode


def test_engine_reproducible_across_instances(policy):
    a = run_plan(policy, "unified")
    b = run_plan(policy, "unified")
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0]))
    assert {k: v.token_ids for k, v in a[1].items()} == {k: v.token_ids for k, v in b[1].items()}
    assert torch.get_default_dtype() == torch.float32


def test_warmup_leaves_no_trace(policy):
    eng = Engine(policy, EngineConfig(tasks=TASKS))
    eng.warmup(2)
    assert eng.frame_id == 0 and eng.pool.blocks.num_in_use == 0 and eng.running == 0 and eng.queued == 0
    eng.submit_observation(make_obs(0))
    cold = Engine(policy, EngineConfig(tasks=TASKS))
    cold.submit_observation(make_obs(0))
    assert np.array_equal(eng.step().action.actions, cold.step().action.actions)


def test_isolated_metrics_count_private_prefills_and_decode_once(policy):
    eng = Engine(policy, EngineConfig(mode="isolated", tasks=TASKS))
    eng.submit_observation(make_obs(0))
    eng.submit_request("conversation", "a", 4)
    eng.submit_request("conversation", "b", 4)
    stages = []
    real = eng.runner.prefill

    def counting(*a, **k):
        out = real(*a, **k)
        stages.append(out.stage_times)
        return out

    eng.runner.prefill = counting
    m_iso = eng.step().metrics
    assert len(stages) == 3  # the action prefill plus one private copy per request
    assert abs(m_iso.prefill - sum(st["prefill"] for st in stages)) < 1e-9
    assert abs(m_iso.vision - sum(st["vision"] for st in stages)) < 1e-9
    assert m_iso.decode_steps > 0 and m_iso.decode > 0
    assert 0.0 <= m_iso.extra["start"] < m_iso.frame_time
    total = m_iso.vision + m_iso.prefill + m_iso.denoise + m_iso.decode + m_iso.extra["start"] + m_iso.bookkeeping
    assert abs(total - m_iso.frame_time) < 1e-6


@pytest.mark.parametrize("mode", ["unified", "shared_kv", "isolated"])
def test_bucketed_shapes_and_flex_attention_equal_exact_shapes(policy, mode):
    """Static shapes (prefix padded to its camera bucket, decode batches padded to size buckets,
    fixed block-table width) and FlexAttention decode give the exact-shape gather results: actions
    within 1e-5, identical greedy and seeded tokens."""
    exact = run_plan(policy, mode, frames=10, static_shapes=False, attention="gather")
    for kw in ({"static_shapes": True, "attention": "gather"}, {"static_shapes": True, "attention": "flex"}):
        got = run_plan(policy, mode, frames=10, **kw)
        assert all(np.abs(a - b).max() < 1e-5 for a, b in zip(exact[0], got[0])), kw
        assert {k: v.token_ids for k, v in exact[1].items()} == {k: v.token_ids for k, v in got[1].items()}, kw


@pytest.mark.slow
def test_pi05_small_bucketed_flex_equals_exact_gather():
    """One focused check at pi05-small's real token counts (3 × 256 image tokens, 200 prompt)."""
    small = Pi05Policy.from_pretrained("pi05-small", device="cpu", config_overrides={"action_horizon": 10})
    runs = []
    for kw in ({"static_shapes": False, "attention": "gather"}, {"static_shapes": True, "attention": "flex"}):
        eng = Engine(small, EngineConfig(tokens_per_frame=3, tasks=TASKS, num_denoise_steps=3, **kw))
        acts, toks = [], {}
        for f in range(4):
            eng.submit_observation(make_obs(f, masked_wrist=f % 2 == 1))
            if f < 2:
                eng.submit_request("conversation", "what?", 5)
                eng.submit_request("narration", "", 4, temperature=1.0, seed=f)
            r = eng.step()
            acts.append(r.action.actions)
            toks.update({e.id: e.token_ids for e in r.ended})
        runs.append((acts, toks))
    assert all(np.abs(a - b).max() < 1e-5 for a, b in zip(runs[0][0], runs[1][0]))
    assert runs[0][1] == runs[1][1] and len(runs[0][1]) == 4
