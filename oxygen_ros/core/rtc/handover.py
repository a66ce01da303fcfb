"""The engine's side of real-time chunking: from the last emitted chunk to the next chunk's guide.

For a new observation at stamp ``s`` the robot is still executing the previous chunk (stamp
``s₀``): row ``i`` of a chunk is due at its stamp + ``(i + 1)·P`` (``P`` the control period), so row
``j`` of the new chunk is due when row ``j + (s - s₀)/P`` of the previous one was — the leftover is
the previous chunk sampled at those fractional rows (linear interpolation, exact for whole
periods), in normalised model space. For joints whose actions are relative to the observation
state (``delta`` action spaces) the leftover is re-expressed against the new state:
``norm(unnorm(x) + s₀ - s)`` on those dims. Per-step displacement commands (``ee_delta``) and
velocities are not anchored on the observation state and carry over unchanged.

The inference delay ``d`` (rows the robot executes from the old chunk while the new one is
computed) is ``ceil(latency / P)`` of a high percentile of measured observation→chunk latencies, or
fixed. The first chunk, and the chunk after a dropped frame, a reset, a backwards time jump or a gap
longer than the chunk, are denoised without guidance — counted by reason; so are chunks whose
observation, or the previous one, has no stamp (``stamp <= 0``, :class:`~..types.Observation`'s
"unknown"): without times the leftover cannot be aligned.

Each chunk's switch discontinuity — the largest difference over joints, in unnormalised action
units, between the new chunk and the previous chunk at the new chunk's first executed row ``d`` —
is measured whether RTC is on or off, so the two can be compared.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from ..processing import Normalizer
from ..types import Observation
from .config import RTCConfig
from .guidance import RTCGuide, make_guide

#: reasons a chunk is denoised without guidance (counted in :attr:`ChunkHandover.counts`)
UNGUIDED_REASONS: tuple[str, ...] = ("first", "dropped", "reset", "time_jump", "gap", "no_stamp")


@dataclass
class _Emitted:
    x: np.ndarray  # [T, A] normalised model space (real action dims)
    stamp: float  # observation stamp, seconds
    state: np.ndarray  # the observation's (model-space) state


def align_leftover(prev: np.ndarray, shift: float) -> np.ndarray:
    """Rows of ``prev`` ``[T, A]`` at fractional indices ``j + shift`` for ``j = 0, 1, …`` while
    ``j + shift <= T - 1`` (linear interpolation between rows).

    Returns:
        ``[T_left, A]`` float32; 0 rows when ``shift > T - 1``.

    Raises:
        ValueError: ``shift`` negative or not finite.
    """
    if not (math.isfinite(shift) and shift >= 0):
        raise ValueError(f"leftover shift must be finite and >= 0 rows, got {shift}")
    t = prev.shape[0]
    idx = np.arange(0.0, t - 1 - shift + 1e-9, 1.0) + shift if shift <= t - 1 else np.zeros(0)
    lo = np.floor(idx).astype(np.int64).clip(0, t - 1)
    hi = np.minimum(lo + 1, t - 1)
    frac = (idx - lo)[:, None]
    out: np.ndarray = ((1.0 - frac) * prev[lo] + frac * prev[hi]).astype(np.float32)
    return out


class ChunkHandover:
    """Remembers the last chunk and builds the next chunk's :class:`~.guidance.RTCGuide`.

    Args:
        cfg: the RTC settings (``control_period_s`` = ``P``).
        normalizer: the policy's (leftovers are re-expressed through it for relative dims).
        horizon / action_dim: ``T`` and the model's ``D``.
        times: the ``S`` flow times of the denoise loop.
        relative: ``(mask [A] bool, anchor [A] int)`` — action dims relative to a state dim
            (:meth:`relative_to_state`); ``None``: every dim absolute.
        clock: the clock of the observation stamps (seconds; e.g. the ROS node's clock, sim time
            included): latency is then measured from the stamp, transport and assembly included.
            ``None``: from ``submit_observation``, on the engine's own clock.

    Thread-safety: used by the one inference thread (the engine's action path) only.
    """

    def __init__(
        self,
        cfg: RTCConfig,
        normalizer: Normalizer,
        horizon: int,
        action_dim: int,
        times: Sequence[Tensor],
        relative: tuple[np.ndarray, np.ndarray] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.cfg = cfg.validate()
        self.normalizer = normalizer
        self.horizon, self.action_dim, self.times = horizon, action_dim, list(times)
        self.counts: Counter[str] = Counter()
        self.latencies: deque[float] = deque(maxlen=cfg.delay_window)
        self.relative: tuple[np.ndarray, np.ndarray] | None = None
        self.last_jump: float | None = None
        self.jumps: deque[float] = deque(maxlen=1000)
        self.delay = cfg.inference_delay
        self._last: _Emitted | None = None
        self._pending = "first"
        self._left: np.ndarray | None = None  # the leftover of the chunk being computed (metric)
        self._used_delay = self.delay
        self.clock = clock
        if relative is not None:
            self.relative_to_state(*relative)

    @property
    def last_chunk(self) -> np.ndarray | None:
        """The last chunk handed out, ``[T, A]`` normalised model space (None after a reset)."""
        return None if self._last is None else self._last.x.copy()

    def relative_to_state(self, mask: np.ndarray, anchor: np.ndarray) -> None:
        """Action dims ``mask`` ``[A]`` (bool) are relative to state dim ``anchor[i]`` of the
        observation (``ActionSpace.delta`` / ``.anchor``); their leftover is re-expressed."""
        mask = np.asarray(mask, bool)
        self.relative = (mask, np.asarray(anchor, np.int64)) if mask.any() else None

    def clear(self) -> None:
        """Back to the state after construction (the engine's warm-up leaves no trace)."""
        self.counts.clear()
        self.latencies.clear()
        self.jumps.clear()
        self.last_jump, self._last, self._pending, self._left = None, None, "first", None
        self.delay = self._used_delay = self.cfg.inference_delay

    def reconfigure(self, cfg: RTCConfig) -> None:
        """New settings from the next chunk on (the stepping thread; the engine checks that only
        per-chunk fields changed, :data:`oxygen_ros.core.live.LIVE_RTC_FIELDS`); the measured
        latencies are kept, up to the new ``delay_window``."""
        self.cfg = cfg.validate()
        if self.latencies.maxlen != cfg.delay_window:
            self.latencies = deque(self.latencies, maxlen=cfg.delay_window)

    def forget(self, reason: str) -> None:
        """Drop the last chunk: the next one is denoised without guidance, counted as ``reason``
        (one of :data:`UNGUIDED_REASONS`)."""
        self._last, self._pending = None, reason

    def current_delay(self) -> int:
        """The inference delay in rows: fixed, or ``ceil(percentile latency / P)`` (auto)."""
        if self.cfg.inference_delay_mode == "fixed" or not self.latencies:
            return self.cfg.inference_delay
        lat = float(np.percentile(np.asarray(self.latencies), self.cfg.delay_percentile))
        return int(min(self.horizon - 1, max(0, math.ceil(lat / self.cfg.control_period_s - 1e-9))))

    def leftover(self, obs: Observation) -> tuple[np.ndarray | None, str]:
        """The previous chunk's rows for ``obs``, aligned by stamps and re-expressed; (None, reason)
        when there is none."""
        last = self._last
        if last is None:
            return None, self._pending
        if float(obs.stamp) <= 0 or last.stamp <= 0:
            return None, "no_stamp"
        shift = (float(obs.stamp) - last.stamp) / self.cfg.control_period_s
        if not math.isfinite(shift) or shift < 0:
            return None, "time_jump"
        rows = align_leftover(last.x, shift)
        if not len(rows):
            return None, "gap"
        if self.relative is not None:
            mask, anchor = self.relative
            state = np.asarray(obs.state, np.float64)
            a = self.normalizer.unnormalize_actions(rows).astype(np.float64)
            a[:, mask] += last.state[anchor[mask]] - state[anchor[mask]]
            rows = np.where(mask, self.normalizer.normalize_actions(a), rows).astype(np.float32)
        return rows, "guided"

    def guide(self, obs: Observation, explicit: tuple[np.ndarray, int | None] | None = None) -> RTCGuide | None:
        """The guide for the chunk of ``obs`` (None when RTC is off).

        Args:
            obs: the new observation (model-space state, stamp in seconds).
            explicit: a caller's ``(prev_chunk_left_over [T_left, A], inference_delay or None)``
                (LeRobot's arguments) instead of the remembered chunk.

        Raises:
            ValueError: a malformed explicit leftover (the caller drops the chunk with the reason).
        """
        self.delay = self.current_delay()
        rows, reason = (np.asarray(explicit[0], np.float32), "explicit") if explicit else self.leftover(obs)
        delay = self.delay if not explicit or explicit[1] is None else int(explicit[1])
        self._left, self._used_delay = rows, delay
        if reason == "time_jump":
            self._last = None
        if not self.cfg.enabled:
            return None
        self.counts[reason] += 1
        c = self.cfg
        return make_guide(
            rows,
            delay,
            schedule=c.schedule,
            horizon=c.execution_horizon,
            max_weight=c.max_guidance_weight,
            times=self.times,
            length=self.horizon,
            action_dim=self.action_dim,
            vjp=c.guidance == "vjp",
        )

    def emitted(self, x: np.ndarray, obs: Observation, latency_s: float | None) -> None:
        """Remember the chunk just handed out and measure its switch discontinuity.

        Args:
            x: ``[T, >= A]`` normalised model-space chunk (the denoise output).
            obs: its observation. latency_s: observation submitted → chunk handed out, seconds.
        """
        a = self.normalizer.action_dim
        x = np.asarray(x, np.float32)[:, :a]
        left, d = self._left, self._used_delay
        if left is not None and d < len(left):
            new = self.normalizer.unnormalize_actions(x[d : d + 1])
            old = self.normalizer.unnormalize_actions(left[d : d + 1, :a])
            self.last_jump = float(np.abs(new - old).max())
            self.jumps.append(self.last_jump)
        if self.clock is not None:
            latency_s = self.clock() - float(obs.stamp)
        if latency_s is not None and math.isfinite(latency_s) and latency_s >= 0:
            self.latencies.append(latency_s)
        self._last = _Emitted(x.copy(), float(obs.stamp), np.asarray(obs.state, np.float64).copy())
        self._left = None

    def diagnostics(self) -> dict[str, object]:
        """``rtc_*`` keys for ``/diagnostics``: enabled, delay in use (rows, and its source), chunks
        guided / unguided by reason, last and median switch discontinuity (action units)."""
        c = self.cfg
        out: dict[str, object] = {
            "rtc_enabled": c.enabled,
            "rtc_delay_rows": self.delay,
            "rtc_delay_source": c.inference_delay_mode if self.latencies else "fixed",
        }
        if c.enabled:
            h = min(c.execution_horizon, self.horizon)
            if self.delay >= h:
                out["rtc_note"] = (
                    f"inference delay {self.delay} rows >= execution horizon {h}: the first row "
                    "executed from a new chunk is not guided; raise rtc.execution_horizon"
                )
            out["rtc_guided"] = self.counts["guided"] + self.counts["explicit"]
            out.update({f"rtc_unguided_{r}": self.counts[r] for r in UNGUIDED_REASONS})
        if self.latencies:
            out[f"rtc_latency_p{c.delay_percentile:g}_ms"] = round(
                1e3 * float(np.percentile(np.asarray(self.latencies), c.delay_percentile)), 2
            )
        if self.last_jump is not None:
            out["rtc_switch_jump_last"] = round(self.last_jump, 6)
            out["rtc_switch_jump_median"] = round(float(np.median(np.asarray(self.jumps))), 6)
        return out


__all__ = ["ChunkHandover", "align_leftover", "UNGUIDED_REASONS"]
