"""The chaos soak, CI length (2,000 frames; the 10,000-frame figures in docs/benchmark.md come from
``chaos_soak``): every injected fault is contained, no block leaks, the pool invariant holds after
every frame, untouched requests match the fault-free run token for token, memory stays flat."""

import pytest

from oxygen_ros.bench.injection import STAGES
from oxygen_ros.bench.soak import soak, workload


def test_workload_is_seeded_and_has_every_ingredient():
    a, b = workload(3000, 0), workload(3000, 0)
    assert [(p.asks, p.cancels, p.fault) for p in a] == [(p.asks, p.cancels, p.fault) for p in b]
    faults = [p.fault for p in a if p.fault]
    assert "nan" in faults and any(f.endswith(":oom") for f in faults)
    assert {f.split(":")[0] for f in faults if f != "nan"} >= set(STAGES) - {"vision"} or len(faults) > 10
    asks = [x for p in a for x in p.asks]
    assert any(n == 1000 for _, n, *_ in asks) and any(len(t) > 1000 for t, *_ in asks)
    assert any(p.last_step_cancel for p in a) and any(p.cancels for p in a)
    assert any(len(p.instruction) > 500 for p in a)


@pytest.mark.slow
def test_chaos_soak_ci_length():
    r = soak(frames=2000, seed=0)
    assert r["ok"], r
    assert sum(r["faults_injected"].values()) >= 8 and len(r["faults_injected"]) >= 4
    inj, got = r["faults_injected"], r["faults_contained"]
    # every injected exception was contained (vision counts as prefill, a decode forward of a new
    # request as start); a NaN row that landed on a padding row of a static batch touches no request
    assert sum(v for k, v in got.items() if k != "non_finite_logits") == sum(
        v for k, v in inj.items() if k != "non_finite_logits"
    )
    assert 1 <= got["non_finite_logits"] <= inj["non_finite_logits"]
    assert r["leaked_blocks"] == 0 and r["idle_frames_with_blocks_in_use"] == 0
    assert r["invariant_checks"] >= 2000
    cmp = r["comparison"]
    assert cmp.get("mismatched", 0) == 0 and cmp["identical"] >= 200 and cmp["touched"] >= 4
    assert r["statuses"]["rejected"] >= 5 and r["statuses"]["cancelled"] >= 5 and r["statuses"]["failed"] >= 4
    assert r["rss_mib_at_end"] - r["rss_mib_at_1000"] < 32


@pytest.mark.slow
def test_chaos_soak_concurrent_schedule_loses_no_request():
    """The soak with the two-loop schedule (issue 19): the accounting holds after every frame,
    every submitted request ends exactly once, no block leaks, and untouched requests equal the
    serial reference token for token."""
    r = soak(frames=1000, seed=1, schedule="concurrent")
    assert r["ok"], r
    assert r["requests_lost"] == 0 and r["requests_ended_twice"] == 0 and r["leaked_blocks"] == 0
    assert r["requests_submitted"] == r["requests"] >= 500
    counts = r["request_counts"]
    for row in counts.values():
        assert row["in_flight"] == 0
        assert row["submitted"] == sum(row[o] for o in ("finished", "rejected", "expired", "failed", "cancelled"))
    assert r["invariant_checks"] >= 1000 and sum(r["faults_injected"].values()) >= 3
    assert r["comparison"].get("mismatched", 0) == 0 and r["comparison"]["identical"] >= 400
