"""Turns the engine's text deltas and ended requests into readable per-task text streams (ROS-free).

The engine decodes several requests of a task in the same batch, so their deltas interleave. A
``std_msgs/String`` topic has no request id, so the node streams ONE utterance at a time per
task (:class:`TaskTextStream`): the deltas of the oldest open utterance go out live; those of
later ones are held back and flushed, in order, as soon as every earlier one has ended. Each
utterance ends with its whole text on the task's text topic, so a reader concatenating the deltas
between two finished texts gets exactly that text (the engine guarantees deltas never split a
UTF-8 character).

Every request that ends is answered with an utterance, in order:

- asks are opened when they are submitted (:meth:`Utterances.submit`), so several asks of one
  task are answered in the order they arrived; periodic requests open with their first output;
- each utterance starts with a header (node parameter ``text_header``): ``ask`` (default)
  ``[#3 Q: What do you see?] `` for an ask (at most :data:`HEADER_ASK_CHARS` characters of the
  question, then ``…``), ``[#7] `` for a periodic request; ``id`` only the
  request number; ``none`` nothing (plain text, e.g. for a text-to-speech consumer);
- a request that ends for any reason other than finishing (rejected, expired, failed, cancelled)
  ends its utterance with a notice saying why, e.g. ``[request 3 expired: waited 30.0 s …]``,
  after whatever text it had produced;
- an ask taken while the node is not active gets no request: it is answered at once with
  :func:`ignored_notice` on the task's text topic;
- an ask taken while the node has no observation yet (no camera image assembled since
  activation, or every camera silent for ``input_timeout_s``: it can only wait in the queue) gets an immediate
  *waiting notice* on the task's text
  topic (:func:`waiting_notice`), e.g. ``[request 3 waiting: no camera input yet; it waits up to
  30.0 s (engine.max_queue_wait_s) for an observation]``. It is NOT the end of the utterance and
  not part of it: no header, no deltas; the utterance (the answer, or the expiry notice) follows
  as usual. Readers of the text topic recognise it by its prefix ``[request N waiting:``
  (:func:`is_waiting_notice`) and keep waiting;
- a NUL character (a model can decode one: byte-fallback token ``<0x00>``) is sent as U+FFFD:
  ROS strings are NUL-terminated, so the rmw would cut the message there and the deltas would no
  longer add up to the text.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from oxygen_ros.core.engine.requests import RequestResult
from oxygen_ros.core.types import TextDelta

__all__ = [
    "HEADERS",
    "HEADER_ASK_CHARS",
    "Emit",
    "TaskTextStream",
    "Utterances",
    "end_notice",
    "header_echo",
    "ignored_notice",
    "is_waiting_notice",
    "waiting_notice",
]

#: Values of the ``text_header`` parameter.
HEADERS = ("ask", "id", "none")
#: The ``ask`` header echoes at most this many characters of the question (longer: a prefix and '…').
HEADER_ASK_CHARS = 80


@dataclass(frozen=True)
class Emit:
    """One message to publish: ``kind`` is ``'delta'`` or ``'text'``; ``text`` its payload."""

    kind: str
    text: str
    request_id: int


def end_notice(r: RequestResult) -> str | None:
    """Why ``r`` ended, for its utterance — ``[request 3 rejected: <reason>]`` (``[request 3
    cancelled]`` when the reason adds nothing) — or ``None`` for a request that finished."""
    outcome = r.outcome
    if outcome == "finished":
        return None
    reason = r.reason.strip()
    if reason.startswith(outcome + ":"):  # "expired: waited 30.0 s ..." says it once
        reason = reason[len(outcome) + 1 :].strip()
    return f"[request {r.id} {outcome}]" if reason in ("", outcome) else f"[request {r.id} {outcome}: {reason}]"


def waiting_notice(request_id: int, max_wait_s: float, reason: str = "no camera input yet") -> str:
    """The immediate reply to an ask that can only wait for an observation (see module doc):
    ``[request 3 waiting: no camera input yet; it waits up to 30.0 s (engine.max_queue_wait_s) for
    an observation]``; with ``max_wait_s`` 0 (no age bound) ``… it waits for an observation
    (engine.max_queue_wait_s = 0: no limit)]``. Always starts with ``[request N waiting:``."""
    if max_wait_s > 0:
        wait = f"it waits up to {max_wait_s:.1f} s (engine.max_queue_wait_s) for an observation"
    else:
        wait = "it waits for an observation (engine.max_queue_wait_s = 0: no limit)"
    return f"[request {request_id} waiting: {reason}; {wait}]"


def ignored_notice(ask: str, reason: str) -> str:
    """The reply to an ask the node does not take at all (it is not active): ``[ask ignored: the
    node is inactive; asks are answered only while it is active] Q: What do you see?`` — a whole
    text-topic message, no request id (none was created), the question echoed as in a header."""
    return f"[ask ignored: {reason}] Q: {header_echo(ask)}"


def is_waiting_notice(text: str) -> bool:
    """Whether a text-topic message is a :func:`waiting_notice` (not an utterance's end)."""
    head, sep, _ = text.partition(" waiting:")
    return bool(sep) and head.startswith("[request ") and head[len("[request ") :].isdigit()


def header_echo(ask: str) -> str:
    """The question as the ``ask`` header echoes it: one line (whitespace collapsed), at most
    :data:`HEADER_ASK_CHARS` characters (a longer one is cut and ends with ``…``), NUL-free."""
    ask = _wire(" ".join(ask[: 4 * HEADER_ASK_CHARS].split()))  # one line in `ros2 topic echo`
    if len(ask) > HEADER_ASK_CHARS:  # a prefix, never a whole (possibly huge) question
        ask = ask[: HEADER_ASK_CHARS - 1].rstrip() + "…"
    return ask


def _wire(text: str) -> str:
    """``text`` as a ROS string can carry it: NUL (the C string terminator) becomes U+FFFD."""
    return text.replace("\x00", "\ufffd")


@dataclass
class _Utterance:
    header: str
    header_sent: bool = False
    deltas: list[str] = field(default_factory=list)  # not yet emitted
    so_far: str = ""  # every delta's text (for :meth:`TaskTextStream.abandon`)
    final: str | None = None  # set when the request has ended


class TaskTextStream:
    """Serialises the utterances of one task's requests (not thread-safe: see :class:`Utterances`).

    Args:
        header: ``ask``, ``id`` or ``none`` (see module doc).

    Raises:
        ValueError: unknown ``header``.
    """

    def __init__(self, header: str = "ask") -> None:
        if header not in HEADERS:
            raise ValueError(f"text_header={header!r}: expected one of {', '.join(HEADERS)}")
        self.header = header
        self._open: OrderedDict[int, _Utterance] = OrderedDict()  # in answer order

    @property
    def pending(self) -> int:
        """Utterances opened but not yet fully emitted."""
        return len(self._open)

    def _header(self, request_id: int, ask: str) -> str:
        if self.header == "none":
            return ""
        ask = header_echo(ask)
        return f"[#{request_id} Q: {ask}] " if self.header == "ask" and ask else f"[#{request_id}] "

    def _get(self, request_id: int) -> _Utterance:
        utt = self._open.get(request_id)
        if utt is None:
            utt = self._open[request_id] = _Utterance(self._header(request_id, ""))
        return utt

    def open(self, request_id: int, ask: str = "") -> None:
        """Reserve ``request_id``'s place in the answer order (call when the ask is submitted,
        before the engine can produce output for it); nothing is emitted yet."""
        if request_id not in self._open:
            self._open[request_id] = _Utterance(self._header(request_id, ask))

    def delta(self, request_id: int, text: str) -> list[Emit]:
        """A new delta of ``request_id`` (empty text is allowed: it opens the utterance)."""
        utt = self._get(request_id)
        if text:
            utt.deltas.append(_wire(text))
            utt.so_far += text
        return self._flush()

    def end(self, request_id: int, text: str, notice: str | None = None) -> list[Emit]:
        """``request_id`` ended with whole text ``text``; ``notice`` (why it ended, for anything
        but finishing) closes the utterance after the text. Every call completes an utterance."""
        utt = self._get(request_id)
        text = _wire(text)
        tail = ""
        if notice:
            tail = (" " if text and not text.endswith(" ") else "") + notice
            utt.deltas.append(tail)
        utt.final = utt.header + text + tail
        return self._flush()

    def abandon(self, notice_of: Callable[[int], str]) -> list[Emit]:
        """End every open utterance now with ``notice_of(request_id)`` (after the text it had),
        in answer order: the last resort when the engine cannot end its requests itself."""
        out: list[Emit] = []
        for rid in list(self._open):
            if self._open[rid].final is None:
                out.extend(self.end(rid, self._open[rid].so_far, notice_of(rid)))
        return out

    def _flush(self) -> list[Emit]:
        out: list[Emit] = []
        while self._open:
            rid, utt = next(iter(self._open.items()))
            if utt.header and not utt.header_sent:
                out.append(Emit("delta", utt.header, rid))
                utt.header_sent = True
            out.extend(Emit("delta", d, rid) for d in utt.deltas)
            utt.deltas.clear()
            if utt.final is None:
                break
            out.append(Emit("text", utt.final, rid))
            del self._open[rid]
        return out


class Utterances:
    """The text streams of every task, shared by the thread that submits asks and the one that
    handles frame results (one lock: an ask's place is reserved before any output of it exists).

    Args:
        tasks: the task names; header: ``text_header`` (see module doc).
    """

    def __init__(self, tasks: Iterable[str], header: str = "ask") -> None:
        self._streams = {t: TaskTextStream(header) for t in tasks}
        self._lock = threading.Lock()

    def submit(
        self, task: str, ask: str, submit: Callable[[], int], opened: Callable[[int], None] | None = None
    ) -> int:
        """Run ``submit`` (which hands the ask to the engine and returns its request id) and open
        the utterance, atomically with respect to :meth:`frame`; then ``opened(request_id)``, still
        under the lock (what it publishes goes out before anything of the request a later
        :meth:`frame` emits). Returns the request id.

        Raises:
            KeyError / ValueError: whatever ``submit`` raised (nothing is opened).
        """
        with self._lock:
            rid = submit()
            if task in self._streams:
                self._streams[task].open(rid, ask)
            if opened is not None:
                opened(rid)
            return rid

    def frame(self, deltas: Iterable[TextDelta], ended: Iterable[RequestResult]) -> dict[str, list[Emit]]:
        """One frame's outputs → the messages to publish per task, in order (deltas first, then
        the ended requests with their notices)."""
        out: dict[str, list[Emit]] = {}
        with self._lock:
            for d in deltas:
                out.setdefault(d.task, []).extend(self._streams[d.task].delta(d.request_id, d.text))
            for r in ended:
                out.setdefault(r.task, []).extend(self._streams[r.task].end(r.id, r.text, end_notice(r)))
        return out

    def abandon(self, reason: str, outcome: str = "failed") -> dict[str, list[Emit]]:
        """End every open utterance of every task with ``[request N <outcome>: <reason>]`` (see
        :meth:`TaskTextStream.abandon`); the messages to publish per task."""
        with self._lock:
            return {
                task: emits
                for task, stream in self._streams.items()
                if (emits := stream.abandon(lambda rid: f"[request {rid} {outcome}: {reason}]"))
            }

    def set_header(self, header: str) -> None:
        """Header of the utterances opened from now on (the ``text_header`` parameter, live).

        Raises:
            ValueError: unknown ``header``.
        """
        if header not in HEADERS:
            raise ValueError(f"text_header={header!r}: expected one of {', '.join(HEADERS)}")
        with self._lock:
            for stream in self._streams.values():
                stream.header = header

    @property
    def pending(self) -> int:
        """Utterances opened and not yet completed, over all tasks."""
        with self._lock:
            return sum(s.pending for s in self._streams.values())
