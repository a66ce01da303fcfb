"""Switch discontinuity (oxygen_ros.streams.switches) and its bookkeeping in the sim's
ChunkExecutor and /diagnostics values (no ROS graph)."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.sim.executor import ChunkExecutor
from oxygen_ros.streams.switches import SwitchStats, switch_jump, target_at

NAMES = ("a", "b", "c")
DT = 0.02


def make(**kw) -> ChunkExecutor:
    kw.setdefault("loss_timeout_s", 0.1)
    return ChunkExecutor(NAMES, DT, np.zeros(3), **kw)


def ramp(h: int, base: float, slope: float = 1.0, offset=(0.0, 0.0, 0.0)) -> np.ndarray:
    """[h, 3]: row i = base + slope * i (+ a per-joint offset)."""
    return (base + slope * np.arange(h, dtype=np.float64))[:, None] + np.asarray(offset)[None, :]


def offer(ex: ChunkExecutor, stamp: float, rows: np.ndarray, now: float):
    return ex.offer_trajectory(NAMES, stamp, [(i + 1) * DT for i in range(len(rows))], rows.tolist(), now)


def test_target_is_linear_interpolation_clamped_at_the_ends():
    due, pos = [1.0, 2.0, 3.0], np.array([[0.0, 10.0], [1.0, 20.0], [3.0, 20.0]])
    np.testing.assert_allclose(target_at(due, pos, 1.5), [0.5, 15.0])
    np.testing.assert_allclose(target_at(due, pos, 2.75), [2.5, 20.0])
    np.testing.assert_allclose(target_at(due, pos, 0.0), [0.0, 10.0])
    np.testing.assert_allclose(target_at(due, pos, 9.0), [3.0, 20.0])


def test_switch_jump_is_the_largest_joint_difference_at_the_switch_time():
    prev = np.array([[0.0, 0.0], [10.0, -10.0]])  # due 1, 2
    new = np.array([[5.5, -5.0], [9.0, 9.0]])  # due 1.5, 2.5
    # at 1.5: prev (5, -5), new (5.5, -5): 0.5 (interpolated, not the last point due)
    assert switch_jump([1.0, 2.0], prev, [1.5, 2.5], new, 1.5) == pytest.approx(0.5)
    # prev ran out before t (a hold): not measured
    assert switch_jump([1.0, 2.0], prev, [2.5, 3.5], new, 2.5) is None
    # within the tolerance: prev's last point (10, -10) against new (5.5, -5)
    assert switch_jump([1.0, 2.0], prev, [2.5, 3.5], new, 2.5, tolerance=0.5) == pytest.approx(5.0)


def test_stats_median_max_last_and_after_hold_never_zero_without_a_switch():
    s = SwitchStats(history=3)
    assert s.summary() == {
        "switches": 0,
        "switches_after_hold": 0,
        "switch_jump_last": None,
        "switch_jump_median": None,
        "switch_jump_max": None,
    }
    for j in (0.4, None, 0.1, 0.2, 0.3):
        s.add(j)
    out = s.summary()
    assert out["switches"] == 4 and out["switches_after_hold"] == 1
    assert out["switch_jump_last"] == 0.3 and out["switch_jump_max"] == 0.4  # max over all
    assert out["switch_jump_median"] == pytest.approx(0.2)  # over the last 3
    assert list(s.jumps) == [0.1, 0.2, 0.3]


def test_executor_measures_a_known_offset_between_two_chunks():
    ex = make()
    offer(ex, 10.0, ramp(10, 0.0), now=10.0)
    # the new chunk continues the old one shifted by a per-joint offset: the jump is the largest
    offset = (0.1, -0.5, 0.2)
    offer(ex, 10.06, ramp(10, 3.0, offset=offset), now=10.03)  # row 0 due 10.08 = old row 3 (3.0)
    for k in range(1, 8):
        ex.step(10.0 + k * DT)
    stats = ex.switch_stats(jumps=True)
    assert stats["switches"] == 1 and stats["switches_after_hold"] == 0
    for key in ("switch_jump_last", "switch_jump_median", "switch_jump_max"):
        assert stats[key] == pytest.approx(0.5)
    assert stats["switch_jumps"] == [pytest.approx(0.5)]
    assert ex.counts()["switches"] == 1 and "switches_after_hold" not in ex.counts()


def test_executor_interpolates_between_points_at_an_off_grid_step():
    ex = make()
    offer(ex, 10.0, ramp(10, 0.0), now=10.0)  # old: 0, 1, 2, ... due 10.02, 10.04, ...
    offer(ex, 10.06, ramp(10, 100.0, slope=2.0), now=10.03)  # new: 100, 102, ... from 10.08
    for k in range(1, 6):  # steps at 10.025, 10.045, ..., 10.085 (half a step after the grid)
        ex.step(10.005 + k * DT)
    # at 10.085: old 3.25 (between 3 at 10.08 and 4 at 10.10), new 100.5 -> 97.25
    assert ex.switch_stats()["switch_jump_max"] == pytest.approx(97.25)


def test_switch_after_a_hold_is_counted_not_measured():
    ex = make()
    offer(ex, 10.0, ramp(3, 0.0), now=10.0)  # runs out after 10.06
    offer(ex, 10.1, ramp(3, 50.0), now=10.05)  # first point due 10.12
    states = [ex.step(10.0 + k * DT).state.value for k in range(1, 8)]
    assert states[3:5] == ["holding", "holding"] and states[-1] == "executing"
    stats = ex.switch_stats()
    assert stats["switches"] == 0 and stats["switches_after_hold"] == 1
    assert stats["switch_jump_max"] is None and stats["switch_jump_median"] is None
    assert ex.counts()["switches_after_hold"] == 1


def test_first_chunk_and_first_chunk_after_a_reset_are_not_switches():
    ex = make(max_speed=1.0)  # the limit changes the applied command, not the chunk targets
    offer(ex, 10.0, ramp(10, 0.0), now=10.0)
    ex.step(10.02)
    ex.reset(np.zeros(3), now=10.03)
    offer(ex, 10.04, ramp(10, 7.0), now=10.04)
    for k in range(3, 7):
        ex.step(10.0 + k * DT)
    offer(ex, 10.12, ramp(10, 8.0), now=10.12)  # old chunk at 10.14: 7 + 4 = 11 -> jump 3
    for k in range(7, 10):
        ex.step(10.0 + k * DT)
    stats = ex.switch_stats()
    assert stats["switches"] == 1 and stats["switch_jump_last"] == pytest.approx(3.0)


def test_same_stamp_replacement_is_a_switch():
    ex = make()
    offer(ex, 10.0, ramp(10, 0.0), now=10.0)
    ex.step(10.02)
    offer(ex, 10.0, ramp(10, 0.25), now=10.03)  # recomputed from the same observation
    ex.step(10.04)
    assert ex.switch_stats()["switch_jump_last"] == pytest.approx(0.25)


def test_sim_status_values_carry_the_switch_figures():
    pytest.importorskip("diagnostic_msgs")
    from oxygen_ros.sim.runtime import Pacer, Rates
    from oxygen_ros.sim.status import executor_status, sim_summary

    ex = make()
    values = sim_summary(ex, Pacer(DT, 1.0, 0.5), Rates(), None, 0, 1.0)
    assert values["switches"] == 0 and values["switches_after_hold"] == 0
    assert values["switch_jump_median"] is None and values["switch_jump_max"] is None
    offer(ex, 10.0, ramp(10, 0.0), now=10.0)
    offer(ex, 10.06, ramp(10, 3.0, offset=(0.0, 0.125, 0.0)), now=10.03)
    for k in range(1, 6):
        ex.step(10.0 + k * DT)
    values = sim_summary(ex, Pacer(DT, 1.0, 0.5), Rates(), None, 0, 1.0)
    assert values["switches"] == 1 and values["switch_jump_max"] == pytest.approx(0.125)
    kv = {k.key: k.value for k in executor_status(values, "").values}
    assert float(kv["switch_jump_median"]) == pytest.approx(0.125) and kv["switches"] == "1"
    assert kv["switch_jump_last"] and kv["switches_after_hold"] == "0"
