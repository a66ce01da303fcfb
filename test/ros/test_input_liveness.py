"""InputWatch (no ROS): an input that stops while active is stale once, resumes once; every input
silent is "every input stopped"; an input silent since activation is reported once per activation."""

import pytest

from oxygen_ros.streams.liveness import Change, InputWatch

NAMES = ("camera base_0_rgb", "camera left_wrist_0_rgb", "joint_states")


def feed(w, t, names=NAMES):
    for n in names:
        w.seen(n, t)


def test_one_transition_each_way_and_every_input_stopped():
    w = InputWatch(NAMES, timeout_s=1.0)
    assert w.check(0.0) == [] and w.state(0.0).ages == {}  # before activation: nothing
    w.start(10.0)
    for k in range(11):  # 1 s of input at 10 Hz, checked every 0.25 s
        feed(w, 10.0 + 0.1 * k)
        assert w.check(10.0 + 0.1 * k) == []
    feed(w, 11.0, NAMES[:2])  # the joint states stop at 11.0, the cameras go on
    changes = []
    for k in range(1, 13):
        t = 11.0 + 0.25 * k
        feed(w, t, NAMES[:2])
        changes += w.check(t)
    assert changes == [Change("stale", "joint_states", pytest.approx(1.25))]  # once, not every period
    live = w.state(14.0)
    assert [n for n, _ in live.stale] == ["joint_states"] and not live.all_stopped
    assert live.ages["joint_states"] == pytest.approx(3.0) and live.ages["camera base_0_rgb"] == 0.0
    # everything stops at 14.0: every input stale, longest silence first
    live = w.state(15.5)
    assert [(n, round(s, 2)) for n, s in live.stale] == [
        ("joint_states", 4.5),
        ("camera base_0_rgb", 1.5),
        ("camera left_wrist_0_rgb", 1.5),
    ]
    assert live.all_stopped
    assert [c.name for c in w.check(15.5)] == ["camera base_0_rgb", "camera left_wrist_0_rgb"]
    assert w.check(16.0) == []
    feed(w, 16.1)  # all resume
    resumed = w.check(16.25)
    assert [(c.kind, c.name) for c in resumed] == [("resumed", n) for n in NAMES]
    assert resumed[2].seconds == pytest.approx(5.1)  # joint states: last before the gap 11.0
    assert w.check(16.5) == [] and w.state(16.5).stale == []


def test_silent_since_activation_once_per_activation_and_counts_as_stopped():
    w = InputWatch(NAMES, timeout_s=0.5)
    assert w.grace_s == 1.0
    w.start(0.0)
    for t in (0.1, 0.5, 0.9):
        feed(w, t, NAMES[1:])
        assert w.check(t) == []
    feed(w, 0.95, NAMES[1:])
    assert w.check(1.0) == [Change("never", "camera base_0_rgb", 1.0)]
    assert w.check(5.0) == [Change("stale", n, pytest.approx(4.05)) for n in NAMES[1:]]
    live = w.state(5.0)
    assert live.all_stopped and live.ages["camera base_0_rgb"] is None  # never sent + stopped
    w.start(10.0)  # re-activation: forgotten, reported again
    assert w.state(10.2).stale == [] and not w.state(10.2).all_stopped
    assert [c.name for c in w.check(11.0)] == list(NAMES)
    with pytest.raises(ValueError):
        InputWatch(NAMES, timeout_s=0.0)
