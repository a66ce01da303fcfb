"""Pick the schedule from the config: :func:`make_engine` → serial or concurrent engine.

:class:`SerialEngine` is the one-loop :class:`~oxygen_ros.core.engine.engine.Engine` (prefill →
denoise → chunk → decode, one after the other) plus the schedule metrics of
:mod:`.metrics`, so both schedules report the same numbers under the same names.
"""

from __future__ import annotations

import time
from typing import Callable

from ..config import EngineConfig
from ..engine.engine import Engine
from ..engine.requests import FrameResult
from ..policy import Pi05Policy
from ..rtc.config import RTCConfig
from ..types import ActionChunk, FrameMetrics
from .concurrent import ConcurrentEngine
from .metrics import ScheduleMeter


class SerialEngine(Engine):
    """The serial schedule with schedule metrics (outputs exactly :class:`Engine`'s)."""

    schedule = "serial"

    def __init__(self, policy: Pi05Policy, cfg: EngineConfig | None = None, rtc: RTCConfig | None = None) -> None:
        super().__init__(policy, cfg, rtc)
        self.meter = ScheduleMeter()

    def step(self, on_action: Callable[[ActionChunk], None] | None = None) -> FrameResult:
        """:meth:`Engine.step`, timing when the chunk is handed out."""
        t0 = time.perf_counter()
        with self._lock:
            language = bool(self._new) or self.running + self.queued > 0
        t_chunk: list[float] = []

        def hand_out(chunk: ActionChunk) -> None:
            if on_action is not None:
                on_action(chunk)
            t_chunk.append(time.perf_counter())

        r = super().step(hand_out)
        m = r.metrics
        self.meter.frame(m, t0, t_chunk[0] if t_chunk else None, m.decode + m.extra.get("start", 0.0), language)
        return r

    def flush(self) -> FrameResult:
        """Nothing is in flight in the serial schedule: an empty result (API of the concurrent one)."""
        return FrameResult(self.frame_id, None, [], [], FrameMetrics(frame_id=self.frame_id,
                                                                      blocks_total=self.pool.blocks.num_blocks))

    def warmup(self, frames: int = 1, cameras: list[int] | None = None) -> float:
        """As :meth:`Engine.warmup`, then forget the warm-up in the schedule metrics."""
        try:
            return super().warmup(frames, cameras)
        finally:
            self.meter.reset()


def make_engine(policy: Pi05Policy, cfg: EngineConfig | None = None, intra_op_threads: int = 1,
                rtc: RTCConfig | None = None) -> Engine:
    """The engine of ``cfg.schedule``: :class:`SerialEngine` or :class:`ConcurrentEngine`.

    Args:
        intra_op_threads: concurrent schedule on the CPU only — torch threads per loop (0: keep).
        rtc: real-time chunking of the action path (default: off).

    Raises:
        ConfigError: invalid ``cfg`` (via ``EngineConfig.validate``).
    """
    cfg = (cfg or EngineConfig()).validate()
    if cfg.schedule == "concurrent":
        return ConcurrentEngine(policy, cfg, intra_op_threads=intra_op_threads, rtc=rtc)
    return SerialEngine(policy, cfg, rtc)


__all__ = ["SerialEngine", "make_engine"]
