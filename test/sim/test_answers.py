"""Scoring the streamed answers to "Where is the cube?" (ROS-free)."""

from __future__ import annotations

import pytest

from oxygen_ros.sim.task.answers import (
    Answer,
    collect_answers,
    latest_answer_text,
    normalise,
    parse_utterance,
    score_answers,
    seed_cube_region,
)
from oxygen_ros.sim.task.language import CUBE_QUESTION, CUBE_REGIONS


def test_normalise_only_case_whitespace_and_trailing_punctuation():
    assert normalise("  Back \n LEFT. ") == "back left"
    assert normalise("front right!?…") == "front right"
    assert normalise("In the gripper") == "in the gripper"
    assert normalise("") == "" and normalise(" .. ") == ""
    assert normalise("back-left") == "back-left"  # nothing else fuzzy
    assert normalise(".back left") == ".back left"


def test_parse_utterance_headers_notices_and_others():
    a = parse_utterance("[#3 Q: Where is the cube?] back left")
    assert a == Answer("Where is the cube?", "back left", 3, False)
    assert parse_utterance("[#4 Q: Where is the cube?] ") == Answer("Where is the cube?", "", 4, False)
    expired = parse_utterance("[#5 Q: Where is the cube?] back [request 5 expired: waited 30.0 s]")
    assert isinstance(expired, Answer) and expired.notice and expired.text.startswith("back [request 5")
    cancelled = parse_utterance("[#6 Q: Where is the cube?] [request 6 cancelled]")
    assert isinstance(cancelled, Answer) and cancelled.notice
    assert parse_utterance("[request 7 waiting: no camera input yet; it waits up to 30.0 s ...]") is None
    ignored = parse_utterance("[ask ignored: the node is inactive] Q: Where is the cube?")
    assert isinstance(ignored, Answer) and ignored.notice and ignored.request_id is None
    assert parse_utterance("[#8] a periodic caption") == "[#8] a periodic caption"
    assert parse_utterance("back left") == "back left"  # no header: not an ask's answer


def test_collect_answers_keeps_order_and_counts_the_rest():
    msgs = [
        "[request 1 waiting: no camera input yet; it waits up to 30.0 s]",
        "[#1 Q: Where is the cube?] front left",
        "[#2 Q: What do you see?] a cube",
        "[#9] caption",
        "[#3 Q: Where is the cube?] back right.",
    ]
    answers, unmatched = collect_answers(msgs)
    assert [a.text for a in answers] == ["front left", "back right."] and unmatched == 2


def test_score_answers_right_wrong_missing_and_notices():
    answers = [
        Answer(CUBE_QUESTION, " Front Left. "),
        Answer(CUBE_QUESTION, "front right"),
        Answer(CUBE_QUESTION, "front left [request 3 expired: waited 30.0 s]", 3, True),
        Answer(CUBE_QUESTION, ""),
        "front left",
    ]
    s = score_answers(answers, "front left", 6)
    assert (s["asked"], s["answered"], s["correct"], s["extra"]) == (6, 5, 2, 0)
    assert s["accuracy"] == pytest.approx(2 / 6)
    assert [it["correct"] for it in s["items"]] == [True, False, False, False, True, False]
    assert s["items"][2]["notice"] and s["items"][2]["answer"].endswith("]")  # kept with its text
    assert s["items"][5] == {"answer": None, "truth": "front left", "correct": False, "notice": False}
    assert all(it["truth"] == "front left" for it in s["items"])
    more = score_answers(answers, "front left", 2)
    assert more["extra"] == 3 and len(more["items"]) == 2 and more["accuracy"] == 0.5
    none = score_answers([], "back left", 0)
    assert none["accuracy"] is None and none["items"] == []


@pytest.mark.parametrize("truth, asked", [("left", 1), ("", 1), ("back left", -1)])
def test_score_answers_refuses_bad_input(truth, asked):
    with pytest.raises(ValueError):
        score_answers([], truth, asked)


def test_seed_truth_is_the_initial_placement_region():
    pytest.importorskip("mujoco")
    pytest.importorskip("gym_aloha")
    import numpy as np
    from gym_aloha.utils import sample_box_pose

    from oxygen_ros.sim.task.language import cube_region

    for seed in (0, 1, 7):
        truth = seed_cube_region(seed)
        assert truth in CUBE_REGIONS[:4]
        assert truth == cube_region(np.asarray(sample_box_pose(seed)[:3]), landed=False)


def test_latest_answer_text_for_display():
    assert latest_answer_text("[#4 Q: Where is the cube?] back le") == "back le"
    # the tail of the previous utterance arrived after its finished text: cut at the last header
    assert latest_answer_text("  left [#6 Q: Where is the cube?] front") == "front"
    assert latest_answer_text("[#7] a caption") == "a caption"
    assert latest_answer_text("[request 3 waiting: no camera input yet]") == "[request 3 waiting: no camera input yet]"
    assert latest_answer_text("") == "" and latest_answer_text("plain") == "plain"
