"""Reading utterances back from a task's delta and text topics (ROS-free; see
:mod:`oxygen_ros.streams.text` for how the node writes them).

Per task the node streams one utterance at a time: its header (``text_header``: ``[#3 Q: <ask>]``,
``[#3]`` or nothing, and a blank) is the utterance's first delta, and the utterance ends with its whole text on
the text topic. The delta and text topics are two subscriptions, so their messages may be handled
in either order: the text message is authoritative, the deltas only make the output live.

- :class:`AskReader` finds the utterance answering one ask.
- :class:`LinePrinter` prints every finished utterance of several tasks, one line each.

A text-topic message ``[request N waiting: …]`` (optionally after a header) is a notice about a
request that waits, not the end of an utterance.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from oxygen_ros.streams.text import header_echo

__all__ = ["AskReader", "LinePrinter", "end_notice", "split_header", "waiting_notice"]

_HEADER = re.compile(r"\[#(\d+)(?: Q: (.*?))?\] ", re.S)
_END = re.compile(r"\[request (\d+) (rejected|expired|failed|cancelled)(?:: (.*))?\]\s*$", re.S)
_WAITING = re.compile(r"\s*\[request (\d+) waiting(?:: .*)?\]\s*", re.S)


def split_header(text: str, question: str | None = None) -> tuple[int | None, str | None, str]:
    """``'[#3 Q: hi] body'`` -> ``(3, 'hi', 'body')``; ``'[#7] x'`` -> ``(7, None, 'x')``;
    text without a header -> ``(None, None, text)``. An ask may itself hold ``'] '``: with
    ``question`` given, a header carrying exactly that question is split after it."""
    if question is not None:
        m = re.match(r"\[#(\d+) Q: ", text)
        if m and text.startswith(question + "] ", m.end()):
            return int(m.group(1)), question, text[m.end() + len(question) + 2 :]
    m = _HEADER.match(text)
    if m is None:
        return None, None, text
    return int(m.group(1)), m.group(2), text[m.end() :]


def waiting_notice(text: str) -> int | None:
    """The request id of a ``[request N waiting: …]`` notice (after an optional header), else None."""
    m = _WAITING.fullmatch(split_header(text)[2])
    return int(m.group(1)) if m else None


def end_notice(body: str) -> tuple[int, str, str] | None:
    """``(request id, outcome, reason)`` of the notice an utterance that did not finish ends with
    (``[request 3 expired: waited …]``), else None."""
    m = _END.search(body)
    return (int(m.group(1)), m.group(2), m.group(3) or "") if m else None


def _is_header(delta: str) -> bool:
    return _HEADER.fullmatch(delta) is not None


class AskReader:
    """Follows one task's topics and picks out the utterance answering an ask (see
    ``oxygen ask --help``): with ``text_header`` ``ask`` the first utterance, begun after
    :meth:`published`, whose header carries the ask (whitespace collapsed); with ``id`` the first
    one with a request number not seen before the publish; with ``none`` the first utterance that
    begins after the publish (when an utterance is streaming at the publish, the one after it).

    Args:
        ask: the ask as published; header: the node's ``text_header``; out / err: where the answer
            and notices are written (called with text fragments).
    """

    def __init__(self, ask: str, header: str, out: Callable[[str], None], err: Callable[[str], None]) -> None:
        self.question, self.header = header_echo(ask), header
        self._out, self._err = out, err
        self.published_at: bool = False
        self.request_id: int | None = None
        self.code: int | None = None  # exit status once the utterance has ended (0 finished, 1 notice)
        self.deltas = 0
        self._old: set[int] = set()
        self._printed = ""
        self._live = False  # printing this utterance's deltas
        self._closed = False  # a later utterance began in the delta stream
        self._skip = False  # 'none': an utterance was streaming at the publish
        self._streaming = False  # 'none': deltas since the last text

    @property
    def done(self) -> bool:
        """True once the answer has ended (``code`` set)."""
        return self.code is not None

    def published(self) -> None:
        """Call right after the ask was published."""
        self.published_at = True
        if self.header == "none":
            self._skip = self._streaming
            self._live = not self._skip

    def _ours(self, rid: int, question: str | None) -> bool:
        if rid in self._old or (self._old and rid < max(self._old)):
            return False
        return self.header != "ask" or question == self.question

    def delta(self, text: str) -> None:
        """A message of the task's delta topic."""
        if self.done or _WAITING.fullmatch(text):
            return
        if self.header == "none":
            self._streaming = True
        elif _is_header(text):
            rid, question, _ = split_header(text, self.question)
            assert rid is not None  # a header (_is_header) has its request number
            if not self.published_at:
                self._old.add(rid)
            elif self._live:
                self._closed = True
            elif self.request_id is None and self._ours(rid, question):
                self.request_id, self._live = rid, True
            return
        if self._live and not self._closed:
            end = _END.search(text)  # an end notice is not the answer: its reason goes to err at the end
            text = text if end is None else text[: end.start()].rstrip(" ")
            if not text:
                return
            self._printed += text
            self.deltas += 1
            self._out(text)

    def text(self, text: str) -> None:
        """A message of the task's text topic."""
        if self.done:
            return
        rid = waiting_notice(text)
        if rid is not None:
            if self.published_at and (self.request_id in (None, rid)):
                self._err(split_header(text)[2].strip() + "\n")
            return
        if self.header == "none":
            self._streaming = False
            if not self.published_at:
                return
            if self._skip:
                self._skip, self._live, self._printed = False, True, ""
                return
            self._finish(text, None)
            return
        rid, question, body = split_header(text, self.question)
        if rid is None:
            return
        if not self.published_at:
            self._old.add(rid)
            return
        if self.request_id is None and self._ours(rid, question):
            self.request_id = rid
        if rid == self.request_id:
            self._finish(body, rid)

    def _finish(self, body: str, rid: int | None) -> None:
        notice = end_notice(body)
        end = _END.search(body)
        shown = body if end is None else body[: end.start()].rstrip(" ")  # the answer without the notice
        if end is not None and not shown and not self._printed:
            pass  # nothing was answered: only the reason, on err
        elif shown.startswith(self._printed):
            self._out(shown[len(self._printed) :] + "\n")
        elif not self._printed.startswith(shown):
            self._out("\n" + shown + "\n")
        else:
            self._out("\n")
        if notice is not None and rid in (None, notice[0]):
            nid, outcome, reason = notice
            self._err(f"request {nid} {outcome}" + (f": {reason}" if reason else "") + "\n")
            self.code = 1
        else:
            self.code = 0


