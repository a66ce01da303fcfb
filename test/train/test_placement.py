"""The placement check (``oxygen_ros.train.placement``, ``evaluate placement``): its summary on
chunks with a known answer, and a run on the shipped policy through the simulator."""

from __future__ import annotations

import json

import numpy as np
import pytest

from oxygen_ros.evaluate.cli import main as evaluate_main
from oxygen_ros.replay.demo import shipped_policy
from oxygen_ros.train.placement import _summary, placement_line

rng = np.random.default_rng(0)
ORACLE = rng.normal(size=(6, 50, 14)) * 0.05 + np.linspace(0, 1, 14)  # placement-dependent chunks
TRUTHS = ["back left", "front right", "back right", "front left", "back left", "front right"]


def test_the_oracle_itself_scores_one_and_a_blind_policy_zero():
    perfect = _summary(ORACLE, ORACLE, TRUTHS, TRUTHS)
    assert perfect["skill"] == 1.0 and perfect["spread_ratio"] == 1.0 and perfect["answer_accuracy"] == 1.0
    assert perfect["chunk_mae"] == 0.0 and perfect["placements"] == 6
    # a chunk that ignores the placement: the oracle's mean, plus a bias common to every placement
    blind = np.broadcast_to(ORACLE.mean(axis=0) + 0.1, ORACLE.shape)
    s = _summary(blind, ORACLE, ["front right"] * 6, TRUTHS)
    assert s["skill"] == pytest.approx(0.0) and s["spread_ratio"] == pytest.approx(0.0, abs=1e-12)
    assert s["chunk_mae"] > s["oracle_variation"] and s["answers_right"] == 2
    # a chunk that varies, but not with the cube: no skill either (negative)
    shuffled = _summary(ORACLE[::-1], ORACLE, TRUTHS, TRUTHS)
    assert shuffled["skill"] < 0 and shuffled["spread_ratio"] == pytest.approx(1.0)
    assert "answers 2/6 right" in placement_line(s)


def test_answers_are_compared_without_surrounding_space():
    assert _summary(ORACLE, ORACLE, [" back left ", *TRUTHS[1:]], TRUTHS)["answers_right"] == 6


@pytest.mark.slow
def test_evaluate_placement_runs_the_shipped_policy_against_the_oracle(tmp_path, capsys):
    pytest.importorskip("mujoco")
    pytest.importorskip("gym_aloha")
    from oxygen_ros.sim.scene import SimScene
    from oxygen_ros.sim.task.language import cube_region

    out = tmp_path / "placement.json"
    assert evaluate_main(["placement", "--model", str(shipped_policy()), "--seeds", "3", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "placement check over 3 unseen placements" in printed
    report = json.loads(out.read_text())
    scene = SimScene(cameras=("top",), image_size=(48, 64))
    try:
        truths = []
        for seed in range(3):
            scene.reset(seed)
            truths.append(cube_region(scene.cube_position, landed=False))
    finally:
        scene.close()
    assert [a["truth"] for a in report["answers"]] == truths
    assert [a["seed"] for a in report["answers"]] == [0, 1, 2]
    assert all(a["answer"].strip() for a in report["answers"])  # the policy answers something
    assert np.isfinite(list(report["summary"].values())).all() and report["summary"]["oracle_variation"] > 0.001


def test_evaluate_placement_refuses_bad_input(tmp_path, capsys):
    assert evaluate_main(["placement", "--model", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert evaluate_main(["placement", "--model", str(shipped_policy()), "--seeds", "1"]) == 2
    assert "at least 2 seeds" in capsys.readouterr().err
