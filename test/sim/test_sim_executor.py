"""ChunkExecutor: time alignment, replacement, rejection, safe hold / loss / resume (no ROS)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oxygen_ros.sim.executor import ChunkExecutor, ExecState, Verdict

NAMES = ("a", "b", "c")
DT = 0.02
HOME = np.zeros(3)


def make(**kw) -> ChunkExecutor:
    kw.setdefault("loss_timeout_s", 0.1)
    return ChunkExecutor(NAMES, DT, HOME, **kw)


def chunk(h: int = 5, base: float = 1.0) -> np.ndarray:
    """[h, 3]: row i = base + i (every joint), easy to recognise."""
    return np.repeat((base + np.arange(h, dtype=np.float64))[:, None], 3, axis=1)


def tfs(h: int = 5) -> list[float]:
    return [(i + 1) * DT for i in range(h)]


def offer(ex: ChunkExecutor, stamp: float, rows: np.ndarray, now: float, names=NAMES, times=None) -> Verdict:
    return ex.offer_trajectory(names, stamp, tfs(len(rows)) if times is None else times, rows.tolist(), now)


def test_points_are_executed_when_due():
    ex = make()
    assert offer(ex, 10.0, chunk(), now=10.0) is Verdict.ACCEPTED
    first = ex.step(10.0)  # nothing due yet: still waiting on the start pose
    assert first.state is ExecState.WAITING and np.array_equal(first.positions, HOME)
    for k in range(1, 6):
        cmd = ex.step(10.0 + k * DT)
        assert cmd.state is ExecState.EXECUTING and cmd.index == k - 1
        assert cmd.positions[0] == pytest.approx(k)  # row k-1 = 1 + (k-1)
        assert cmd.chunk_age == pytest.approx(k * DT)
    counts = ex.counts()
    assert counts["chunks_executed"] == 1 and counts["executed_steps"] == 5
    assert counts["late_points"] == 0


def test_half_step_tolerance_absorbs_stamp_rounding():
    ex = make()
    offer(ex, 10.0, chunk(), now=10.0)
    assert ex.step(10.0 + DT - 0.009).index == 0  # just before due, within half a step
    assert ex.step(10.0 + 2 * DT + 0.009).index == 1  # just after the next due is still 1


def test_newer_chunk_replaces_the_rest_of_the_old_one_from_its_start():
    ex = make()
    offer(ex, 10.0, chunk(10, base=0.0), now=10.0)
    assert offer(ex, 10.06, chunk(10, base=100.0), now=10.03) is Verdict.ACCEPTED
    got = [ex.step(10.0 + k * DT).positions[0] for k in range(1, 7)]
    # old chunk at 10.02, 10.04, 10.06; new chunk's first point is due at 10.08
    assert got == pytest.approx([0.0, 1.0, 2.0, 100.0, 101.0, 102.0])
    assert ex.counts()["chunks_executed"] == 2


def test_older_and_out_of_order_chunks_are_dropped_and_counted():
    ex = make()
    offer(ex, 10.1, chunk(base=50.0), now=10.1)
    assert offer(ex, 10.0, chunk(base=-50.0), now=10.1) is Verdict.OUT_OF_ORDER
    for k in range(1, 6):
        assert ex.step(10.1 + k * DT).positions[0] >= 50.0  # the older one never runs
    assert ex.counts()["out_of_order"] == 1


def test_same_stamp_replaces_the_chunk():
    ex = make()
    offer(ex, 10.0, chunk(base=1.0), now=10.0)
    assert ex.step(10.02).positions[0] == 1.0
    assert offer(ex, 10.0, chunk(base=7.0), now=10.03) is Verdict.ACCEPTED
    assert ex.step(10.04).positions[0] == 8.0  # same due times, new values
    assert ex.counts()["same_stamp"] == 1


def test_late_chunk_starts_at_the_point_due_now():
    ex = make()
    ex.step(10.0)
    assert offer(ex, 10.0, chunk(), now=10.061) is Verdict.ACCEPTED
    cmd = ex.step(10.06)
    assert cmd.index == 2 and cmd.positions[0] == 3.0
    assert ex.counts()["late_points"] == 2


def test_a_chunk_entirely_in_the_past_expires():
    ex = make()
    assert offer(ex, 10.0, chunk(5), now=10.2) is Verdict.EXPIRED
    assert ex.step(10.2).state is ExecState.WAITING
    assert ex.counts()["expired"] == 1


def test_joint_order_follows_the_names():
    ex = make()
    rows = np.array([[1.0, 2.0, 3.0]] * 3)
    offer(ex, 10.0, rows, now=10.0, names=("c", "a", "b"))
    np.testing.assert_array_equal(ex.step(10.02).positions, [2.0, 3.0, 1.0])


@pytest.mark.parametrize(
    "names, rows, times, verdict",
    [
        (("a", "b"), [[0, 0]], [0.02], Verdict.BAD_NAMES),
        (("a", "b", "x"), [[0, 0, 0]], [0.02], Verdict.BAD_NAMES),
        (("a", "a", "b"), [[0, 0, 0]], [0.02], Verdict.BAD_NAMES),
        (("a", "b", "c"), [[0, 0]], [0.02], Verdict.BAD_SHAPE),
        (("a", "b", "c"), [], [], Verdict.BAD_SHAPE),
        (("a", "b", "c"), [[0, 0, 0], [0, 0, 0]], [0.02], Verdict.BAD_SHAPE),
        (("a", "b", "c"), [[0, math.nan, 0]], [0.02], Verdict.NON_FINITE),
        (("a", "b", "c"), [[0, math.inf, 0]], [0.02], Verdict.NON_FINITE),
        (("a", "b", "c"), [[0, 0, 0]], [math.nan], Verdict.NON_FINITE),
        (("a", "b", "c"), [[0, 0, 0], [1, 1, 1]], [0.04, 0.02], Verdict.BAD_TIMES),
        (("a", "b", "c"), [[0, 0, 0], [1, 1, 1]], [0.02, 0.02], Verdict.BAD_TIMES),
        (("a", "b", "c"), [[0, 0, 0]], [-0.02], Verdict.BAD_TIMES),
        (("a", "b", "c"), [["x", 0, 0]], [0.02], Verdict.BAD_SHAPE),
    ],
)
def test_malformed_chunks_are_rejected_counted_and_never_executed(names, rows, times, verdict):
    ex = make()
    got = ex.offer_trajectory(names, 10.0, times, rows, 10.0)
    assert got is verdict and got.rejected
    assert ex.counts()[verdict.value] == 1
    for k in range(1, 4):
        cmd = ex.step(10.0 + k * DT)
        assert cmd.state is ExecState.WAITING and np.array_equal(cmd.positions, HOME)


def test_hold_then_loss_then_resume_without_a_jump():
    ex = make(max_speed=5.0)  # 0.1 per step
    offer(ex, 10.0, chunk(3, base=0.0) * 0.01, now=10.0)  # small moves: never limited
    for k in range(1, 4):
        ex.step(10.0 + k * DT)
    last = ex.last_command
    events, states = [], []
    for k in range(4, 15):
        cmd = ex.step(10.0 + k * DT)
        assert np.array_equal(cmd.positions, last) and np.isfinite(cmd.positions).all()
        events.append(cmd.event)
        states.append(cmd.state)
    # held from 10.08; loss once the hold reaches 0.1 s (at 10.18), reported once
    assert states[0] is ExecState.HOLDING and states[-1] is ExecState.LOST
    assert events.count("loss") == 1 and ex.counts()["losses"] == 1
    # the policy comes back with a far-away plan: the speed limit prevents a jump
    offer(ex, 10.3, chunk(5, base=3.0), now=10.31)
    prev = ex.last_command
    cmd = ex.step(10.32)
    assert cmd.event == "resumed" and cmd.state is ExecState.EXECUTING and cmd.limited
    assert np.max(np.abs(cmd.positions - prev)) == pytest.approx(0.1)
    assert ex.counts()["resumes"] == 1


def test_waiting_never_becomes_a_loss():
    ex = make()
    for k in range(100):
        cmd = ex.step(10.0 + k * DT)
        assert cmd.state is ExecState.WAITING and not cmd.event


def test_speed_limit_bounds_every_step():
    ex = make(max_speed=2.0)
    rng = np.random.default_rng(0)
    offer(ex, 10.0, rng.normal(0, 3, (20, 3)), now=10.0)
    prev = ex.last_command
    for k in range(1, 25):
        cmd = ex.step(10.0 + k * DT)
        assert np.max(np.abs(cmd.positions - prev)) <= 2.0 * DT + 1e-12
        prev = cmd.positions


def test_reset_drops_chunks_holds_the_pose_and_refuses_stale_ones():
    ex = make()
    offer(ex, 10.0, chunk(10), now=10.0)
    ex.step(10.02)
    pose = np.array([0.5, -0.5, 0.25])
    ex.reset(pose, now=10.05)
    cmd = ex.step(10.06)
    assert cmd.state is ExecState.WAITING and np.array_equal(cmd.positions, pose)
    assert offer(ex, 10.04, chunk(10), now=10.07) is Verdict.STALE  # computed before the reset
    assert offer(ex, 10.05, chunk(10), now=10.07) is Verdict.STALE  # from the pre-reset state
    assert offer(ex, 10.06, chunk(10, base=9.0), now=10.07) is Verdict.ACCEPTED
    assert ex.step(10.08).positions[0] == 9.0
    with pytest.raises(ValueError):
        ex.reset([0.0, math.nan, 0.0], now=11.0)


def test_stream_source_applies_fresh_commands_and_holds_stale_ones():
    ex = make(source="stream", stream_timeout_s=0.05)
    assert offer(ex, 10.0, chunk(), now=10.0) is Verdict.WRONG_SOURCE
    assert ex.offer_command(("c", "b", "a"), 10.0, [3.0, 2.0, 1.0], 10.0) is Verdict.ACCEPTED
    np.testing.assert_array_equal(ex.step(10.0).positions, [1.0, 2.0, 3.0])
    assert ex.offer_command(None, 10.02, [4.0, 5.0, 6.0], 10.02) is Verdict.ACCEPTED
    assert ex.offer_command(None, 10.01, [7.0, 7.0, 7.0], 10.02) is Verdict.OUT_OF_ORDER
    assert ex.offer_command(None, 9.0, [7.0, 7.0, 7.0], 10.02) is Verdict.OUT_OF_ORDER
    assert ex.offer_command(None, 10.03, [math.nan, 0.0, 0.0], 10.03) is Verdict.NON_FINITE
    assert ex.step(10.02).positions[2] == 6.0
    states = [ex.step(10.02 + k * DT) for k in range(1, 12)]
    assert all(s.positions[2] == 6.0 for s in states)
    assert states[-1].state is ExecState.LOST and sum(s.event == "loss" for s in states) == 1
    ex2 = make(source="stream")
    assert ex2.offer_trajectory(NAMES, 1.0, [0.02], [[0, 0, 0]], 1.0) is Verdict.WRONG_SOURCE
    assert ex2.offer_command(None, 1.0, [1.0, 2.0], 1.0) is Verdict.BAD_SHAPE
    assert ex2.offer_command(None, 0.5, [1.0, 2.0, 3.0], 1.0) is Verdict.EXPIRED


def test_garbage_never_raises_and_commands_stay_finite():
    ex = make(max_speed=3.0)
    rng = np.random.default_rng(1)
    now = 10.0
    junk_values = [math.nan, math.inf, -math.inf, 1e300, -1e300, 0.0, 1.0]
    for _ in range(300):
        now += DT
        h = int(rng.integers(0, 4))
        rows = rng.choice(junk_values, size=(h, int(rng.integers(2, 5)))).tolist()
        names = list(rng.choice(["a", "b", "c", "d"], size=int(rng.integers(0, 5))))
        times = rng.choice([0.02, -1.0, math.nan, 0.04, 0.06], size=h).tolist()
        ex.offer_trajectory(names, now + float(rng.normal(0, 0.1)), times, rows, now)
        ex.offer_trajectory(NAMES, now, tfs(3), [[1e300, 0.0, 0.0]] * 3, now)  # finite but huge
        cmd = ex.step(now)
        assert np.isfinite(cmd.positions).all()
    assert ex.counts()["steps"] == 300


def test_constructor_validates():
    with pytest.raises(ValueError):
        ChunkExecutor((), DT, [])
    with pytest.raises(ValueError):
        ChunkExecutor(("a", "a"), DT, [0, 0])
    with pytest.raises(ValueError):
        ChunkExecutor(NAMES, 0.0, HOME)
    with pytest.raises(ValueError):
        ChunkExecutor(NAMES, DT, [0.0, 0.0])
    with pytest.raises(ValueError):
        ChunkExecutor(NAMES, DT, HOME, source="bogus")
    with pytest.raises(ValueError):
        ChunkExecutor(NAMES, DT, HOME, max_speed=-1.0)


def test_age_statistics():
    ex = make()
    assert math.isnan(ex.age_stats()["chunk_age_p50_ms"])
    offer(ex, 10.0, chunk(), now=10.03)
    for k in range(1, 6):
        ex.step(10.0 + k * DT)
    stats = ex.age_stats()
    assert stats["arrival_latency_p50_ms"] == pytest.approx(30.0)
    assert stats["chunk_age_max_ms"] == pytest.approx(100.0)