@dataclass
class _Stream:
    started: bool = False  # the deltas held begin at an utterance's header
    parts: list[list[str]] = field(default_factory=list)  # utterances in progress (header first)


class LinePrinter:
    """Prints each finished utterance of ``tasks`` as one line ``<task>: <text>`` through
    ``write``. With a header (``text_header`` ``ask`` / ``id``) one utterance at a time is streamed
    live as its deltas arrive (the others wait for their line); with ``none`` the delta stream
    has no boundaries, so each line is written whole when its text arrives. Waiting notices get
    a line of their own and do not count.
    """

    def __init__(self, tasks: Iterable[str], header: str, write: Callable[[str], None]) -> None:
        self._streams = {t: _Stream() for t in tasks}
        self._live = header != "none"
        self._write = write
        self._owner: str | None = None  # task whose line is open
        self._shown = ""  # what that line shows after its prefix
        self._queued: list[str] = []  # whole lines waiting for the open line to end
        self.finished = 0

    def delta(self, task: str, text: str) -> None:
        """A message of ``task``'s delta topic."""
        s = self._streams[task]
        if not self._live or _WAITING.fullmatch(text):
            return
        if _is_header(text):
            s.started = True
            s.parts.append([text])
        elif s.started and s.parts:
            s.parts[-1].append(text)
        self._stream_live()

    def text(self, task: str, text: str) -> None:
        """A message of ``task``'s text topic: an utterance ended (or a waiting notice)."""
        if waiting_notice(text) is not None:
            self._line(f"{task}: {text}")
            return
        s = self._streams[task]
        self.finished += 1
        ours = bool(s.parts) and split_header("".join(s.parts[0]))[0] == split_header(text)[0]
        if ours:
            s.parts.pop(0)
        if self._owner == task and ours:
            rest = text[len(self._shown) :] if text.startswith(self._shown) else f"\n{task}: {text}"
            self._write(rest + "\n")
            self._owner, self._shown = None, ""
            for line in self._queued:
                self._write(line + "\n")
            self._queued.clear()
        else:
            self._line(f"{task}: {text}")
        self._stream_live()

    def _line(self, line: str) -> None:
        if self._owner is None:
            self._write(line + "\n")
        else:
            self._queued.append(line)

    def _stream_live(self) -> None:
        if self._owner is None:
            self._owner = next((t for t, s in self._streams.items() if s.parts), None)
            if self._owner is None:
                return
            self._write(f"{self._owner}: ")
        s = self._streams[self._owner]
        now = "".join(s.parts[0]) if s.parts else self._shown
        if now.startswith(self._shown) and len(now) > len(self._shown):
            self._write(now[len(self._shown) :])
            self._shown = now
