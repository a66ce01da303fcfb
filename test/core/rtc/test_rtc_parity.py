"""Real-time chunking against LeRobot 0.6.1's own RTC (``test/data/parity/rtc/``, see its README):
the policy path and the engine path, each case within 1e-4 in normalised model space and after
unnormalisation; RTC off equal to the plain chunk bit for bit; the weights LeRobot logs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_parity import ATOL, DATA, folder, observation, policy  # noqa: F401  (fixtures)

from oxygen_ros.core.config import EngineConfig
from oxygen_ros.core.engine import engine as engine_mod
from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.loops.schedules import make_engine
from oxygen_ros.core.model.flow import euler_times
from oxygen_ros.core.rtc.config import RTCConfig
from oxygen_ros.core.rtc.guidance import guidance_weights, make_guide, prefix_weights

RTC = DATA / "rtc"
CASES = ("a", "b")


@pytest.fixture(scope="module")
def rtc_ref():
    return np.load(RTC / "rtc_reference.npz")


@pytest.fixture(scope="module")
def rtc_meta():
    return json.loads((RTC / "rtc_reference.json").read_text())["cases"]


def rtc_config(meta: dict, **kw) -> RTCConfig:
    return RTCConfig(
        enabled=meta["enabled"],
        schedule=meta["schedule"].lower(),
        execution_horizon=meta["execution_horizon"],
        max_guidance_weight=meta["max_guidance_weight"],
        inference_delay_mode="fixed",
        inference_delay=meta["inference_delay"],
        **kw,
    )


def test_inputs_are_the_parity_inputs(rtc_ref):
    ref = np.load(DATA / "reference.npz")
    np.testing.assert_array_equal(rtc_ref["images_u8"], ref["images_u8"])
    np.testing.assert_array_equal(rtc_ref["state"], ref["state"])
    np.testing.assert_array_equal(rtc_ref["noise"], ref["noise"])


@pytest.mark.parametrize("case", CASES)
def test_prefix_and_guidance_weights(rtc_ref, rtc_meta, case):
    m = rtc_meta[case]
    rows = m["prev_left_over_rows"]
    w = prefix_weights(m["schedule"].lower(), m["inference_delay"], m["execution_horizon"], rows, 10)
    np.testing.assert_allclose(w.numpy(), rtc_ref[f"{case}_prefix_weights"].reshape(-1), atol=1e-6, rtol=0)
    g = guidance_weights(rtc_ref["denoise_time"], m["max_guidance_weight"])
    np.testing.assert_allclose(g.numpy(), rtc_ref[f"{case}_guidance_weight"].reshape(-1), atol=1e-5, rtol=0)
    ours = guidance_weights(torch.stack(euler_times(10)[0]), m["max_guidance_weight"])  # our float32 times
    np.testing.assert_allclose(ours.numpy(), rtc_ref[f"{case}_guidance_weight"].reshape(-1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_policy_path_equals_lerobot(policy, rtc_ref, rtc_meta, case):  # noqa: F811
    cfg = rtc_config(rtc_meta[case])
    noise = torch.from_numpy(rtc_ref[f"{case}_noise"])
    left = rtc_ref[f"{case}_prev_left_over"]
    obs = observation(rtc_ref, "all")
    cache, _ = policy.prefill(policy.encode_observation(obs))
    guide = make_guide(
        left,
        cfg.inference_delay,
        schedule=cfg.schedule,
        horizon=cfg.execution_horizon,
        max_weight=cfg.max_guidance_weight,
        times=euler_times(10)[0],
        length=10,
        action_dim=32,
    )
    x = policy.sample_actions_normalized(cache, noise, guide=guide)
    np.testing.assert_allclose(x.numpy(), rtc_ref[f"{case}_actions"], atol=ATOL, rtol=0)  # all 32 dims
    chunk = policy.sample_actions(obs, noise, rtc=cfg, prev_chunk_left_over=left, normalized=True)
    np.testing.assert_allclose(chunk, rtc_ref[f"{case}_actions_chunk"][0], atol=ATOL, rtol=0)
    robot = policy.sample_actions(obs, noise, rtc=cfg, prev_chunk_left_over=left)
    np.testing.assert_allclose(robot, rtc_ref[f"{case}_actions_postprocessed"][0], atol=ATOL, rtol=0)
    d = rtc_meta[case]["effective_inference_delay"]  # the frozen rows hold the leftover
    assert np.abs(chunk[:d] - left[:d]).max() < 0.2


def test_rtc_off_is_the_plain_chunk_bit_for_bit(policy, rtc_ref, rtc_meta):  # noqa: F811
    noise = torch.from_numpy(rtc_ref["e_noise"])
    obs = observation(rtc_ref, "all")
    plain = policy.sample_actions(obs, noise)
    off = policy.sample_actions(
        obs, noise, rtc=rtc_config(rtc_meta["e"]), prev_chunk_left_over=rtc_ref["e_prev_left_over"]
    )
    np.testing.assert_array_equal(off, plain)
    first = policy.sample_actions(obs, noise, rtc=rtc_config(rtc_meta["a"]))  # enabled, no leftover yet
    np.testing.assert_array_equal(first, plain)
    np.testing.assert_allclose(plain, rtc_ref["e_actions_postprocessed"][0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("schedule", ["serial", "concurrent"])
@pytest.mark.parametrize("case", CASES)
def test_engine_path_equals_lerobot_from_stamps(policy, rtc_ref, rtc_meta, case, schedule, monkeypatch):  # noqa: F811
    """The engine remembers its previous chunk (LeRobot's ``prev_actions``: observation 'rwm',
    ``prev_noise``) and, for an observation ``prev_offset`` control periods later, guides toward
    its rows from ``prev_offset`` on — LeRobot's leftover, found from the two stamps."""
    m = rtc_meta[case]
    period = 0.02
    noises = iter([torch.from_numpy(rtc_ref["prev_noise"]), torch.from_numpy(rtc_ref[f"{case}_noise"])])
    monkeypatch.setattr(engine_mod, "frame_noise", lambda *a, **k: next(noises).clone())
    eng = make_engine(policy, EngineConfig(tasks=(), schedule=schedule), rtc=rtc_config(m, control_period_s=period))
    prev = observation(rtc_ref, "rwm")
    eng.submit_observation(prev)
    assert eng.step().error is None
    np.testing.assert_allclose(eng.handover.last_chunk, rtc_ref["prev_actions_chunk"][0], atol=ATOL, rtol=0)
    new = observation(rtc_ref, "all")
    new.stamp = prev.stamp + m["prev_offset"] * period
    eng.submit_observation(new)
    r = eng.step()
    assert r.error is None and eng.handover.counts["guided"] == 1
    np.testing.assert_allclose(eng.handover.last_chunk, rtc_ref[f"{case}_actions_chunk"][0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(r.action.actions, rtc_ref[f"{case}_actions_postprocessed"][0], atol=ATOL, rtol=0)
    eng.close()


def test_engine_explicit_leftover_equals_lerobot(policy, rtc_ref, rtc_meta, monkeypatch):  # noqa: F811
    noise = torch.from_numpy(rtc_ref["a_noise"])
    monkeypatch.setattr(engine_mod, "frame_noise", lambda *a, **k: noise.clone())
    eng = Engine(policy, EngineConfig(tasks=()), rtc_config(rtc_meta["a"]))
    eng.submit_observation(
        observation(rtc_ref, "all"),
        prev_chunk_left_over=rtc_ref["a_prev_left_over"],
        inference_delay=rtc_meta["a"]["inference_delay"],
    )
    r = eng.step()
    np.testing.assert_allclose(r.action.actions, rtc_ref["a_actions_postprocessed"][0], atol=ATOL, rtol=0)
    off = Engine(policy, EngineConfig(tasks=()), rtc_config(rtc_meta["e"]))
    off.submit_observation(observation(rtc_ref, "all"), prev_chunk_left_over=rtc_ref["e_prev_left_over"])
    plain = Engine(policy, EngineConfig(tasks=()))
    plain.submit_observation(observation(rtc_ref, "all"))
    np.testing.assert_array_equal(off.step().action.actions, plain.step().action.actions)
