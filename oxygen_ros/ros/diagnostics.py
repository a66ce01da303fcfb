"""Diagnostics of the ``oxygen`` node: rolling frame statistics, a problem log, and the
``diagnostic_msgs/DiagnosticArray`` built from them.

:class:`FrameStats` and :class:`ProblemLog` are plain Python (thread-safe, clock passed in);
:func:`build_status` turns a snapshot into a ``DiagnosticStatus``. Metric definitions follow
docs/architecture.md, 'Metrics': frame time T is the wall time of one engine step; action frequency = H / T (median T);
chunk and frame rates are counted over the window; tok/s = tokens emitted / window wall time.
Schedule metrics (issue 13, defined in ``oxygen_ros.core.engine.metrics``): chunk latency with and
without language load, batcher busy fraction and tokens per frame, over the same window.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

from oxygen_ros.core.types import FrameMetrics

__all__ = ["ERROR", "OK", "STALE", "WARN", "FrameStats", "ProblemLog", "build_status", "log_at"]

OK, WARN, ERROR, STALE = 0, 1, 2, 3  # DiagnosticStatus levels as ints (the message field is a byte)


@dataclass
class _Frame:
    t: float
    frame_time: float
    chunk: bool
    tokens: int
    batch: int
    deadline_met: bool
    latency: float | None = None
    language: bool = False
    busy: float | None = None


class FrameStats:
    """Rolling window (``window_s`` seconds) of engine frames and command ticks."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._frames: collections.deque[_Frame] = collections.deque()
        self._commands: collections.deque[float] = collections.deque()
        self.total_frames = 0
        self.total_chunks = 0
        self.total_tokens = 0
        self.deadline_misses = 0
        self.blocks_in_use = 0
        self.blocks_total = 0

    def record(self, now: float, m: FrameMetrics, chunk: bool) -> None:
        """Record one engine step that ended at ``now`` (monotonic seconds)."""
        with self._lock:
            x = m.extra
            self._frames.append(
                _Frame(
                    now,
                    m.frame_time,
                    chunk,
                    m.tokens_emitted,
                    m.decode_batch,
                    m.deadline_met,
                    x.get("chunk_latency"),
                    bool(x.get("language_load")),
                    x.get("batcher_busy"),
                )
            )
            self.total_frames += 1
            self.total_chunks += int(chunk)
            self.total_tokens += m.tokens_emitted
            self.deadline_misses += int(not m.deadline_met)
            self.blocks_in_use, self.blocks_total = m.blocks_in_use, m.blocks_total
            self._trim(now)

    def record_command(self, now: float) -> None:
        """Record one published per-step command at ``now``."""
        with self._lock:
            self._commands.append(now)
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._frames and now - self._frames[0].t > self.window_s:
            self._frames.popleft()
        while self._commands and now - self._commands[0] > self.window_s:
            self._commands.popleft()

    def summary(self, now: float, horizon: int) -> dict[str, float]:
        """Window statistics: frame_hz, chunk_hz, action_hz (H/T), command_hz, tok_per_s,
        frame_time_p50_ms, frame_time_p99_ms, decode_batch (mean, max), chunk_latency_ms with and
        without language load (mean; 0 when none), batcher_busy (mean fraction), tokens_per_frame."""
        with self._lock:
            self._trim(now)
            frames = list(self._frames)
            commands = len(self._commands)
        span = self.window_s
        if frames:
            span = max(min(self.window_s, now - frames[0].t), 1e-3)
        chunk_times = np.array([f.frame_time for f in frames if f.chunk], dtype=np.float64)
        p50 = float(np.percentile(chunk_times, 50)) if chunk_times.size else 0.0
        p99 = float(np.percentile(chunk_times, 99)) if chunk_times.size else 0.0
        batches = [f.batch for f in frames if f.batch]
        return {
            "frame_hz": len(frames) / span if len(frames) > 1 else 0.0,
            "chunk_hz": sum(f.chunk for f in frames) / span if len(frames) > 1 else 0.0,
            "action_hz": horizon / p50 if p50 > 0 else 0.0,
            "command_hz": commands / self.window_s,
            "tok_per_s": sum(f.tokens for f in frames) / span if frames else 0.0,
            "frame_time_p50_ms": p50 * 1e3,
            "frame_time_p99_ms": p99 * 1e3,
            "decode_batch_mean": float(np.mean(batches)) if batches else 0.0,
            "decode_batch_max": float(max(batches)) if batches else 0.0,
            **_schedule(frames),
        }


