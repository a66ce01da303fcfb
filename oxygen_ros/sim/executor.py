"""Time-aligned execution of action chunks with a safe hold (ROS-free, unit-testable).

The simulated robot (``oxygen_ros.sim.node``) asks :class:`ChunkExecutor` once per control
step which joint command to apply. Chunks arrive as JointTrajectory-like data: joint names, an
observation ``stamp`` (seconds) and points with ``time_from_start`` (seconds) and positions.

Rules (all times in seconds on the simulation clock, the clock that stamped the observations):

- Point ``i`` of a chunk is due at ``stamp + time_from_start[i]``. At a step starting at ``now``
  the executor applies the *latest point already due*: the largest ``i`` with
  ``due[i] <= now + step_s / 2`` (so rounding of stamps never skips or repeats a point).
- A newer chunk (larger stamp) replaces the rest of the older one *from its first due time*:
  until then the older chunk keeps running. A chunk with the same stamp as the newest one
  (computed again from the same observation time) replaces it outright (counted as
  ``same_stamp``). A chunk that arrives late starts at the point due now (the skipped points are
  counted as ``late_points``).
- Rejected, counted, never executed: wrong joint names (missing, duplicated or unknown), points
  whose size does not match the names, non-finite positions or times, times that do not strictly
  increase, no points; a stamp older than the newest accepted chunk (``out_of_order``); a
  stamp at or before the last reset (``stale``); every point already in the past (``expired``).
- When no chunk covers ``now`` (the chunk ended and no newer one has started: the policy is dead,
  stalled or late) the last applied command is *held*. A hold that lasts ``loss_timeout_s`` is a
  *loss* (one ``loss`` event per episode); the next covering chunk gives a ``resumed`` event.
  Before the first chunk after start/reset the state is ``waiting`` (held too, never a loss).
- Optional speed limit: the applied command moves at most ``max_speed * step_s`` per step and
  joint from the previous applied command (radians, or gripper units, per second), so neither a
  resumed policy nor a wild chunk makes the robot jump. The applied command is always finite.
- Chunk switches (the step where a newer chunk takes over) are measured: the *switch
  discontinuity* is the largest absolute difference over joints between the previous and the new
  chunk's targets (linear interpolation between points) at that step; a switch from a chunk that
  had run out is a ``switches_after_hold`` (see :mod:`oxygen_ros.sim.exec_stats`).

A per-step command stream (``sensor_msgs/JointState``-like: names, stamp, positions) is the
alternative source (``source='stream'``): the newest command is applied while it is younger than
``stream_timeout_s``; after that the same hold/loss rules apply.

Thread-safety: ``offer_*`` (ROS callbacks) and :meth:`ChunkExecutor.step` (the simulation thread)
may run concurrently; one lock guards the state.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oxygen_ros.sim.commands import (
    SOURCES,
    Command,
    ExecState,
    Verdict,
    check_chunk,
    check_command,
    check_settings,
    percentile,
)
from oxygen_ros.sim.exec_stats import ExecStats

__all__ = ["SOURCES", "ChunkExecutor", "Command", "ExecState", "Verdict", "percentile"]


@dataclass
class _Chunk:
    stamp: float
    due: np.ndarray  # [H] absolute due times, strictly increasing
    positions: np.ndarray  # [H, n] in executor joint order
    started: bool = False


class ChunkExecutor:
    """Selects the joint command of each control step from time-stamped chunks (see module doc).

    Args:
        joint_names: the robot's joints, in the order of the commands it applies.
        step_s: control period of the robot, seconds (> 0).
        initial: ``[n]`` finite initial command (the pose held until the first chunk).
        loss_timeout_s: a hold this long (seconds, >= 0) is reported as a loss.
        max_speed: speed limit of the applied command per joint, units per second
            (0 = no limit).
        source: ``'trajectory'`` (chunks) or ``'stream'`` (per-step commands).
        stream_timeout_s: a stream command older than this (seconds, > 0) no longer counts.
        max_pending: most chunks kept (the running one plus newer ones not yet due).

    Raises:
        ValueError: empty/duplicate joint names, bad ``initial`` or a non-finite / out-of-range
            setting.
    """

    def __init__(
        self,
        joint_names: Sequence[str],
        step_s: float,
        initial: Sequence[float] | np.ndarray,
        loss_timeout_s: float = 0.25,
        max_speed: float = 0.0,
        source: str = "trajectory",
        stream_timeout_s: float = 0.1,
        max_pending: int = 8,
    ) -> None:
        names = tuple(joint_names)
        check_settings(names, step_s, loss_timeout_s, max_speed, source, stream_timeout_s, max_pending)
        self.joint_names = names
        self.step_s = float(step_s)
        self.loss_timeout_s = float(loss_timeout_s)
        self.max_speed = float(max_speed)
        self.source = source
        self.stream_timeout_s = float(stream_timeout_s)
        self.max_pending = int(max_pending)
        self._index = {n: i for i, n in enumerate(names)}
        self._lock = threading.Lock()
        self._stats = ExecStats()
        self._reset_locked(self._check_pose(initial), -math.inf)

    # ------------------------------------------------------------------ helpers
    def _check_pose(self, positions: Sequence[float] | np.ndarray) -> np.ndarray:
        arr = np.array(positions, dtype=np.float64).reshape(-1)
        if arr.shape != (len(self.joint_names),) or not np.isfinite(arr).all():
            raise ValueError(f"a pose must be {len(self.joint_names)} finite values, got {positions!r}")
        return arr

    def _reset_locked(self, pose: np.ndarray, now: float) -> None:
        self._chunks: list[_Chunk] = []
        self._stream: tuple[float, np.ndarray] | None = None
        self._last = pose.copy()
        self._min_stamp = now
        self._newest = -math.inf
        self._state = ExecState.WAITING
        self._hold_since: float | None = None
        self._now = now
        self._stats.forget()

    def _order(self, names: Sequence[str]) -> np.ndarray | None:
        """Column index in the offered data of each executor joint, or None if names are bad."""
        names = list(names)
        if len(names) != len(self.joint_names) or len(set(names)) != len(names):
            return None
        if any(n not in self._index for n in names):
            return None
        where = {n: i for i, n in enumerate(names)}
        return np.array([where[n] for n in self.joint_names])

    def _time_verdict(self, stamp: float) -> Verdict | None:
        """STALE (at or before the last reset) / OUT_OF_ORDER (older than the newest), else None."""
        if stamp <= self._min_stamp:
            return Verdict.STALE
        if stamp < self._newest:
            return Verdict.OUT_OF_ORDER
        return None

    def _count(self, verdict: Verdict) -> Verdict:
        self._stats.counts[verdict.value] += 1
        return verdict

    # ------------------------------------------------------------------ input
    def offer_trajectory(
        self,
        names: Sequence[str],
        stamp: float,
        time_from_start: Sequence[float],
        positions: Sequence[Sequence[float]],
        now: float,
    ) -> Verdict:
        """Offer a chunk received at ``now`` (seconds, simulation clock).

        Args:
            names: joint names of the columns of ``positions`` (any order).
            stamp: observation stamp of the chunk, seconds.
            time_from_start: ``[H]`` seconds after ``stamp`` at which each point is due.
            positions: ``[H][n]`` joint positions (robot units).
            now: current simulation time, seconds.

        Returns:
            The verdict (also counted); only ``ACCEPTED`` chunks are ever executed. Never raises.
        """
        with self._lock:
            self._stats.counts["chunks_received"] += 1
            if self.source != "trajectory":
                return self._count(Verdict.WRONG_SOURCE)
            order = self._order(names)
            if order is None:
                return self._count(Verdict.BAD_NAMES)
            bad, pos, tfs, stamp = check_chunk(order, stamp, time_from_start, positions)
            bad = bad or self._time_verdict(stamp)
            if bad is not None:
                return self._count(bad)
            assert pos is not None and tfs is not None  # check_chunk returns both when it finds no fault
            due = stamp + tfs
            if due[-1] < now - 0.5 * self.step_s:
                return self._count(Verdict.EXPIRED)
            if stamp == self._newest:  # recomputed from the same observation time: replaces it
                self._stats.counts["same_stamp"] += 1
                self._chunks = [c for c in self._chunks if c.stamp != stamp]
            self._newest = stamp
            self._chunks.append(_Chunk(stamp, due, pos))
            if len(self._chunks) > self.max_pending:
                del self._chunks[0]
            self._stats.latencies.append(now - stamp)
            return self._count(Verdict.ACCEPTED)

    def offer_command(
        self, names: Sequence[str] | None, stamp: float, positions: Sequence[float], now: float
    ) -> Verdict:
        """Offer one per-step command received at ``now``.

        Args:
            names: joint names of ``positions`` (any order), or None when the positions are in
                executor order (e.g. ``std_msgs/Float64MultiArray``).
            stamp: time the command is for, seconds (the receive time when the message has none).
            positions: ``[n]`` joint positions.
            now: current simulation time, seconds.

        Returns:
            The verdict (also counted). Never raises.
        """
        with self._lock:
            self._stats.counts["commands_received"] += 1
            if self.source != "stream":
                return self._count(Verdict.WRONG_SOURCE)
            order = np.arange(len(self.joint_names)) if names is None else self._order(names)
            if order is None:
                return self._count(Verdict.BAD_NAMES)
            bad, row, stamp = check_command(order, stamp, positions)
            bad = bad or self._time_verdict(stamp)
            if bad is not None:
                return self._count(bad)
            if now - stamp > self.stream_timeout_s:
                return self._count(Verdict.EXPIRED)
            assert row is not None  # check_command returns the row when it finds no fault
            self._newest = stamp
            self._stream = (stamp, row)
            self._stats.latencies.append(now - stamp)
            return self._count(Verdict.ACCEPTED)

    def reset(self, positions: Sequence[float] | np.ndarray, now: float) -> None:
        """Forget every chunk/command, hold ``positions`` and refuse input stamped at or before
        ``now`` (it was computed from the state before the reset).

        Raises:
            ValueError: ``positions`` is not ``n`` finite values.
        """
        pose = self._check_pose(positions)
        with self._lock:
            self._stats.counts["resets"] += 1
            self._reset_locked(pose, float(now))

    # ------------------------------------------------------------------ stepping
    def _target(self, now: float) -> tuple[np.ndarray | None, float | None, int]:
        """(target, age, index) from the selected source, or (None, None, -1) if nothing covers."""
        half = 0.5 * self.step_s
        if self.source == "stream":
            if self._stream is not None and now - self._stream[0] <= self.stream_timeout_s:
                return self._stream[1], now - self._stream[0], -1
            return None, None, -1
        live = None
        for k in range(len(self._chunks) - 1, -1, -1):
            if self._chunks[k].due[0] <= now + half:
                live = k
                break
        if live is None:
            return None, None, -1
        del self._chunks[:live]  # replaced from the newer chunk's start on
        chunk = self._chunks[0]
        index = int(np.searchsorted(chunk.due, now + half, side="right")) - 1
        if not chunk.started:
            chunk.started = True
            self._stats.counts["chunks_executed"] += 1
            self._stats.counts["late_points"] += index
        if chunk.due[-1] < now - half:  # ran out: nothing covers this step
            return None, None, -1
        self._stats.use(chunk, now, half)  # a switch when the chunk differs from the last step's
        return chunk.positions[index], now - chunk.stamp, index

    def step(self, now: float) -> Command:
        """The command for the control step starting at ``now`` (seconds, monotonic per call).

        Always returns finite positions: the limited target when a chunk covers ``now``, else the
        last applied command.
        """
        with self._lock:
            now = max(float(now), self._now) if math.isfinite(now) else self._now
            self._now = now
            counts = self._stats.counts
            counts["steps"] += 1
            target, age, index = self._target(now)
            event = ""
            if target is None:
                held = 0.0
                if self._state is not ExecState.WAITING:
                    if self._hold_since is None:
                        self._hold_since = now
                    held = now - self._hold_since
                    if self._state is not ExecState.LOST:
                        if held >= self.loss_timeout_s:
                            self._state, event = ExecState.LOST, "loss"
                            counts["losses"] += 1
                        else:
                            self._state = ExecState.HOLDING
                counts["wait_steps" if self._state is ExecState.WAITING else "hold_steps"] += 1
                return Command(self._last.copy(), self._state, event=event, held_s=held)
            if self._state is ExecState.LOST:
                event = "resumed"
                counts["resumes"] += 1
            self._state, self._hold_since = ExecState.EXECUTING, None
            limited = False
            cmd = np.array(target, dtype=np.float64)
            if self.max_speed > 0:
                bound = self.max_speed * self.step_s
                clipped = np.clip(cmd, self._last - bound, self._last + bound)
                limited = bool(np.any(clipped != cmd))
                cmd = clipped
                counts["limited_steps"] += int(limited)
            self._last = cmd
            counts["executed_steps"] += 1
            assert age is not None  # _target gives an age with every target
            self._stats.ages.append(age)
            return Command(cmd.copy(), self._state, age, index, limited, event)

    # ------------------------------------------------------------------ reporting
    @property
    def state(self) -> ExecState:
        """The state after the last :meth:`step`."""
        with self._lock:
            return self._state

    @property
    def last_command(self) -> np.ndarray:
        """``[n]`` the last applied (or initial / reset) command."""
        with self._lock:
            last: np.ndarray = self._last.copy()
            return last

    def counts(self) -> dict[str, int]:
        """Counters: steps, executed_steps, wait_steps (before the first chunk), hold_steps (gaps
        after it), limited_steps, chunks_received, chunks_executed, commands_received,
        late_points, same_stamp, losses, resumes, resets, switches (measured chunk switches),
        switches_after_hold and one per :class:`Verdict` value that occurred."""
        with self._lock:
            return dict(self._stats.counts)

    def age_stats(self) -> dict[str, float]:
        """Chunk age when executed (``now - stamp`` of each executed step) and arrival latency
        (``now - stamp`` at arrival), p50/p95/max in milliseconds (NaN when none yet)."""
        with self._lock:
            return self._stats.age_stats()

    def switch_stats(self, jumps: bool = False) -> dict[str, Any]:
        """Chunk switches (module doc): ``switches`` (measured), ``switches_after_hold``,
        ``switch_jump_last`` / ``switch_jump_median`` (last 2000) / ``switch_jump_max`` in joint
        units (None before the first measured switch); ``jumps``: also the list ``switch_jumps``."""
        with self._lock:
            return self._stats.switch_stats(jumps)
