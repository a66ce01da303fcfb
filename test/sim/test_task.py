"""The transfer-cube task without ROS: the success detector on scripted and frozen episodes, its
parameters, and the oracle policy's chunks."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mujoco")
pytest.importorskip("gym_aloha")

from oxygen_ros.sim.scene import CUBE_REST_Z, SimScene  # noqa: E402
from oxygen_ros.sim.task.oracle import OracleScript, script_chunk  # noqa: E402
from oxygen_ros.sim.task.script import ScriptedPickLift  # noqa: E402
from oxygen_ros.sim.task.success import LiftSuccess  # noqa: E402

DT = 0.02


@pytest.fixture(scope="module")
def scene():
    s = SimScene(cameras=())
    yield s
    s.close()


def _episode(scene, seed, command, steps=500, **params):
    """Step the scene at 50 Hz with ``command(t, q0)``; returns the detector, the success step's
    time and the sim time when the cube first reached the lift height."""
    q0 = scene.reset(seed)
    det = LiftSuccess(**params)
    t_success = t_lifted = None
    for _ in range(steps):
        q = scene.step(command(scene.time, q0))
        z = scene.cube_position[2]
        if det.update(scene.time, z, q, scene.reward):
            t_success = scene.time
        if t_lifted is None and det._landed and z - CUBE_REST_Z >= det.lift_height_m:
            t_lifted = scene.time
    return det, t_success, t_lifted


def test_the_scripted_pick_and_lift_succeeds_after_lift_plus_hold(scene):
    scene.reset(0)
    script = ScriptedPickLift(scene)
    det, t_success, t_lifted = _episode(scene, 0, lambda t, _q0: script(t))
    s = det.summary()
    assert s["success"] is True and t_success is not None and t_lifted is not None
    # the hold completes lift_hold_s after the first lifted step; episode time starts at step 1
    assert t_success == pytest.approx(t_lifted + 1.0, abs=1e-6)
    assert s["success_time_s"] == pytest.approx(t_success - DT, abs=1e-6)
    assert 5.5 < s["success_time_s"] < 8.0
    assert s["lift_max_m"] >= 0.15
    assert s["max_reward"] >= 2  # gym-aloha's "lifted"
    assert s["episode_time_s"] == pytest.approx(500 * DT - DT, abs=1e-6)
    assert 3.0 < s["path_length_rad"] < 8.0 and s["gripper_path_length"] > 1.0


def test_a_frozen_robot_fails_with_no_lift_and_no_path(scene):
    det, t_success, _ = _episode(scene, 1, lambda _t, q0: q0, steps=300)
    s = det.summary()
    assert s["success"] is False and s["success_time_s"] is None and t_success is None
    assert s["lift_max_m"] == pytest.approx(0.0, abs=2e-3)  # the 5 cm spawn drop does not count
    assert s["path_length_rad"] < 0.05  # only the arms settling under the position servos
    assert s["max_reward"] == 0


def test_a_lift_shorter_than_the_hold_is_not_a_success():
    det = LiftSuccess(lift_height_m=0.05, lift_hold_s=1.0)
    q = np.zeros(14)
    t = 0.0
    zs = [0.02] * 10 + [0.1] * 49 + [0.02] * 10 + [0.1] * 49  # two 0.98 s lifts with a break
    for z in zs:
        t += DT
        assert not det.update(t, z, q, 2.0)
    assert not det.success and det.lift_max == pytest.approx(0.08)
    for _ in range(2):  # 51 lifted steps: first lifted at k, success at k + 50 (1.0 s)
        t += DT
        ok = det.update(t, 0.1, q)
    assert ok and det.success and det.max_reward == 2.0
    assert not det.update(t + DT, 0.1, q)  # reported once


def test_height_threshold_start_gating_and_parameter_checks():
    q = np.zeros(14)
    det = LiftSuccess(lift_height_m=0.2, lift_hold_s=0.0)
    assert not det.update(0.02, 0.02, q)
    assert not det.update(0.04, 0.19, q)  # 0.17 m < 0.2 m
    assert det.update(0.06, 0.23, q) and det.success_time == pytest.approx(0.04)
    gated = LiftSuccess(lift_hold_s=0.0)
    assert not gated.update(0.02, 0.02, q, started=False)  # before the episode start: nothing
    assert gated.summary()["episode_started"] is False and gated.episode_time == 0.0
    assert not gated.update(0.1, 0.05, q, started=False)
    assert not gated.update(0.2, 0.05, q)  # not landed yet: the spawn height is no lift
    assert gated.lift_max == 0.0 and not gated.success
    gated.reset()
    assert gated.start is None
    for bad in ({"lift_height_m": 0.0}, {"lift_hold_s": -1.0}):
        with pytest.raises(ValueError):
            LiftSuccess(**bad)


def test_oracle_chunks_follow_the_script_at_the_due_times(scene):
    oracle = OracleScript(seed=2, horizon=50, period_s=DT)
    try:
        scene.reset(2)
        script = ScriptedPickLift(scene)
        first = oracle.chunk(1000.0)  # script time 0 = the first observation
        assert first.shape == (50, 14)
        np.testing.assert_allclose(first[0], script(DT), atol=1e-9)
        np.testing.assert_allclose(first[-1], script(50 * DT), atol=1e-9)
        later = oracle.chunk(1004.5)
        for i in (0, 17, 49):
            np.testing.assert_allclose(later[i], script(4.5 + (i + 1) * DT), atol=1e-9)
        np.testing.assert_allclose(
            script_chunk(script, 10.0, 5.0, 3, 0.1), np.stack([script(5.1), script(5.2), script(5.3)])
        )
        # a sim reset: the next seed, script time 0 again at the next observation
        oracle.new_episode(1)
        assert oracle.seed == 3 and oracle.t0 is None
        scene.reset(3)
        np.testing.assert_allclose(oracle.chunk(2000.0)[9], ScriptedPickLift(scene)(10 * DT), atol=1e-9)
    finally:
        oracle.close()
