"""What the chunk executor says and applies: verdicts on offered input, states, commands."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SOURCES", "Command", "ExecState", "Verdict", "check_chunk", "check_command", "check_settings", "percentile"]

SOURCES = ("trajectory", "stream")


class Verdict(str, enum.Enum):
    """What :class:`ChunkExecutor` did with an offered chunk or command."""

    ACCEPTED = "accepted"
    BAD_NAMES = "bad_names"  # rejected: joint names missing / duplicated / unknown
    BAD_SHAPE = "bad_shape"  # rejected: no points, or a point's size does not match the names
    NON_FINITE = "non_finite"  # rejected: NaN/inf position or time
    BAD_TIMES = "bad_times"  # rejected: time_from_start negative or not strictly increasing
    OUT_OF_ORDER = "out_of_order"  # dropped: older than the newest accepted one
    STALE = "stale"  # dropped: stamped at or before the last reset
    EXPIRED = "expired"  # dropped: every point already in the past on arrival
    WRONG_SOURCE = "wrong_source"  # dropped: this source is not the selected one

    @property
    def rejected(self) -> bool:
        """True for malformed input (as opposed to a well-formed but unusable one)."""
        return self in (Verdict.BAD_NAMES, Verdict.BAD_SHAPE, Verdict.NON_FINITE, Verdict.BAD_TIMES)


class ExecState(str, enum.Enum):
    """What the executor is doing at the current step."""

    WAITING = "waiting"  # no chunk since start / reset: holding the initial pose
    EXECUTING = "executing"  # a chunk (or fresh stream command) covers the step
    HOLDING = "holding"  # short gap: last command held, not (yet) a loss
    LOST = "lost"  # gap of at least loss_timeout_s: holding, loss reported


@dataclass
class Command:
    """The command of one control step.

    Attributes:
        positions: ``[n]`` float64 finite joint targets (robot units) to apply for this step.
        state: the executor state at this step.
        chunk_age: ``now - stamp`` of the chunk / stream command used (seconds), None when held.
        index: chunk point used (-1 when held or from the stream).
        limited: whether the speed limit changed the command.
        event: ``'loss'`` on the first step of a loss episode, ``'resumed'`` on the first covered
            step after one, else ``''``.
        held_s: how long the command has been held (seconds, 0 while executing).
    """

    positions: np.ndarray
    state: ExecState
    chunk_age: float | None = None
    index: int = -1
    limited: bool = False
    event: str = ""
    held_s: float = 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """``q``-th percentile (0..100) of ``values``, NaN when empty."""
    if not len(values):
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def check_settings(
    names: tuple[str, ...],
    step_s: float,
    loss_timeout_s: float,
    max_speed: float,
    source: str,
    stream_timeout_s: float,
    max_pending: int,
) -> None:
    """Validate the executor's settings (see ``ChunkExecutor``); raises ``ValueError`` naming one."""
    if not names or len(set(names)) != len(names) or "" in names:
        raise ValueError(f"joint_names must be non-empty and unique, got {names!r}")
    for label, value in (("step_s", step_s), ("stream_timeout_s", stream_timeout_s)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{label} must be finite and > 0, got {value}")
    for label, value in (("loss_timeout_s", loss_timeout_s), ("max_speed", max_speed)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{label} must be finite and >= 0, got {value}")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    if max_pending < 1:
        raise ValueError(f"max_pending must be >= 1, got {max_pending}")


def check_chunk(
    order: np.ndarray, stamp: float, time_from_start: Sequence[float], positions: Sequence[Sequence[float]]
) -> tuple[Verdict | None, np.ndarray | None, np.ndarray | None, float]:
    """Shape, finiteness and time checks of an offered chunk (never raises).

    Args:
        order: ``[n]`` column of each executor joint in ``positions``.
        stamp: observation stamp, seconds; ``time_from_start``: ``[H]`` seconds;
        positions: ``[H][n]`` joint positions.

    Returns:
        ``(None, [H, n] positions in executor order, [H] times, stamp)`` for a well-formed chunk,
        else ``(verdict, None, None, nan)`` with BAD_SHAPE / NON_FINITE / BAD_TIMES.
    """
    try:
        rows = [np.asarray(p, dtype=np.float64).reshape(-1) for p in positions]
        tfs = np.asarray(list(time_from_start), dtype=np.float64).reshape(-1)
        stamp = float(stamp)
    except (TypeError, ValueError):
        return Verdict.BAD_SHAPE, None, None, math.nan
    if not rows or tfs.shape[0] != len(rows) or any(r.shape[0] != len(order) for r in rows):
        return Verdict.BAD_SHAPE, None, None, math.nan
    pos = np.stack(rows)[:, order]
    if not (np.isfinite(pos).all() and np.isfinite(tfs).all() and math.isfinite(stamp)):
        return Verdict.NON_FINITE, None, None, math.nan
    if tfs[0] < 0 or (tfs.shape[0] > 1 and not (np.diff(tfs) > 0).all()):
        return Verdict.BAD_TIMES, None, None, math.nan
    return None, pos, tfs, stamp


def check_command(
    order: np.ndarray, stamp: float, positions: Sequence[float]
) -> tuple[Verdict | None, np.ndarray | None, float]:
    """Shape and finiteness checks of one per-step command (never raises).

    Returns:
        ``(None, [n] positions in executor order, stamp)``, else ``(verdict, None, nan)``.
    """
    try:
        row = np.asarray(positions, dtype=np.float64).reshape(-1)
        stamp = float(stamp)
    except (TypeError, ValueError):
        return Verdict.BAD_SHAPE, None, math.nan
    if row.shape[0] != len(order):
        return Verdict.BAD_SHAPE, None, math.nan
    row = row[order]
    if not (np.isfinite(row).all() and math.isfinite(stamp)):
        return Verdict.NON_FINITE, None, math.nan
    return None, row, stamp
