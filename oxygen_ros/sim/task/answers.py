"""Scoring the node's streamed answers to "Where is the cube?" against the truth (ROS-free).

The oxygen node answers each ask with one *utterance* on the conversation task's text topic (see
:mod:`oxygen_ros.streams.text`): ``[#N Q: Where is the cube?] <answer>`` with the default
``text_header: ask``, in the order the asks arrived. This module turns those messages into
answers and scores them:

- :func:`parse_utterance`: one text-topic message -> :class:`Answer` (header stripped), or
  ``None`` for a *waiting notice* (``[request N waiting: ...]``: not an answer, the answer
  follows). An utterance ended by a notice (``... [request N expired: ...]``) is an answer that
  counts as wrong (``notice=True``), kept with its whole text; an ``[ask ignored: ...] Q: ...``
  reply (the node was not active) is one too. A message of another question, or without an ask
  header (a periodic request ``[#7] ...``, ``text_header`` ``id``/``none``), is not an answer to
  the question: :func:`collect_answers` counts it as ``unmatched``.
- :func:`seed_cube_region`: the truth, the region (:func:`~oxygen_ros.sim.task.language.cube_region`)
  of the cube's initial placement for a sim seed, from a camera-less
  :class:`~oxygen_ros.sim.scene.SimScene` reset with that seed (as the oracle does).
- :func:`score_answers`: the i-th answer belongs to the i-th ask; an answer is correct when it
  equals the truth after :func:`normalise` (case, whitespace, trailing punctuation) and nothing
  else; an ask without an answer counts as wrong. ``accuracy`` = correct / asked.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oxygen_ros.sim.task.language import CUBE_QUESTION, CUBE_REGIONS, cube_region

__all__ = [
    "Answer",
    "collect_answers",
    "latest_answer_text",
    "normalise",
    "parse_utterance",
    "score_answers",
    "seed_cube_region",
]

_HEADER = re.compile(r"^\[#(\d+) Q: (.*?)\] ?", re.DOTALL)
_END_NOTICE = re.compile(r"(?:^| )\[request \d+ [a-z_]+(?:: .*)?\]$", re.DOTALL)
_IGNORED = re.compile(r"^\[ask ignored: .*\] Q: (.*)$", re.DOTALL)
_WAITING = re.compile(r"^\[request \d+ waiting:")
_ANY_HEADER = re.compile(r"\[#\d+(?: Q: |\])")
_TRAILING = string.punctuation + "\u2026\u3002"


@dataclass(frozen=True)
class Answer:
    """One answer utterance.

    Attributes:
        question: the question its header echoes.
        text: the answer without the header (a notice-ended one keeps its notice).
        request_id: the node's request number (``None`` for an ignored ask).
        notice: the request ended without finishing (expired, rejected, failed, cancelled,
            ignored): counted as wrong whatever the text.
    """

    question: str
    text: str
    request_id: int | None = None
    notice: bool = False


def normalise(text: str) -> str:
    """``text`` lower-cased, whitespace collapsed to single spaces, trailing punctuation removed
    (``" Back  Left. "`` -> ``"back left"``)."""
    out = " ".join(str(text).lower().split())
    while out and out[-1] in _TRAILING:
        out = out[:-1].rstrip()
    return out


def parse_utterance(message: str) -> Answer | str | None:
    """One text-topic message as an answer.

    Returns:
        an :class:`Answer` for an ask's utterance (header ``[#N Q: ...]``) or an ignored-ask
        reply; ``None`` for a waiting notice (not an answer); otherwise the message itself as a
        ``str``: not an ask's answer (a periodic request's ``[#N] ...``, or a header-less text).
    """
    if _WAITING.match(message):
        return None
    m = _HEADER.match(message)
    if m:
        body = message[m.end() :]
        return Answer(m.group(2), body, int(m.group(1)), bool(_END_NOTICE.search(body)))
    m = _IGNORED.match(message)
    if m:
        return Answer(m.group(1), message, None, True)
    return message


def latest_answer_text(stream: str) -> str:
    """The answer text of the last utterance in ``stream`` (finished or still streaming text, from
    whatever precedes it: the tail of an earlier utterance whose deltas arrived late), for display:
    header stripped, outer whitespace removed; a waiting notice or a header-less text as it is."""
    starts = [m.start() for m in _ANY_HEADER.finditer(stream)]
    text = stream[starts[-1] :] if starts else stream
    got = parse_utterance(text.strip())
    if isinstance(got, Answer):
        return got.text.strip()
    return re.sub(r"^\[#\d+\] ?", "", text.strip()).strip()


def collect_answers(messages: Sequence[str], question: str = CUBE_QUESTION) -> tuple[list[Answer], int]:
    """The answers to ``question`` among the text-topic ``messages`` (in arrival order), and how
    many messages were neither an answer to it nor a waiting notice (``unmatched``: another
    question's answer, a periodic request's text, a header-less text)."""
    want = normalise(question)
    answers: list[Answer] = []
    unmatched = 0
    for msg in messages:
        got = parse_utterance(msg)
        if got is None:
            continue
        if isinstance(got, Answer) and normalise(got.question.rstrip("\u2026")) == want:
            answers.append(got)
        else:
            unmatched += 1
    return answers, unmatched


def seed_cube_region(seed: int) -> str:
    """The truth for ``seed``: the region of the cube's initial placement after a sim reset with
    that seed (height ignored: the reset drops the cube from 5 cm).

    Raises:
        ImportError: mujoco / gym-aloha are not installed.
    """
    from oxygen_ros.sim.scene import SimScene

    scene = SimScene(cameras=())
    try:
        scene.reset(int(seed))
        return cube_region(scene.cube_position, landed=False)
    finally:
        scene.close()


def score_answers(answers: Sequence[Answer | str | None], truth: str, asked: int) -> dict[str, Any]:
    """Score the answers of ``asked`` asks against ``truth``.

    Args:
        answers: the answers in ask order (the i-th belongs to the i-th ask); a ``str`` is taken as
            the answer text, ``None`` as no answer. Answers beyond ``asked`` belong to no ask of
            this run and are counted as ``extra``, not scored.
        truth: one of :data:`~oxygen_ros.sim.task.language.CUBE_REGIONS`.
        asked: how many asks were sent.

    Returns:
        ``{"asked", "answered", "correct", "accuracy", "extra", "items"}``: ``accuracy`` =
        correct / asked (``None`` when nothing was asked); ``items`` one per ask
        ``{"answer", "truth", "correct", "notice"}`` (``answer`` ``None`` when none came).

    Raises:
        ValueError: ``truth`` is not a region, or ``asked`` is negative.
    """
    if truth not in CUBE_REGIONS:
        raise ValueError(f"truth must be one of {list(CUBE_REGIONS)}, got {truth!r}")
    if asked < 0:
        raise ValueError(f"asked must be >= 0, got {asked}")
    items: list[dict[str, Any]] = []
    for i in range(asked):
        a = answers[i] if i < len(answers) else None
        if isinstance(a, str):
            a = Answer(CUBE_QUESTION, a)
        if a is None:
            items.append({"answer": None, "truth": truth, "correct": False, "notice": False})
            continue
        ok = not a.notice and normalise(a.text) == truth
        items.append({"answer": a.text, "truth": truth, "correct": ok, "notice": a.notice})
    answered = sum(1 for it in items if it["answer"] is not None)
    correct = sum(1 for it in items if it["correct"])
    return {
        "asked": asked,
        "answered": answered,
        "correct": correct,
        "accuracy": correct / asked if asked else None,
        "extra": max(0, len(answers) - asked),
        "items": items,
    }
