"""What the chunk executor measured: counters, chunk ages, arrival latencies and chunk switches.

The executor (:mod:`oxygen_ros.sim.executor`) keeps one :class:`ExecStats` under its lock and
reports from it. Chunk switches follow the definition of :mod:`oxygen_ros.streams.switches`:
a switch happens at the first step whose target comes from a chunk other than (newer than) the
one used at the previous executed step; its discontinuity is the largest absolute difference over
joints between the previous and the new chunk's targets (linear interpolation in time between
points) at that step's time. When the previous chunk no longer covers that time (its last point is
due more than half a step earlier: it ran out, the executor was holding) the switch is counted as
``switches_after_hold``, not measured. The first chunk after start / reset is not a switch.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any

from oxygen_ros.sim.commands import percentile
from oxygen_ros.streams.switches import SwitchStats, switch_jump

__all__ = ["ExecStats"]


@dataclass
class ExecStats:
    """Counters, age / latency samples (seconds) and switch figures of one executor."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    ages: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=2000))
    latencies: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=500))
    switches: SwitchStats = field(default_factory=SwitchStats)
    _in_use: Any = None  # the chunk (``.due`` [H], ``.positions`` [H, n]) of the last executed step

    def use(self, chunk: Any, now: float, tolerance: float) -> None:
        """The step at ``now`` takes its target from ``chunk``: record a switch when it differs from
        the chunk of the previous executed step (``tolerance``: half a step, seconds)."""
        prev, self._in_use = self._in_use, chunk
        if prev is None or prev is chunk:
            return
        jump = switch_jump(prev.due, prev.positions, chunk.due, chunk.positions, now, tolerance)
        self.switches.add(jump)
        self.counts["switches" if jump is not None else "switches_after_hold"] += 1

    def forget(self) -> None:
        """Start / reset: the next chunk executed is a first chunk, not a switch."""
        self._in_use = None

    def switch_stats(self, jumps: bool = False) -> dict[str, Any]:
        """:meth:`SwitchStats.summary` (joint units; None before the first measured switch), with
        ``jumps``: the list of the last measured discontinuities as ``switch_jumps``."""
        out = self.switches.summary()
        if jumps:
            out["switch_jumps"] = list(self.switches.jumps)
        return out

    def age_stats(self) -> dict[str, float]:
        """Chunk age when executed and arrival latency: p50/p95/max in milliseconds (NaN when
        none yet)."""
        ages, lat = list(self.ages), list(self.latencies)
        return {
            "chunk_age_p50_ms": percentile(ages, 50) * 1e3,
            "chunk_age_p95_ms": percentile(ages, 95) * 1e3,
            "chunk_age_max_ms": (max(ages) * 1e3) if ages else math.nan,
            "arrival_latency_p50_ms": percentile(lat, 50) * 1e3,
            "arrival_latency_max_ms": (max(lat) * 1e3) if lat else math.nan,
        }
