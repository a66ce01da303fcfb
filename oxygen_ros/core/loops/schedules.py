"""Pick the schedule from the config: :func:`make_engine` → serial or concurrent engine.

The serial schedule is :class:`~oxygen_ros.core.engine.engine.Engine` itself (prefill → denoise →
chunk → language half, one after the other, in the stepping thread); the concurrent one is
:class:`~.concurrent.ConcurrentEngine` (the language half in a batcher thread). Both run the same
frame step, language half and schedule metrics.
"""

from __future__ import annotations

from typing import Any

from ..config import EngineConfig
from ..engine.engine import Engine
from ..policy import Pi05Policy
from ..rtc.config import RTCConfig
from .concurrent import ConcurrentEngine

SerialEngine = Engine
"""The serial schedule: the engine's own :meth:`~oxygen_ros.core.engine.engine.Engine.step`."""


def make_engine(
    policy: Pi05Policy,
    cfg: EngineConfig | None = None,
    intra_op_threads: int = 1,
    rtc: RTCConfig | None = None,
    **handover: Any,
) -> Engine:
    """The engine of ``cfg.schedule``: :class:`Engine` (serial) or :class:`ConcurrentEngine`.

    Args:
        intra_op_threads: concurrent schedule on the CPU only — torch threads per loop (0: keep).
        rtc: real-time chunking of the action path (default: off).
        handover: ``rtc_relative`` / ``stamp_clock`` of :class:`Engine`.

    Raises:
        ConfigError: invalid ``cfg`` (via ``EngineConfig.validate``).
    """
    cfg = (cfg or EngineConfig()).validate()
    if cfg.schedule == "concurrent":
        return ConcurrentEngine(policy, cfg, intra_op_threads=intra_op_threads, rtc=rtc, **handover)
    return Engine(policy, cfg, rtc, **handover)


__all__ = ["SerialEngine", "make_engine"]
