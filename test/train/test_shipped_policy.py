"""The bundled trained policy (``data/pi05_sim_aloha``) does the job on an episode it never saw, and
would stop doing it if the wiring between the parts were wrong.

The sample bag (seed 0, 240x320 cameras) is outside the training set (seeds from 1000, 160x120
cameras). Its frames go through the same decode, resize and prompt as the node's. The policy's
open-loop chunks must be far closer to the recorded commands than "hold the current state"; the
same frames with two camera slots swapped, or with the top image mirrored (the cube on the other
side), must lose that — a policy that ignored its images, or a slot mapping or image orientation
that had drifted from training, would fail here. On 20 unseen placements rendered by the sim at the
start pose, its answer to "Where is the cube?" must be the sim's true region (>= 90 %) and its first
chunk must follow the cube (the placement check's skill above 0.2; blind is 0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.replay.demo import shipped_policy

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "aloha_sim_sample"
pytestmark = pytest.mark.skipif(not (shipped_policy() / "model.safetensors").is_file(), reason="no shipped policy")


@pytest.fixture(scope="module")
def setup():
    from oxygen_ros.core.policy import Pi05Policy
    from oxygen_ros.train.dataset import DemoData, read_episode

    policy = Pi05Policy.from_pretrained(shipped_policy(), device="cpu")
    frames, commands, instruction = read_episode(SAMPLE, policy.cfg.image_slots, policy.cfg.vision.image_size)
    data = DemoData(
        **frames,
        episode=np.zeros(len(frames["step"]), dtype=np.int64),
        commands=commands[None],
        instructions=[instruction],
    )
    return policy, data


def _error(policy, data, images=None):
    from dataclasses import replace

    from oxygen_ros.train.train import held_out_error

    view = data if images is None else replace(data, images=images)
    return held_out_error(policy, view, np.arange(0, 90, 6), seed=0)


def test_open_loop_far_better_than_holding_the_state(setup):
    policy, data = setup
    e = _error(policy, data)
    assert e["model_mae"] < 0.5 * e["hold_mae"], e


def test_swapped_camera_slots_or_a_mirrored_image_break_it(setup):
    policy, data = setup
    good = _error(policy, data)
    swapped = _error(policy, data, data.images[:, [1, 0, 2]])["model_mae"]
    mirrored = data.images.copy()
    mirrored[:, 0] = mirrored[:, 0, :, :, ::-1]
    flipped = _error(policy, data, mirrored)["model_mae"]
    # the wiring check: the same "far better than holding" test fails on the miswired frames
    assert good["model_mae"] < 0.5 * good["hold_mae"], good
    assert swapped >= 0.5 * good["hold_mae"] and flipped >= 0.5 * good["hold_mae"], (good, swapped, flipped)


@pytest.mark.slow
def test_sees_the_cube_and_answers_where_it_is_on_unseen_placements():
    """The issue's bar for answers (>= 90 % right) on the 20 unseen placements that ``evaluate`` uses,
    at the start pose: the arms have not moved, so only the cube's pixels tell where it is (on the
    sample bag the oracle's reach gives the answer away). A policy blind to the cube answers one
    region whatever the placement (about 25 %) and its first chunk has no skill (0)."""
    pytest.importorskip("mujoco")
    pytest.importorskip("gym_aloha")
    from oxygen_ros.core.policy import Pi05Policy
    from oxygen_ros.train.placement import placement_check

    summary = placement_check(Pi05Policy.from_pretrained(shipped_policy(), device="cpu"), seeds=range(20)).summary
    assert summary["answers_right"] >= 18, summary
    assert summary["skill"] > 0.2, summary
