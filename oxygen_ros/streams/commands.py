"""Per-step command stream: steps through the newest action chunk, aligned by time (ROS-free).

A chunk computed from the observation stamped ``t0`` holds point ``i`` (0-based) for time
``t0 + (i + 1) * period`` — the same timing as the published JointTrajectory. At a command tick at
time ``now`` the stream sends the point nearest to ``now``: ``i = round((now - t0) / period) - 1``,
clamped to the chunk. After the chunk's last point the last point is held for at most
``max_hold_s``; then nothing is sent (the chunk has *expired*) until a newer chunk arrives, so a
stalled model never keeps replaying an old plan. Non-finite rows are never returned.

Thread-safety: :meth:`set_chunk` (inference thread) and :meth:`sample` (timer thread) may run
concurrently.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

__all__ = ["CommandSample", "CommandStream"]


@dataclass
class CommandSample:
    """One command tick.

    Attributes:
        positions: ``[n]`` float64 command (robot units), or None when nothing is sent.
        index: the chunk point used (-1 when none).
        reason: why nothing is sent (``no chunk yet`` / ``chunk expired``), empty otherwise.
    """

    positions: np.ndarray | None
    index: int = -1
    reason: str = ""


class CommandStream:
    """Holds the newest chunk and samples it at command ticks."""

    def __init__(self, period_s: float, max_hold_s: float) -> None:
        """Args:
            period_s: control period between chunk points, seconds (> 0).
            max_hold_s: how long the last point is held after the chunk ends, seconds (>= 0).

        Raises:
            ValueError: a non-finite or out-of-range argument.
        """
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"period_s must be finite and > 0, got {period_s}")
        if not (math.isfinite(max_hold_s) and max_hold_s >= 0):
            raise ValueError(f"max_hold_s must be finite and >= 0, got {max_hold_s}")
        self.period_s = float(period_s)
        self.max_hold_s = float(max_hold_s)
        self._lock = threading.Lock()
        self._chunk: np.ndarray | None = None
        self._t0 = 0.0

    def set_chunk(self, actions: np.ndarray, stamp: float) -> bool:
        """Make ``actions`` (``[H, n]``, robot units) observed at ``stamp`` seconds the current chunk.

        Returns:
            False (and the chunk is ignored) when it is empty, has non-finite values, or is older
            than the current chunk.
        """
        arr = np.array(actions, dtype=np.float64)  # a copy: the caller may reuse its buffer
        if arr.ndim != 2 or arr.shape[0] == 0 or not np.isfinite(arr).all() or not math.isfinite(stamp):
            return False
        with self._lock:
            if self._chunk is not None and stamp < self._t0:
                return False
            self._chunk, self._t0 = arr, float(stamp)
        return True

    def clear(self) -> None:
        """Drop the current chunk (deactivation, time jump)."""
        with self._lock:
            self._chunk = None

    def sample(self, now: float) -> CommandSample:
        """The command for time ``now`` (seconds, same clock as the chunk stamps)."""
        with self._lock:
            chunk, t0 = self._chunk, self._t0
        if chunk is None:
            return CommandSample(None, reason="no chunk yet")
        horizon = chunk.shape[0]
        end = t0 + horizon * self.period_s
        if now > end + self.max_hold_s:
            return CommandSample(None, reason="chunk expired")
        index = min(max(round((now - t0) / self.period_s) - 1, 0), horizon - 1)
        return CommandSample(chunk[index].copy(), index=index)
