"""Chunk switches as the replay measures them (ChunkSwitches: first executed point from the time a
chunk became available) and their lines in the replay report (no engine, no bag)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from oxygen_ros.replay.report import ReplayStats, format_report, summarize
from oxygen_ros.streams.switches import ChunkSwitches, first_executed

DT = 0.02


def rows(h: int, base: float, slope: float = 1.0, offset=(0.0, 0.0)) -> np.ndarray:
    """[h, 2]: row i = base + slope * i (+ a per-joint offset)."""
    return (base + slope * np.arange(h, dtype=np.float64))[:, None] + np.asarray(offset)[None, :]


def test_first_executed_point_is_the_first_due_at_or_after_availability():
    due = [1.02, 1.04, 1.06]
    assert first_executed(due, 1.0) == 0
    assert first_executed(due, 1.04) == 1  # due exactly then: executed
    assert first_executed(due, 1.041) == 2
    assert first_executed(due, 1.07) is None


def test_known_offset_at_the_first_executed_point():
    sw = ChunkSwitches(DT)
    assert sw.add(10.0, rows(10, 0.0), available=10.0) is None  # the first chunk: no switch
    # stamp 10.1, available 10.135: first executed point 1 (due 10.14); the old chunk there is
    # its point 6 (6.0); the new one continues it shifted by (0.3, -0.75): jump 0.75
    jump = sw.add(10.1, rows(10, 5.0, offset=(0.3, -0.75)), available=10.135)
    assert jump == pytest.approx(0.75)
    out = sw.summary()
    assert out["switches"] == 1 and out["switch_jump_median"] == pytest.approx(0.75)
    assert out["switch_jump_max"] == pytest.approx(0.75) and out["switches_after_hold"] == 0


def test_interpolation_between_points_of_the_old_chunk():
    sw = ChunkSwitches(DT)
    sw.add(10.0, rows(10, 0.0), available=10.0)  # due 10.02, 10.04, ...
    # an off-grid stamp: first point due 10.09, between the old points 3 (10.08) and 4 (10.10)
    assert sw.add(10.07, rows(10, 3.5), available=10.07) == pytest.approx(0.0)
    # then from that chunk (3.5 + i at 10.09 + 0.02 i): at 10.15 it is 6.5, the next starts at 6.0
    assert sw.add(10.13, rows(10, 6.0), available=10.13) == pytest.approx(0.5)
    assert sw.summary()["switch_jump_median"] == pytest.approx(0.25)


def test_switch_after_hold_and_never_executed_chunks_are_counted_not_measured():
    sw = ChunkSwitches(DT)
    sw.add(10.0, rows(3, 0.0), available=10.0)  # runs out after 10.06
    assert sw.add(10.1, rows(3, 9.0), available=10.15) is None  # point 2 due 10.16: after a hold
    assert sw.add(10.2, rows(3, 9.0), available=10.5) is None  # every point due before 10.5
    out = sw.summary()
    assert out["switches"] == 0 and out["switches_after_hold"] == 1
    assert out["chunks_never_executed"] == 1 and out["switch_jump_max"] is None


def _stats(switches: dict) -> ReplayStats:
    s = ReplayStats(
        meta={
            "bag": "b",
            "bag_duration_s": 1.0,
            "model": "m",
            "timing": "t",
            "horizon": 10,
            "control_period_s": DT,
            "command_kind": "position",
        }
    )
    s.switches = switches
    return s


def test_report_lines_and_json_carry_the_switch_figures(tmp_path):
    sw = ChunkSwitches(DT)
    sw.add(10.0, rows(10, 0.0), available=10.0)
    sw.add(10.1, rows(10, 5.0, offset=(0.3, -0.75)), available=10.135)
    s = _stats(sw.summary())
    text = format_report(s)
    assert (
        "  chunk switches  1 measured, switch discontinuity median 0.7500, max 0.7500 (largest "
        "joint difference at the new chunk's first executed point, position command units); "
        "0 after a hold (not measured)"
    ) in text.splitlines()
    s.save_json(tmp_path / "report.json")
    summary = json.loads((tmp_path / "report.json").read_text())["summary"]
    assert summary["chunk_switches"] == 1 and summary["switches_after_hold"] == 0
    assert summary["switch_jump_median"] == pytest.approx(0.75)
    assert summary["switch_jump_max"] == pytest.approx(0.75)


@pytest.mark.parametrize("switches", [{}, ChunkSwitches(DT).summary()])
def test_fewer_than_two_chunks_say_so_and_give_no_figure(switches):
    s = _stats(switches)
    text = format_report(s)
    assert (
        "  chunk switches  no chunk switches (fewer than 2 executed chunks); 0 after a hold "
        "(not measured)" in text.splitlines()
    )
    r = summarize(s)
    assert r["chunk_switches"] == 0 and r["switch_jump_median"] is None and r["switch_jump_max"] is None
