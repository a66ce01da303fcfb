"""RTC settings (one frozen dataclass; the node's ``rtc.*`` parameters are generated from it).

Defaults follow LeRobot 0.6.1 ``RTCConfig`` (``policies/rtc/configuration_rtc.py``): LINEAR
schedule, ``max_guidance_weight`` 10, ``execution_horizon`` 10 — and RTC off.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ConfigError

SCHEDULES: tuple[str, ...] = ("zeros", "ones", "linear", "exp")
GUIDANCE_MODES: tuple[str, ...] = ("elementwise", "vjp")
DELAY_MODES: tuple[str, ...] = ("auto", "fixed")


@dataclass(frozen=True)
class RTCConfig:
    """Real-time chunking of the action path.

    Attributes:
        enabled: guide each new chunk toward the previous chunk's leftover.
        schedule: prefix weights after the frozen rows — ``zeros`` (only the delay rows),
            ``ones`` (every row up to the horizon), ``linear`` or ``exp`` (ramps to 0 at the horizon).
        execution_horizon: rows of the new chunk guided toward the leftover (shortened to the
            leftover's length, as LeRobot does).
        max_guidance_weight: clip β of the guidance weight ``min(β, (t² + (1-t)²) / (t (1-t)))``.
        inference_delay_mode: ``auto`` — the delay from measured observation→chunk latency (the
            ``delay_percentile`` of the last ``delay_window`` frames, in control periods, rounded
            up); ``fixed`` — always ``inference_delay``.
        inference_delay: control periods executed from the old chunk while the new one is
            computed (fixed mode; the starting value in auto mode).
        delay_percentile / delay_window: the latency percentile and the frames it is taken over.
        guidance: ``elementwise`` — LeRobot's form (the correction is the weighted error itself, no
            backward pass; compiled) or ``vjp`` — the paper's form, the vector–Jacobian product
            through the action expert (eager, one backward pass per denoise step).
        control_period_s: seconds between consecutive rows of a chunk (row 0 is due one period
            after the observation stamp); the node sets it from ``control_period_s``.
    """

    enabled: bool = False
    schedule: str = "linear"
    execution_horizon: int = 10
    max_guidance_weight: float = 10.0
    inference_delay_mode: str = "auto"
    inference_delay: int = 2
    delay_percentile: float = 95.0
    delay_window: int = 50
    guidance: str = "elementwise"
    control_period_s: float = 0.02

    def validate(self) -> RTCConfig:
        """Raise :class:`ConfigError` naming the first invalid field; returns ``self``."""

        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"rtc.{name}={getattr(self, name)!r} is invalid: {why}")

        for name, choices in (
            ("schedule", SCHEDULES),
            ("guidance", GUIDANCE_MODES),
            ("inference_delay_mode", DELAY_MODES),
        ):
            if getattr(self, name) not in choices:
                raise bad(name, f"must be one of {choices}")
        for name in ("execution_horizon", "delay_window"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(name, "must be an int >= 1")
        if not isinstance(self.inference_delay, int) or self.inference_delay < 0:
            raise bad("inference_delay", "must be an int >= 0 (control periods)")
        if not 0.0 <= self.max_guidance_weight < float("inf"):
            raise bad("max_guidance_weight", "must be a finite number >= 0")
        if not 0.0 < self.delay_percentile <= 100.0:
            raise bad("delay_percentile", "must be in (0, 100]")
        if not 0.0 < self.control_period_s < float("inf"):
            raise bad("control_period_s", "must be a finite number > 0 (seconds)")
        return self


__all__ = ["RTCConfig", "SCHEDULES", "GUIDANCE_MODES", "DELAY_MODES"]
