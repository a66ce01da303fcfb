"""Which engine, task and RTC settings a running engine can change, and the checked new configs.

A setting is *live* when the engine reads it where it is used — per frame, per request or per
chunk — and nothing was sized, allocated or compiled from it at construction. Everything else
(the KV pool and its sizing inputs, block size, compiled stages and their shapes, the mode and
schedule, the denoise step count, the guided stage's presence) needs a new engine. Used by
:meth:`oxygen_ros.core.engine.engine.Engine.reconfigure`; the ROS node maps its parameters onto
these sets (``oxygen_ros.ros.params.live``). Compare ros2_control, whose controllers refuse
parameter changes they cannot apply while active.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .config import ConfigError, EngineConfig, TaskConfig
from .rtc.config import RTCConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["LIVE_ENGINE_FIELDS", "LIVE_RTC_FIELDS", "LIVE_TASK_FIELDS", "live_configs", "not_live"]

#: ``EngineConfig`` fields read per frame (decode budget, deadline), per admission (queue bounds)
#: or per chunk (the flow-noise seed).
LIVE_ENGINE_FIELDS = frozenset(
    {
        "decode_budget",
        "tokens_per_frame",
        "min_decode_steps",
        "max_decode_steps",
        "frame_deadline_s",
        "max_queued_requests",
        "max_queue_wait_s",
        "max_overtakes",
        "seed",
        "max_request_chars",
    }
)
#: ``TaskConfig`` fields read when a request is created or started (sampling, budget, template) or
#: at each frame (the period). ``own_prefix`` changes how many prefills a request costs: not live.
LIVE_TASK_FIELDS = frozenset({"template", "max_new_tokens", "temperature", "top_k", "every_n_frames"})
#: ``RTCConfig`` fields read per chunk. ``enabled`` and ``guidance`` choose the compiled stage.
LIVE_RTC_FIELDS = frozenset(
    {
        "schedule",
        "execution_horizon",
        "max_guidance_weight",
        "inference_delay_mode",
        "inference_delay",
        "delay_percentile",
        "delay_window",
    }
)


def not_live(old: DataclassInstance, new: DataclassInstance, live: frozenset[str], prefix: str) -> list[str]:
    """Names (``prefix`` + field) of the dataclass fields that differ between ``old`` and ``new``
    and are not in ``live``."""
    return [
        prefix + f.name
        for f in dataclasses.fields(old)
        if f.name not in live and getattr(old, f.name) != getattr(new, f.name)
    ]


def _task_changes(old: EngineConfig, new: EngineConfig) -> list[str]:
    if [t.name for t in old.tasks] != [t.name for t in new.tasks]:
        return ["tasks (the task list)"]
    out: list[str] = []
    for a, b in zip(old.tasks, new.tasks):
        out += not_live(a, b, LIVE_TASK_FIELDS | {"name"}, f"tasks.{a.name}.")
    return out


def live_configs(
    engine: EngineConfig, new_engine: EngineConfig | None, rtc: RTCConfig, new_rtc: RTCConfig | None
) -> tuple[EngineConfig, RTCConfig]:
    """Check that ``new_engine`` / ``new_rtc`` differ from the running ``engine`` / ``rtc`` only in
    live fields and are valid; returns them (``None``: unchanged).

    The running engine config has ``max_running_requests`` resolved (0 = auto at construction);
    a new config that still says 0 keeps the resolved value.

    Raises:
        ConfigError: naming every field that is not live, a task budget that cannot fit
            ``max_request_tokens``, or the first invalid value.
    """
    new_engine = engine if new_engine is None else new_engine
    new_rtc = rtc if new_rtc is None else new_rtc
    if not new_engine.max_running_requests:
        new_engine = dataclasses.replace(new_engine, max_running_requests=engine.max_running_requests)
    fixed = (
        not_live(engine, new_engine, LIVE_ENGINE_FIELDS | {"tasks"}, "engine.")
        + _task_changes(engine, new_engine)
        + not_live(rtc, new_rtc, LIVE_RTC_FIELDS, "rtc.")
    )
    if fixed:
        raise ConfigError(f"not changeable on a running engine: {', '.join(fixed)} (a new engine is needed)")
    too_long = [
        f"tasks.{t.name}.max_new_tokens={t.max_new_tokens}"
        for t in new_engine.tasks
        if t.max_new_tokens >= new_engine.max_request_tokens
    ]
    if too_long:  # every request of the task would be rejected at submission
        raise ConfigError(
            f"{', '.join(too_long)}: must be below engine.max_request_tokens "
            f"({new_engine.max_request_tokens}, prompt + new tokens; sized at configure)"
        )
    return new_engine.validate(), new_rtc.validate()


def replace_task(cfg: EngineConfig, name: str, **changes: Any) -> EngineConfig:
    """``cfg`` with task ``name``'s fields replaced.

    Raises:
        KeyError: no task ``name``.
    """
    if name not in [t.name for t in cfg.tasks]:
        raise KeyError(f"no task {name!r}")
    tasks: tuple[TaskConfig, ...] = tuple(dataclasses.replace(t, **changes) if t.name == name else t for t in cfg.tasks)
    return dataclasses.replace(cfg, tasks=tasks)
