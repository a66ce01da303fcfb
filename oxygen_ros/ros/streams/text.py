"""Turns one language task's concurrent requests into one readable text stream (ROS-free).

The engine decodes several requests of a task in the same batch, so their deltas interleave. A
``std_msgs/String`` topic has no request id, so the node streams ONE utterance at a time per
task: the deltas of the oldest unfinished request go out live; those of later requests are held
back and flushed, in order, as soon as every earlier one has ended. Each utterance ends with its
whole text on the task's text topic, so a reader concatenating the deltas between two finished
texts gets exactly that text (the engine guarantees deltas never split a UTF-8 character).

A request that ends without ever producing a delta emits nothing, unless it carries a notice
(rejected, expired, or failed before its first token): then the notice — why it ended — is its
one delta and its end-of-utterance text, in its turn. One that ends after deltas (finished,
cancelled, failed) emits its text so far.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ['Emit', 'TaskTextStream']


@dataclass(frozen=True)
class Emit:
    """One message to publish: ``kind`` is ``'delta'`` or ``'text'``; ``text`` its payload."""

    kind: str
    text: str
    request_id: int


@dataclass
class _Utterance:
    deltas: list[str] = field(default_factory=list)
    final: str | None = None  # set when the request has ended


class TaskTextStream:
    """Serialises the deltas and final texts of one task's requests."""

    def __init__(self) -> None:
        self._open: OrderedDict[int, _Utterance] = OrderedDict()  # by first delta, oldest first

    @property
    def pending(self) -> int:
        """Utterances started but not yet fully emitted."""
        return len(self._open)

    def delta(self, request_id: int, text: str) -> list[Emit]:
        """A new delta of ``request_id`` (empty text is allowed and emits nothing)."""
        utt = self._open.get(request_id)
        if utt is None:
            utt = self._open[request_id] = _Utterance()
        if text:
            utt.deltas.append(text)
        return self._flush()

    def end(self, request_id: int, text: str, notice: str | None = None) -> list[Emit]:
        """``request_id`` ended with whole text ``text``. One that never produced a delta is
        ignored, or, with a ``notice`` (why it ended), emits the notice as its utterance."""
        utt = self._open.get(request_id)
        if utt is None:
            if not notice:
                return []
            utt = self._open[request_id] = _Utterance(deltas=[notice])
            text = notice
        utt.final = text
        return self._flush()

    def _flush(self) -> list[Emit]:
        out: list[Emit] = []
        while self._open:
            rid, utt = next(iter(self._open.items()))
            out.extend(Emit('delta', d, rid) for d in utt.deltas)
            utt.deltas.clear()
            if utt.final is None:
                break
            out.append(Emit('text', utt.final, rid))
            del self._open[rid]
        return out