def _schedule(frames: list[_Frame]) -> dict[str, float]:
    """Schedule metrics of the window (means; 0.0 where nothing was measured)."""

    def mean(xs: list[float]) -> float:
        return float(np.mean(xs)) if xs else 0.0

    lat = [(f.latency, f.language) for f in frames if f.latency is not None]
    return {
        "chunk_latency_language_ms": 1e3 * mean([x for x, lang in lat if lang]),
        "chunk_latency_no_language_ms": 1e3 * mean([x for x, lang in lat if not lang]),
        "batcher_busy": mean([f.busy for f in frames if f.busy is not None]),
        "tokens_per_frame": mean([float(f.tokens) for f in frames]),
    }


class ProblemLog:
    """Counts problems by kind and remembers the last message of each.

    A kind is *recent* while its last report is younger than ``recent_s`` seconds; recent
    problems set the diagnostic level (their own level) and message.
    """

    def __init__(self, recent_s: float = 5.0) -> None:
        self.recent_s = recent_s
        self._lock = threading.Lock()
        self._items: dict[str, list[Any]] = {}  # kind -> [count, last message, last time, level]

    def report(self, kind: str, message: str, now: float, level: int = WARN) -> bool:
        """Count a problem; returns True the first time ``kind`` is reported (for logging once)."""
        with self._lock:
            item = self._items.get(kind)
            if item is None:
                self._items[kind] = [1, message, now, level]
                return True
            item[0] += 1
            item[1:] = [message, now, level]
            return False

    def counts(self) -> dict[str, int]:
        """kind -> how many times it was reported."""
        with self._lock:
            return {k: v[0] for k, v in self._items.items()}

    def recent(self, now: float) -> list[tuple[int, str, str, int]]:
        """(level, kind, last message, count) of recent problems, most severe first."""
        with self._lock:
            out = [(v[3], k, v[1], v[0]) for k, v in self._items.items() if now - v[2] <= self.recent_s]
        return sorted(out, key=lambda x: (-x[0], x[1]))

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()


def log_at(logger: Any, level: int, message: str) -> None:
    """Log ``message`` on an rclpy logger at a problem ``level`` (``OK`` info, ``WARN``, ``ERROR``).

    rclpy binds one severity (and one set of filters) to each call site of a logger: logging from
    the same line at a second severity raises ``ValueError('Logger severity cannot be changed
    between calls.')``. Code that logs at a level chosen at run time must therefore use one call
    site per severity — this function's three. (A report that chose between ``logger.error`` and
    ``logger.warning`` on one line killed the inference thread at its first contained fault.)
    """
    if level >= ERROR:
        logger.error(message)
    elif level >= WARN:
        logger.warning(message)
    else:
        logger.info(message)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value == value else "nan"
    return str(value)


def build_status(name: str, hardware_id: str, level: int, message: str, values: dict[str, object]) -> DiagnosticStatus:
    """A ``DiagnosticStatus`` (``level`` 0 OK, 1 WARN, 2 ERROR, 3 STALE) with ``values`` as
    key/value strings (floats to 3 decimals)."""
    return DiagnosticStatus(
        level=bytes([level]),
        name=name,
        hardware_id=hardware_id,
        message=message,
        values=[KeyValue(key=k, value=_fmt(v)) for k, v in values.items()],
    )
