"""KV pool sizing: the default configuration serves the OxyGen paper's load (one 30-token request
per frame at k = 1) with a bounded queue; the configure-time message; impossible configurations."""

import pytest
from engine_inputs import make_obs

from oxygen_ros.core.cache.sizing import PoolSizeError, in_flight_requests, plan_pool
from oxygen_ros.core.config import ConfigError, EngineConfig
from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.engine.requests import RequestStatus
from oxygen_ros.core.policy import Pi05Policy


@pytest.fixture(scope="module")
def policy():
    return Pi05Policy.from_pretrained("pi05-tiny", device="cpu")


def test_in_flight_follows_rate_and_k():
    assert in_flight_requests(1.0, 30, 1, True) == (31, 30)
    assert in_flight_requests(1.0, 30, 4, True) == (9, 8)
    assert in_flight_requests(0.1, 30, 1, True) == (4, 30)
    assert in_flight_requests(2.0, 30, 1, False) == (3, 1)  # shared_kv / isolated end in their frame
    assert in_flight_requests(0.0, 30, 1, True) == (0, 30)


def test_plan_sizes_for_the_workload_within_the_budget():
    p = plan_pool(
        bytes_per_block=1000,
        prefix_blocks=10,
        own_blocks=5,
        in_flight=4,
        frames_per_request=8,
        budget_bytes=10**6,
        budget_source="1 MB",
    )
    assert p.blocks == 10 + 4 * 15 and p.sustained == 4 and p.sustained_rate == 0.5
    assert "70 blocks" in p.describe() and "holds 4 requests in flight (workload needs 4)" in p.describe()
    capped = plan_pool(
        bytes_per_block=1000,
        prefix_blocks=10,
        own_blocks=5,
        in_flight=4,
        frames_per_request=8,
        budget_bytes=40_000,
        budget_source="40 kB",
    )
    assert capped.blocks == 40 and capped.sustained == 2 and "capped by 40 kB" in capped.source
    with pytest.raises(PoolSizeError, match=r"needs 25 blocks .* = prefix 10 \+ next-frame reserve 10 \+ 5"):
        plan_pool(
            bytes_per_block=1000,
            prefix_blocks=10,
            own_blocks=5,
            in_flight=4,
            frames_per_request=8,
            budget_bytes=24_000,
            budget_source="24 kB",
        )


def test_concurrent_schedule_budgets_the_batchers_hand_over_prefix(policy):
    p = plan_pool(
        bytes_per_block=1000,
        prefix_blocks=10,
        own_blocks=5,
        in_flight=4,
        frames_per_request=8,
        budget_bytes=10**6,
        budget_source="1 MB",
        extra_prefixes=1,
    )
    assert p.blocks == 20 + 4 * 15 and p.sustained == 4
    assert (
        "action path 30 blocks (prefix + next-frame reserve + 1 prefix(es) in the batcher's hand-over)" in p.describe()
    )
    with pytest.raises(PoolSizeError, match=r"needs 35 blocks .* reserve 10 \+ batcher hand-over 10 \+ 5"):
        plan_pool(
            bytes_per_block=1000,
            prefix_blocks=10,
            own_blocks=5,
            in_flight=4,
            frames_per_request=8,
            budget_bytes=34_000,
            budget_source="34 kB",
            extra_prefixes=1,
        )
    serial = Engine(policy, EngineConfig(tokens_per_frame=1)).pool_plan
    conc = Engine(policy, EngineConfig(tokens_per_frame=1, schedule="concurrent")).pool_plan
    assert conc.blocks == serial.blocks + serial.prefix_blocks
    assert conc.sustained == serial.sustained == 31 and conc.extra_prefixes == 1 and serial.extra_prefixes == 0


def test_impossible_configuration_is_a_configure_error_naming_the_numbers(policy):
    with pytest.raises(ConfigError) as err:
        Engine(policy, EngineConfig(kv_memory_mb=0.05))
    msg = str(err.value)
    assert "cannot hold one language request beside the action path" in msg
    assert "engine.kv_memory_mb=0.05" in msg and "prefix 7 + next-frame reserve 7 + 2" in msg
    with pytest.raises(ConfigError, match="engine.kv_blocks"):
        Engine(policy, EngineConfig(kv_blocks=15))
    Engine(policy, EngineConfig(kv_blocks=16))  # exactly one request of the longest task fits


