"""Schedule metrics, defined once for both schedules (docs/architecture.md, "Schedules").

Per frame, into ``FrameMetrics.extra`` (seconds unless noted):

- ``chunk_latency`` — start of the frame (the newest observation is taken) → the chunk handed out;
- ``chunk_interval`` — previous chunk handed out → this one (1 / chunk rate). With frames back to
  back this is what the robot feels: the serial schedule's includes the previous frame's decode;
- ``batcher_busy`` — fraction (0…1) of the wall time since the previous frame start that the
  language batcher spent working (serial: the frame's decode share);
- ``language_load`` — 1.0 when language requests were queued or running this frame, else 0.0.

``tokens_emitted`` (tokens per frame) stays the :class:`FrameMetrics` field. A
:class:`ScheduleMeter` also keeps totals split by language load, for ``/diagnostics``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..types import FrameMetrics


@dataclass
class _Split:
    frames: int = 0
    latency: float = 0.0
    interval: float = 0.0
    intervals: int = 0


@dataclass
class ScheduleMeter:
    """Running schedule metrics of one engine (plain Python; one writer thread)."""

    loaded: _Split = field(default_factory=_Split)
    idle: _Split = field(default_factory=_Split)
    busy_s: float = 0.0
    wall_s: float = 0.0
    tokens: int = 0
    frames: int = 0
    _last_chunk: float | None = None
    _last_start: float | None = None

    def reset(self) -> None:
        """Forget everything (after warm-up)."""
        self.__init__()  # type: ignore[misc]

    def frame(self, m: FrameMetrics, t_start: float, t_chunk: float | None, busy_s: float, language: bool) -> None:
        """Record one frame into ``m.extra`` and the totals.

        Args:
            m: the frame's metrics (``tokens_emitted`` already set).
            t_start: ``perf_counter`` at the frame start; t_chunk: when the chunk was handed out
                (``None``: no chunk this frame).
            busy_s: language batcher work in seconds since the previous frame start.
            language: whether language requests were queued or running.
        """
        wall = None if self._last_start is None else t_start - self._last_start
        self._last_start = t_start
        if wall is not None and wall > 0:
            m.extra["batcher_busy"] = min(1.0, busy_s / wall)
            self.busy_s += busy_s
            self.wall_s += wall
        m.extra["language_load"] = float(language)
        self.tokens += m.tokens_emitted
        self.frames += 1
        if t_chunk is None:
            return
        split = self.loaded if language else self.idle
        m.extra["chunk_latency"] = t_chunk - t_start
        split.frames += 1
        split.latency += t_chunk - t_start
        if self._last_chunk is not None:
            m.extra["chunk_interval"] = t_chunk - self._last_chunk
            split.interval += t_chunk - self._last_chunk
            split.intervals += 1
        self._last_chunk = t_chunk

    def summary(self) -> dict[str, float]:
        """Means so far: chunk latency / interval with and without language load (s), batcher busy
        fraction, tokens per frame. Keys absent where nothing was measured."""
        out: dict[str, float] = {}
        for name, s in (("language", self.loaded), ("no_language", self.idle)):
            if s.frames:
                out[f"chunk_latency_{name}_s"] = s.latency / s.frames
            if s.intervals:
                out[f"chunk_interval_{name}_s"] = s.interval / s.intervals
        if self.wall_s > 0:
            out["batcher_busy"] = self.busy_s / self.wall_s
        if self.frames:
            out["tokens_per_frame"] = self.tokens / self.frames
        return out


__all__ = ["ScheduleMeter"]
