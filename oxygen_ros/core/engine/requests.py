"""Language requests and the per-frame results the engine returns (plain Python; the typed KV
state of a running request lives in :class:`~.frame.RequestState`)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from ..types import ActionChunk, FrameMetrics, TextDelta
from .plan import FramePlan

if TYPE_CHECKING:  # frame.py holds torch tensors; it never imports this module
    from .frame import RequestState


class RequestStatus(IntEnum):
    """Lifecycle of a language request; the order is the order of progress.

    QUEUED → RUNNING → one terminal state (FINISHED, CANCELLED, REJECTED, FAILED).
    """

    QUEUED = 0
    RUNNING = 1
    FINISHED = 2
    CANCELLED = 3
    REJECTED = 4
    FAILED = 5

    @property
    def terminal(self) -> bool:
        """Whether the request is over (its blocks are released)."""
        return self >= RequestStatus.FINISHED


#: How a request can end, as counted by :class:`RequestCounts` (an expired request has status
#: REJECTED and a reason starting with "expired").
OUTCOMES = ("finished", "rejected", "expired", "failed", "cancelled")


def outcome_of(status: RequestStatus, reason: str) -> str:
    """The accounting outcome of a terminal ``status`` (one of :data:`OUTCOMES`).

    Raises:
        ValueError: ``status`` is not terminal.
    """
    if not status.terminal:
        raise ValueError(f"request status {status.name} has no outcome yet")
    if status == RequestStatus.REJECTED and reason.startswith("expired"):
        return "expired"
    return status.name.lower()


class RequestCounts:
    """Per-task request accounting (thread-safe): every accepted request is counted once as
    submitted and once by how it ended, so ``submitted = finished + rejected + expired + failed +
    cancelled + in_flight`` holds at all times (vLLM's engine accounts for requests the same way:
    each one it accepted ends finished, aborted or errored, and the caller is told)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, Counter[str]] = {}

    def submitted(self, task: str) -> None:
        """Count one accepted request of ``task``."""
        with self._lock:
            self._counts.setdefault(task, Counter())["submitted"] += 1

    def ended(self, task: str, outcome: str) -> None:
        """Count one request of ``task`` that ended with ``outcome`` (one of :data:`OUTCOMES`)."""
        with self._lock:
            self._counts.setdefault(task, Counter())[outcome] += 1

    def in_flight(self, task: str) -> int:
        """Submitted and not yet ended."""
        with self._lock:
            c = self._counts.get(task, Counter())
            return c["submitted"] - sum(c[o] for o in OUTCOMES)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``task -> {submitted, finished, rejected, expired, failed, cancelled, in_flight}``."""
        with self._lock:
            out = {}
            for task, c in sorted(self._counts.items()):
                row = {"submitted": c["submitted"], **{o: c[o] for o in OUTCOMES}}
                row["in_flight"] = row["submitted"] - sum(c[o] for o in OUTCOMES)
                out[task] = row
            return out

    def reset(self) -> None:
        """Forget every count (after warm-up)."""
        with self._lock:
            self._counts.clear()


@dataclass(frozen=True)
class Prompt:
    """A request's prompt, built when the request is created (:meth:`RequestBook.prompt`).

    Attributes:
        text: the filled template; ids: its token ids after the frame prefix (no BOS);
        prefix_ids: an ``own_prefix`` task's own prefix prompt (BOS first; ``ids`` then empty);
        reject / fail: why it could not be built (the request ends REJECTED / FAILED), else ``""``.
    """

    text: str = ""
    ids: list[int] = field(default_factory=list)
    prefix_ids: list[int] = field(default_factory=list)
    reject: str = ""
    fail: str = ""


@dataclass
class LanguageRequest:
    """One language request (conversation answer, memory note …).

    Attributes:
        id: engine-unique id; task: task name; text: the ask (may be empty).
        prompt: the filled template appended after the frame prefix; ``prompt_ready`` once built (at
            submission when the instruction is known then, else at admission).
        prompt_ids: its token ids (no BOS).
        prefix_ids: for an ``own_prefix`` task, the ids (BOS first) of its own prefix prompt
            (``prompt_ids`` is then empty: decoding starts at the prefix's last token).
        sample_key: key of its counter-based sampling noise (the seed, or drawn at creation; see
            :mod:`~oxygen_ros.core.model.sampling`).
        max_new_tokens: token budget; stop_ids: ids that end the request (EOS always does).
        frame_id: the control frame whose prefix it continues (set at admission).
        output_ids: generated tokens so far (stop token excluded).
        pending: the last sampled token, not yet fed to the model (-1 when none).
        reason: finish / reject / failure reason text.
        overtaken: times later requests were admitted while it waited (admission aging).
        state: engine-private KV/decoding state while RUNNING (:class:`RequestState`), else ``None``.
    """

    id: int
    task: str
    text: str
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    seed: int | None = None
    sample_key: int = 0
    stop_ids: tuple[int, ...] = ()
    status: RequestStatus = RequestStatus.QUEUED
    prompt: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    prefix_ids: list[int] = field(default_factory=list)
    prompt_ready: bool = False
    frame_id: int = -1
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    pending: int = -1
    reason: str = ""
    cancel_requested: bool = False
    overtaken: int = 0
    t_submit: float = 0.0
    t_first_token: float | None = None
    t_done: float | None = None
    state: RequestState | None = None

    @property
    def remaining(self) -> int:
        """Tokens it may still emit."""
        return self.max_new_tokens - len(self.output_ids)

    @property
    def running_state(self) -> RequestState:
        """``state`` of a request that holds one (attached at admission, dropped when it ends)."""
        assert self.state is not None, f"request {self.id} holds no KV state"
        return self.state


@dataclass
class RequestResult:
    """A request that ended this frame (finished, cancelled, rejected or failed)."""

    id: int
    task: str
    status: RequestStatus
    reason: str
    text: str
    token_ids: list[int]
    frame_id: int
    time_to_first_token: float | None
    latency: float | None

    @property
    def outcome(self) -> str:
        """How it ended: one of :data:`OUTCOMES`."""
        return outcome_of(self.status, self.reason)

    @classmethod
    def of(cls, r: LanguageRequest) -> RequestResult:
        """Snapshot of a terminal request."""
        ttft = None if r.t_first_token is None else r.t_first_token - r.t_submit
        lat = None if r.t_done is None else r.t_done - r.t_submit
        return cls(r.id, r.task, r.status, r.reason, r.output_text, list(r.output_ids), r.frame_id, ttft, lat)


@dataclass
class FrameResult:
    """Everything one control frame produced.

    ``action`` is ``None`` only when no observation was available or the frame's input was bad
    (``error`` says why); language work still advances in such a frame. ``plan`` is the
    scheduler's :class:`~.plan.FramePlan` of the frame (admitted / decoding / finished ids);
    ``faults`` the exceptions contained this frame (:class:`~.faults.Fault`: stage, error, requests).
    """

    frame_id: int
    action: ActionChunk | None
    deltas: list[TextDelta]
    ended: list[RequestResult]
    metrics: FrameMetrics
    error: str | None = None
    plan: FramePlan | None = None
    faults: list[Any] = field(default_factory=list)
