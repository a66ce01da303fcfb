"""``evaluate rollout`` (``oxygen_ros.evaluate.rollout``): the policy steps the sim in this process.

The scripted oracle through the same loop is the reference: it must lift the cube as it does through
the node (success at 7.0 s, the script's end of lift) and close its gripper at the grasp target
(2.5 cm above the cube's centre). A random-weight model runs through the model path and fails. Bad input is
refused with a clear error.
"""

from __future__ import annotations

import json
import math

import pytest

from oxygen_ros.evaluate.cli import main as evaluate_main
from oxygen_ros.evaluate.rollout import rollout, rollout_summary

pytest.importorskip("mujoco")
pytest.importorskip("gym_aloha")


def test_the_scripted_oracle_lifts_the_cube_through_the_rollout():
    episodes = rollout("scripted", [0, 3], episode_s=8.0, replan_steps=25)
    for e in episodes:
        assert e.success and e.time_to_success_s == pytest.approx(7.0, abs=0.05), e
        assert e.lift_max_cm > 15 and e.grasp_miss_cm < 0.5 and 4.0 < e.grasp_miss_t_s < 5.3, e
        assert e.min_gripper_command == 0.0 and abs(e.min_gripper_height_cm) < 0.5, e
    summary = rollout_summary(episodes)
    assert summary["successes"] == 2 and summary["gripper_closed"] == 2 and summary["wilson_95"][1] == 1.0


def test_a_random_model_runs_through_the_model_path_and_fails(tmp_path, capsys):
    from oxygen_ros.core.policy import Pi05Policy

    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cpu", seed=0)
    (e,) = rollout(policy, [1], episode_s=1.6, replan_steps=10)
    assert not e.success and e.time_to_success_s is None
    measures = (e.lift_max_cm, e.grasp_miss_cm, e.grasp_miss_height_cm, e.min_gripper_command)
    assert all(math.isfinite(v) for v in measures) and e.grasp_miss_cm > 1.0, e
    # the same through the CLI, with the JSON written
    out = tmp_path / "rollout.json"
    args = ["rollout", "--model", "pi05-tiny", "--seeds", "1", "--seed", "1", "--episode-s", "1.2", "--json", str(out)]
    assert evaluate_main(args) == 0
    printed = capsys.readouterr().out
    assert "seed    1: no success" in printed and "success 0/1" in printed
    assert json.loads(out.read_text())["per_episode"][0]["seed"] == 1


def test_bad_input_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="replan_steps"):
        rollout("scripted", [0], replan_steps=0)
    with pytest.raises(ValueError, match="replan_steps"):
        rollout("scripted", [0], replan_steps=51)
    with pytest.raises(ValueError, match="scripted"):
        rollout("oracle", [0])
    from oxygen_ros.core.policy import Pi05Policy

    other_camera = Pi05Policy.from_pretrained(
        "pi05-tiny", device="cpu", config_overrides={"image_slots": ("base_0_rgb", "wrist_9")}
    )
    with pytest.raises(ValueError, match=r"no camera for slot\(s\) \['wrist_9'\]"):
        rollout(other_camera, [0])
    with pytest.raises(ValueError, match="no episodes"):
        rollout_summary([])
    assert evaluate_main(["rollout", "--scripted", "--seeds", "0"]) == 2
    assert "--seeds must be >= 1" in capsys.readouterr().err
    assert evaluate_main(["rollout", "--model", str(tmp_path / "missing")]) == 2
    assert "evaluate: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # one policy: a model or the oracle
        evaluate_main(["rollout", "--scripted", "--model", "pi05-tiny"])
    assert exc.value.code == 2