def test_configure_time_message_says_what_it_chose(policy):
    e = Engine(policy, EngineConfig(tokens_per_frame=1))
    msg = e.pool_plan.describe()
    assert e.pool_plan.in_flight == 31 and e.pool_plan.sustained == 31 and e.scheduler.max_running == 31
    assert f"{e.pool.blocks.num_blocks} blocks" in msg and "within the CPU default of 1024 MiB" in msg
    assert "1.03 requests/frame of 30 frames each" in msg


@pytest.mark.slow
def test_default_configuration_serves_one_request_per_frame_at_k1(policy):
    eng = Engine(policy, EngineConfig(tokens_per_frame=1))
    assert eng.cfg.task("conversation").max_new_tokens == 30
    ended, peak_batch = {}, 0
    for f in range(200):
        eng.submit_observation(make_obs(f % 7))
        eng.submit_request("conversation", f"what is at step {f}?", temperature=1.0, seed=f)
        r = eng.step()
        ended.update({e.id: e for e in r.ended})
        assert eng.queued <= 1, f"queue grew to {eng.queued} at frame {f}"
        peak_batch = max(peak_batch, r.metrics.decode_batch)
        if f % 20 == 0:
            eng.check_invariants()
    assert all(e.status == RequestStatus.FINISHED for e in ended.values())
    assert len(ended) >= 200 - 31
    long = [e for e in ended.values() if len(e.token_ids) == 30]
    assert long, "no request used its whole 30-token budget"
    assert peak_batch >= 25  # ~30 requests decode together at k = 1


# ------------------------------------------------------------------ memory: refused before allocating
def test_a_pool_that_cannot_fit_the_machine_is_refused_at_once_naming_its_parameter(policy):
    """engine.kv_blocks = 1e9 used to run configure for 36 s into 8 GB and a SystemError."""
    import time

    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"the largest part, KV pool, is set by engine.kv_blocks: lower it") as e:
        Engine(policy, EngineConfig(kv_blocks=10**9))
    assert time.perf_counter() - t0 < 2.0
    assert "available on the host" in str(e.value) and "KV block bookkeeping" in str(e.value)


def test_a_decode_batch_too_wide_for_the_machine_is_refused_naming_its_parameters(policy):
    with pytest.raises(ConfigError, match=r"widest decode step .* is set by engine.max_running_requests"):
        Engine(policy, EngineConfig(max_running_requests=4096, max_request_tokens=1 << 24))


def test_estimate_lists_every_allocation_and_check_fits_uses_the_available_memory(policy):
    import torch

    from oxygen_ros.core.cache.memory import check_fits, estimate
    from oxygen_ros.core.cache.sizing import size_for

    cfg = EngineConfig(max_running_requests=9)
    plan = size_for(cfg, policy.cfg, torch.float32, torch.device("cpu"))
    parts = estimate(cfg, policy.cfg, plan, torch.float32, 9, flex=False)
    assert [p.name for p in parts][:2] == ["KV pool", "KV block bookkeeping"] and parts[0].nbytes == plan.nbytes
    check_fits(parts, torch.device("cpu"))  # the default configuration fits
    with pytest.raises(ConfigError, match="needs"):
        check_fits(parts, torch.device("cpu"), share=1e-9)


def test_the_automatic_decode_batch_cap_stays_bounded_however_large_the_pool(policy):
    from oxygen_ros.core.cache.memory import AUTO_MAX_RUNNING

    eng = Engine(policy, EngineConfig(kv_blocks=200_000))
    assert eng.cfg.max_running_requests == AUTO_MAX_RUNNING


def test_a_model_that_cannot_act_fails_warm_up_with_the_reason():
    """NaN weights (or a size a stage cannot allocate) drop every frame; warm-up refuses them."""
    import torch

    from oxygen_ros.core.engine.engine import WarmupError

    nan = Pi05Policy.from_pretrained("pi05-tiny", device="cpu")
    with torch.no_grad():
        nan.model.action_out_proj.weight.fill_(float("nan"))
    eng = Engine(nan, EngineConfig())
    with pytest.raises(
        WarmupError,
        match=r"warm-up frame \(\d camera\(s\), blank images\) produced no action chunk: "
        r"action chunk dropped: .*non-finite",
    ):
        eng.warmup()
