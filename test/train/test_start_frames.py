"""Start frames rendered for training (``train --start-frames``) are the frames a recording holds:
same pixels, state, chunk and language targets as ``record_demos`` writes for the same placement,
start pose and step; and their refusals of unusable input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from oxygen_ros.core.config import get_preset
from oxygen_ros.train.dataset import DemoData, DemoError, load_demos
from oxygen_ros.train.start_frames import render_start_frames, start_step


@pytest.fixture(scope="module")
def jittered(tmp_path_factory):
    pytest.importorskip("mujoco")
    pytest.importorskip("gym_aloha")
    from oxygen_ros.sim.demos import main as demos_main

    out = tmp_path_factory.mktemp("demos") / "jittered"
    # seeds 10 and 11: start frames at control steps 20 and 0 (start_step), inside 2 s episodes
    args = ["--out", str(out), "--episodes", "2", "--seconds", "2", "--first-seed", "10", "--start-jitter", "0.3"]
    args += ["--action-noise", "0.1"]  # the frame at step 20 is reached under the perturbation
    assert demos_main([*args, "--workers", "1"]) == 0
    return out


@pytest.mark.slow
def test_a_start_frame_equals_the_recorded_frame_of_its_placement(jittered):
    cfg = get_preset("pi05-tiny")
    recorded = load_demos(jittered, cfg, progress=False)
    frames = render_start_frames(
        jittered, cfg, 2, first_seed=10, start_jitter=0.3, action_noise_rad=0.1, progress=False
    )
    assert frames.step.tolist() == [20, 0] and frames.episode.tolist() == [0, 1]
    for ep in range(2):
        row = int(np.flatnonzero((recorded.episode == ep) & (recorded.step == frames.step[ep]))[0])
        np.testing.assert_array_equal(frames.images[ep], recorded.images[row])  # same JPEG round trip and resize
        np.testing.assert_array_equal(frames.image_masks[ep], recorded.image_masks[row])
        np.testing.assert_array_equal(frames.state[ep], recorded.state[row])
        np.testing.assert_array_equal(frames.region[ep], recorded.region[row])
        np.testing.assert_array_equal(frames.phase[ep], recorded.phase[row])
        horizon = cfg.action_horizon
        np.testing.assert_array_equal(
            frames.chunks(np.array([ep]), horizon), recorded.chunks(np.array([row]), horizon)
        )  # point i = the command of step + 1 + i
    assert frames.instructions == recorded.instructions
    # by default every placement starts from the nominal pose: frames of one step differ in the cube only
    flat = render_start_frames(jittered, cfg, 2, first_seed=10, progress=False)
    assert np.abs(flat.state[1] - frames.state[1]).max() > 0.01
    more = render_start_frames(jittered, cfg, 8, first_seed=11, progress=False)
    at_reset = more.step == 0
    assert at_reset.sum() >= 2 and (more.state[at_reset] == flat.state[1]).all()


@pytest.mark.slow
def test_start_frames_are_cached_and_refuse_bad_input(jittered, tmp_path, monkeypatch):
    import oxygen_ros.train.start_frames as sf

    cfg = get_preset("pi05-tiny")
    first = render_start_frames(jittered, cfg, 2, first_seed=10, progress=False)

    def _no_render(*args, **kwargs):
        raise AssertionError("rendered again instead of reading the cache")

    monkeypatch.setattr(sf, "_render", _no_render)
    again = render_start_frames(jittered, cfg, 2, first_seed=10, progress=False)
    np.testing.assert_array_equal(again.images, first.images)
    assert again.instructions == first.instructions
    with pytest.raises(ValueError, match="at least 1"):
        render_start_frames(jittered, cfg, 0)
    with pytest.raises(ValueError, match="start jitter"):
        render_start_frames(jittered, cfg, 2, start_jitter=0.9)
    with pytest.raises(ValueError, match="action noise"):
        render_start_frames(jittered, cfg, 2, action_noise_rad=0.5)
    with pytest.raises(DemoError, match="demos.json"):
        render_start_frames(tmp_path, cfg, 2)
    (tmp_path / "demos.json").write_text(json.dumps({"size": [120]}))
    with pytest.raises(DemoError, match="demos.json"):
        render_start_frames(tmp_path, cfg, 2)


def test_start_steps_are_camera_frames_early_in_the_reach():
    steps = [start_step(s, 50.0, 10.0) for s in range(2000)]
    assert set(steps) <= {0, 5, 10, 15, 20, 25, 30}
    assert 0.45 < steps.count(0) / len(steps) < 0.55  # half at the reset itself
    assert all(steps.count(k) > 100 for k in (5, 30))
    assert start_step(3, 50.0, 10.0) == start_step(3, 50.0, 10.0)
    assert {start_step(s, 50.0, 50.0, max_seconds=0.1) for s in range(200)} == {0, 1, 2, 3, 4, 5}
    assert {start_step(s, 50.0, 1.0) for s in range(50)} == {0}  # no camera frame before 0.6 s


def test_concat_renumbers_episodes_and_keeps_every_chunk():
    def data(episodes: int, frames: int, steps: int, base: float) -> DemoData:
        n = episodes * frames
        return DemoData(
            images=np.zeros((n, 1, 3, 2, 2), np.uint8),
            image_masks=np.ones((n, 1), bool),
            state=np.zeros((n, 14), np.float32),
            step=np.tile(np.arange(frames), episodes),
            episode=np.repeat(np.arange(episodes), frames),
            commands=base + np.arange(episodes * steps * 14, dtype=np.float32).reshape(episodes, steps, 14),
            region=np.zeros(n, np.int64),
            phase=np.zeros(n, np.int64),
            instructions=[f"task {base}"] * episodes,
        )

    a, b = data(2, 3, 10, 0.0), data(3, 1, 4, 1000.0)
    both = a.concat(b)
    assert len(both) == 9 and both.episode.tolist() == [0, 0, 0, 1, 1, 1, 2, 3, 4]
    assert both.commands.shape == (5, 10, 14) and both.instructions == a.instructions + b.instructions
    np.testing.assert_array_equal(both.chunks(np.arange(6), 6), a.chunks(np.arange(6), 6))
    np.testing.assert_array_equal(both.chunks(np.arange(6, 9), 6), b.chunks(np.arange(3), 6))
