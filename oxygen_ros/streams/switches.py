"""Switch discontinuity: how far the commanded target jumps where a new action chunk takes over.

Consecutive action chunks are independent samples of the policy (unless real-time chunking makes
them consistent), so the command can jump where the robot switches from one chunk to the next.
One definition, used by the sim's chunk executor (``oxygen_ros.sim``), the closed-loop report and
the replay report (``oxygen_ros.replay``):

- A chunk's *target* at time ``t`` is the linear interpolation in time between its points (point
  ``i`` due at ``due[i]``), joint by joint; before its first point it is the first point, after its
  last point the last point.
- A *switch* happens where a chunk N newer than the chunk P in use takes over; ``t`` is the first
  time N is executed. Its *switch discontinuity* is ``max_j |P(t)[j] - N(t)[j]|``: the largest
  absolute difference over joints between the two targets at ``t``, in the joints' own units
  (radians, gripper units ...: the robot command units that go on the wire).
- When P no longer covers ``t`` (its last point is due before ``t - tolerance``: it ran out and the
  robot was holding) the switch is not measured: it is counted as a *switch after hold*.

ROS-free (numpy only); may import oxygen_ros.core only.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["ChunkSwitches", "SwitchStats", "first_executed", "switch_jump", "target_at"]

Times = Sequence[float] | np.ndarray
"""``[H]`` due times of a chunk's points, seconds: a sequence or an array."""

HISTORY = 2000
"""Most recent measured switches kept (the median is over these; the max over every switch)."""


def target_at(due: Times, positions: np.ndarray, t: float) -> np.ndarray:
    """``[n]`` the chunk's target at time ``t``: linear interpolation between its points in time,
    joint by joint (clamped to the first / last point outside ``due``).

    Args:
        due: ``[H]`` strictly increasing due times of the points, seconds.
        positions: ``[H, n]`` the points.
        t: time, seconds (same clock as ``due``).
    """
    times = np.asarray(due, dtype=np.float64)
    pos = np.asarray(positions, dtype=np.float64).reshape(len(times), -1)
    return np.array([np.interp(t, times, pos[:, j]) for j in range(pos.shape[1])])


def switch_jump(
    prev_due: Times,
    prev_positions: np.ndarray,
    new_due: Times,
    new_positions: np.ndarray,
    t: float,
    tolerance: float = 0.0,
) -> float | None:
    """The switch discontinuity (module doc) of a switch at ``t`` from chunk P to chunk N.

    Args:
        prev_due / prev_positions: P's ``[H]`` due times (s) and ``[H, n]`` points.
        new_due / new_positions: N's ``[H']`` due times (s) and ``[H', n]`` points (same joints).
        t: first time N is executed, seconds.
        tolerance: P still covers ``t`` while its last point is due at or after ``t - tolerance``
            (the executor's rounding: half a control period), seconds.

    Returns:
        ``max_j |P(t)[j] - N(t)[j]|`` (joint units), or None when P no longer covers ``t`` (a switch
        after hold: not measured).
    """
    if float(prev_due[-1]) < t - tolerance:
        return None
    diff = target_at(prev_due, prev_positions, t) - target_at(new_due, new_positions, t)
    return float(np.max(np.abs(diff))) if diff.size else 0.0


def first_executed(due: Times, available: float) -> int | None:
    """Index of the first point due at or after ``available`` (the time the chunk became
    available), or None when every point is due before it (the chunk is never executed)."""
    idx = int(np.searchsorted(np.asarray(due, dtype=np.float64), available - 1e-9, side="left"))
    return idx if idx < len(due) else None


class SwitchStats:
    """Figures of the switches seen so far: measured ones (count, last, median, max, the list of
    the last ``history``) and switches after hold (counted, not measured)."""

    def __init__(self, history: int = HISTORY) -> None:
        self.jumps: collections.deque[float] = collections.deque(maxlen=history)
        self.switches = 0
        self.after_hold = 0
        self.last: float | None = None
        self.max: float | None = None

    def add(self, jump: float | None) -> None:
        """Record one switch: its discontinuity, or None for a switch after hold."""
        if jump is None or not math.isfinite(jump):
            self.after_hold += jump is None
            return
        self.switches += 1
        self.last = jump
        self.max = jump if self.max is None else max(self.max, jump)
        self.jumps.append(jump)

    def summary(self) -> dict[str, Any]:
        """``switches`` (measured), ``switches_after_hold``, ``switch_jump_last``,
        ``switch_jump_median`` (over the last ``history``), ``switch_jump_max``: joint units, None
        (never 0) before the first measured switch."""
        return {
            "switches": self.switches,
            "switches_after_hold": self.after_hold,
            "switch_jump_last": self.last,
            "switch_jump_median": float(np.median(self.jumps)) if self.jumps else None,
            "switch_jump_max": self.max,
        }


class ChunkSwitches:
    """The switches of a sequence of chunks offered in the order they became available, as a robot
    executing each from its first executed point would see them (the replay's model).

    Point ``i`` of a chunk stamped ``stamp`` is due at ``stamp + (i + 1) * period_s``; a chunk is first
    executed at its first point due at or after the time it became available
    (:func:`first_executed`) and takes over from the chunk executed before it there. A chunk
    none of whose points is due by then is never executed (counted: ``chunks_never_executed``).

    Args:
        period_s: control period between points, seconds (> 0).
    """

    def __init__(self, period_s: float, history: int = HISTORY) -> None:
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"period_s must be finite and > 0, got {period_s}")
        self.period_s = float(period_s)
        self.stats = SwitchStats(history)
        self.never_executed = 0
        self._current: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, stamp: float, values: np.ndarray, available: float) -> float | None:
        """Offer the next chunk: ``[H, n]`` ``values`` (robot units), its stamp and the time it
        became available (seconds, the stamp's clock). Returns its switch discontinuity (None: the
        first chunk, a switch after hold or a chunk never executed)."""
        values = np.asarray(values, dtype=np.float64)
        due = stamp + self.period_s * np.arange(1, len(values) + 1)
        first = first_executed(due, available)
        if first is None:
            self.never_executed += 1
            return None
        prev, self._current = self._current, (due, values)
        if prev is None:
            return None
        jump = switch_jump(prev[0], prev[1], due, values, float(due[first]), 0.5 * self.period_s)
        self.stats.add(jump)
        return jump

    def summary(self) -> dict[str, Any]:
        """:meth:`SwitchStats.summary` plus ``chunks_never_executed``."""
        return self.stats.summary() | {"chunks_never_executed": self.never_executed}
