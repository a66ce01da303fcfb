"""The ingress benchmark's arithmetic: phases cut on the monotonic clock, per-phase periods, the
high/low ratios against the neighbouring low phases, the node's CPU rate per phase."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oxygen_ros.bench.ingress import _cpu_rate, phase_report
from oxygen_ros.ros.ingress.feed import phase_of


def test_phase_of_lays_phases_on_the_clock():
    assert phase_of(9.99, 10.0, 2.0, 5) == -1
    assert [phase_of(t, 10.0, 2.0, 5) for t in (10.0, 11.99, 12.0, 19.99)] == [0, 0, 1, 4]
    assert phase_of(25.0, 10.0, 2.0, 5) == 5  # after the last phase


def test_phase_report_ratios_use_both_low_neighbours_and_skip_the_settle_time():
    start, window, phases = 100.0, 4.0, 5
    periods = [0.030, 0.045, 0.036, 0.040, 0.033]  # low, high, low, high, low
    chunks = []
    for i, p in enumerate(periods):
        t = start + i * window + 0.5 * p  # a burst in the settle time must not count
        chunks += [start + i * window + 0.001 * k for k in range(5)]
        while t < start + (i + 1) * window:
            chunks.append(t)
            t += p
    diags = [
        (start + i * 0.5, {"joint_states_received": str(int(i * 0.5 * 1000)), "frame_time_p50_ms": "12.5"})
        for i in range(41)
    ]
    cpu = [(start + 0.1 * i, 0.5 * 0.1 * i) for i in range(201)]
    rep = phase_report(sorted(chunks), diags, start, window, phases, settle=1.0, cpu=cpu)
    got = [r["period_p50_ms"] for r in rep["phases"]]
    np.testing.assert_allclose(got, [p * 1e3 for p in periods], rtol=1e-6)
    assert rep["ratios"] == pytest.approx([45 / 33, 40 / 34.5])
    assert rep["ratio_median"] == pytest.approx(np.median([45 / 33, 40 / 34.5]))
    assert rep["ratio_min"] == pytest.approx(40 / 34.5) and rep["ratio_max"] == pytest.approx(45 / 33)
    assert [r["joints"] for r in rep["phases"]] == ["low", "high", "low", "high", "low"]
    assert all(r["joint_states_per_s"] == pytest.approx(1000, rel=0.2) for r in rep["phases"])
    assert all(r["node_cpu"] == pytest.approx(0.5) for r in rep["phases"])
    assert rep["ingress_cpu"] == pytest.approx(0.0, abs=1e-9)


def test_a_phase_without_chunks_gives_nan_not_a_crash():
    rep = phase_report([], [], 0.0, 1.0, 3, settle=0.1)
    assert all(math.isnan(r["period_p50_ms"]) for r in rep["phases"])
    assert math.isnan(rep["ratio_median"])
    assert math.isnan(_cpu_rate([(0.0, 0.0)], 0.0, 1.0))
