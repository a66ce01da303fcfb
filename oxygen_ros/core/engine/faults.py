"""Fault containment for the engine's stages: catch, count by kind, clean up after OOM.

Every stage of a frame (observation encoding, vision + prefill, denoise, the action callback,
prompt extension, batched decode + sampling, detokenising) runs inside :meth:`FaultLog.guard`. An
exception there does not leave :meth:`Engine.step`: the guard records a :class:`Fault` (stage,
error text, the requests the step touched) and the engine applies the contained outcome — the
frame's chunk is dropped with a counted reason, the touched requests end as FAILED with the error
text and release their blocks in the same frame (vLLM aborts a request the same way: its blocks
go back to the pool; no partial step is ever resumed past a lost position).

On an out-of-memory error (``torch.OutOfMemoryError``, the class CUDA raises) the guard also
frees the failed stage's scratch — the activations its frames still hold through the traceback
(``traceback.clear_frames``) — and then empties the CUDA
allocator cache once, so the next frame starts from a clean allocator; on the CPU the same path
runs with the cache call a no-op. ``KeyboardInterrupt``/``SystemExit`` are not contained.
"""

from __future__ import annotations

import gc
import traceback
import types
from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fault:
    """One contained exception.

    Attributes:
        stage: where it happened (``observation``, ``prefill``, ``denoise``, ``action_callback``,
            ``start``, ``decode``, ``detokenize``, ``frame``).
        error: ``"ExceptionType: message"``; frame_id: the control frame.
        request_ids: requests the failing step touched (they end as FAILED).
        oom: an out-of-memory error (scratch freed, allocator cache emptied).
        trace: the formatted traceback (for the one log line per kind).
    """

    stage: str
    error: str
    frame_id: int
    request_ids: tuple[int, ...] = ()
    oom: bool = False
    trace: str = ""

    @property
    def kind(self) -> str:
        """Counter key: the stage, with ``_oom`` for out-of-memory errors."""
        return f"{self.stage}_oom" if self.oom else self.stage


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (``torch.OutOfMemoryError`` on any device)."""
    return isinstance(exc, torch.OutOfMemoryError)


class _Guard:
    """Context of one guarded stage; ``fault`` is set if it raised (the exception is swallowed)."""

    def __init__(self, log: FaultLog, stage: str, request_ids: tuple[int, ...]) -> None:
        self.log, self.stage, self.request_ids = log, stage, request_ids
        self.fault: Fault | None = None

    def __enter__(self) -> _Guard:
        return self

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        self.fault = self.log.record(self.stage, exc, self.request_ids)
        return True


class FaultLog:
    """Counts contained faults by kind and holds this frame's list.

    Args:
        device: the model's device (the CUDA cache is emptied only there).
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.counts: dict[str, int] = {}
        self.frame: list[Fault] = []
        self.frame_id = 0
        self.cache_emptied = 0

    def begin_frame(self, frame_id: int) -> None:
        """Start collecting the faults of ``frame_id``."""
        self.frame, self.frame_id = [], frame_id

    def guard(self, stage: str, request_ids: Iterable[int] = ()) -> _Guard:
        """``with log.guard("decode", ids) as g: ...`` — afterwards ``g.fault`` is the fault or ``None``."""
        return _Guard(self, stage, tuple(request_ids))

    def record(self, stage: str, exc: Exception, request_ids: Iterable[int] = ()) -> Fault:
        """Count ``exc`` raised in ``stage``; on OOM free scratch and empty the allocator cache once."""
        oom = is_oom(exc)
        f = Fault(
            stage,
            f"{type(exc).__name__}: {exc}",
            self.frame_id,
            tuple(request_ids),
            oom,
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )
        if oom:
            traceback.clear_frames(exc.__traceback__)  # the failed stage's activations go now
            gc.collect()
            self.empty_cache()
        self.counts[f.kind] = self.counts.get(f.kind, 0) + 1
        self.frame.append(f)
        return f

    def empty_cache(self) -> None:
        """Return the CUDA allocator's cached blocks to the device (no-op on the CPU); counted."""
        if self.cuda:
            torch.cuda.empty_cache()
        self.cache_emptied += 1

    def count(self, kind: str) -> None:
        """Count a fault that is not an exception (e.g. ``non_finite_logits`` of one row)."""
        self.counts[kind] = self.counts.get(kind, 0) + 1

    @property
    def total(self) -> int:
        """Faults contained so far."""
        return sum(self.counts.values())


__all__ = ["Fault", "FaultLog", "is_oom"]
