"""The repeated checkable ask of an episode-mode ``closed_loop`` run (ROS-free).

``closed_loop --episode-s T --ask "Where is the cube?" --ask-count N`` sends the ask N times while
the arm reaches, and scores the answers (:mod:`oxygen_ros.sim.task.answers`) against the region of
the seed's initial cube placement. The rule (:class:`AskSchedule`):

- the first ask is due once ``--ask-at-frame`` chunks have been seen (default 1 in episode mode),
  each further one ``--ask-every-frames`` chunks (default 3) after the chunk count at which the
  previous one was sent; an ask is sent as soon as it is due and the monitor can send it without
  losing the answer (the node's ask and text topics matched);
- an ask is sent only while the sim's latest status says the episode has not started, or its
  ``episode_time_s`` is below ``--ask-before-s`` (default 3.0 s): the scripted pick-and-lift starts
  closing the gripper at 4.5 s, so until then the cube rests where the reset put it (a policy
  that knocks it earlier makes its own answers wrong: the truth stays the initial placement). Asks
  not sent by then are not sent at all (``report['answers']['requested']`` > ``asked``);
- answers are matched in order: the i-th answer utterance of the question on the text topic
  belongs to the i-th ask (waiting notices skipped; other texts counted as ``unmatched``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from oxygen_ros.sim.task.answers import collect_answers, normalise, score_answers
from oxygen_ros.sim.task.language import CUBE_QUESTION

__all__ = ["AskSchedule", "answers_report", "is_checkable"]


def is_checkable(question: str) -> bool:
    """Whether ``question`` has a checkable answer (it is :data:`CUBE_QUESTION`, up to case,
    whitespace and trailing punctuation)."""
    return bool(question) and normalise(question) == normalise(CUBE_QUESTION)


@dataclass
class AskSchedule:
    """When the asks of one run are due (module doc).

    Args:
        count: asks to send (``--ask-count``).
        first_frame: chunks seen before the first ask.
        every_frames: chunks between asks.
        before_s: episode time (sim seconds) from which no ask is sent (``inf``: no limit).

    Raises:
        ValueError: ``count`` or ``every_frames`` below 1, ``first_frame`` negative, or
            ``before_s`` not positive.
    """

    count: int
    first_frame: int = 1
    every_frames: int = 3
    before_s: float = math.inf
    sent: list[dict[str, Any]] = field(default_factory=list)  # {"at_frame", "episode_time_s"} per ask
    closed: bool = False  # the time limit passed: no more asks

    def __post_init__(self) -> None:
        if self.count < 1 or self.every_frames < 1 or self.first_frame < 0:
            raise ValueError(
                f"--ask-count and --ask-every-frames must be >= 1 and --ask-at-frame >= 0, got "
                f"{self.count}, {self.every_frames}, {self.first_frame}"
            )
        if not self.before_s > 0:
            raise ValueError(f"--ask-before-s must be > 0, got {self.before_s}")

    def due(self, chunks: int, episode_started: bool, episode_time_s: float) -> bool:
        """Whether the next ask is due now, given the chunks seen and the sim's latest episode
        status (an unknown time, NaN, counts as not started). Once the time limit has passed no
        ask is ever due again."""
        if self.closed or len(self.sent) >= self.count:
            return False
        if episode_started and math.isfinite(episode_time_s) and episode_time_s >= self.before_s:
            self.closed = True
            return False
        if not self.sent:
            return chunks >= self.first_frame
        return chunks >= int(self.sent[-1]["at_frame"]) + self.every_frames

    def mark_sent(self, chunks: int, episode_time_s: float) -> None:
        """Record that the next ask went out at ``chunks`` chunks, ``episode_time_s`` (sim s)."""
        t = round(episode_time_s, 3) if math.isfinite(episode_time_s) else None
        self.sent.append({"at_frame": int(chunks), "episode_time_s": t})


def answers_report(schedule: AskSchedule, messages: list[str], truth: str, question: str) -> dict[str, Any]:
    """``report['answers']``: :func:`~oxygen_ros.sim.task.answers.score_answers` of the answers
    to ``question`` among the text-topic ``messages`` against ``truth``, plus ``question``,
    ``truth``, ``requested`` (``--ask-count``), ``unmatched`` (text-topic messages that answer
    no ask of the question) and ``sent`` (frame and episode time of each ask)."""
    answers, unmatched = collect_answers(messages, question)
    out = score_answers(answers, truth, len(schedule.sent))
    return {
        "question": question,
        "truth": truth,
        "requested": schedule.count,
        **out,
        "unmatched": unmatched,
        "sent": list(schedule.sent),
    }
