"""Which parameters a configured ``oxygen`` node applies live, and the checked new configuration.

Every parameter is one of two kinds (the README and ``docs/reference.md`` list them):

- **live** — applied from the next frame, request or chunk while the node is inactive or active:
  the sampling settings, budgets, periods and templates of the tasks; the decode budget, tokens per
  frame and deadline; the queue bounds and flow seed; the per-chunk RTC settings
  (:mod:`oxygen_ros.core.live`); and on the node: ``instruction``, the input timing
  (``state_tolerance_s``, ``camera_max_age_s``, ``camera_sync_s``, ``time_jump_s``),
  ``command_max_hold_s``, ``text_header``, ``input_timeout_s`` and ``diagnostics_period_s``;
- **read at configure** — everything that sizes, loads, compiles or connects something (model,
  device, topics, QoS, joints, cameras, action space, the KV pool, the engine mode and schedule,
  compile, RTC on/off and its guidance form, the task list and topics). While the node is
  configured, setting one is refused (``SetParametersResult.successful = False``) with a reason
  that says how to apply it; in *unconfigured* every value is accepted and read at configure.

Compare ros2_control: a controller refuses parameter changes it cannot apply while active.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oxygen_ros.core.config import ConfigError, EngineConfig
from oxygen_ros.core.live import LIVE_ENGINE_FIELDS, LIVE_RTC_FIELDS, LIVE_TASK_FIELDS, live_configs, replace_task
from oxygen_ros.core.rtc.config import RTCConfig
from oxygen_ros.ros.params.node_config import NodeConfig, node_specs
from oxygen_ros.ros.params.specs import check_value, task_specs

__all__ = ["LIVE_NODE_PARAMS", "LiveUpdate", "is_live", "live_update", "refusal", "updated_config"]

#: Node-level parameters read where they are used (the assembler, the command stream, the text
#: streams, the diagnostics timer), so a new value applies from the next message or period.
LIVE_NODE_PARAMS = frozenset(
    {
        "instruction",
        "state_tolerance_s",
        "camera_max_age_s",
        "camera_sync_s",
        "time_jump_s",
        "command_max_hold_s",
        "text_header",
        "diagnostics_period_s",
        "input_timeout_s",
        "max_instruction_chars",
        "max_image_pixels",
        "chunk_timeout_s",
    }
)
#: Parameters rclpy itself owns and handles (the clock source); never refused here.
RCLPY_PARAMS = frozenset({"use_sim_time", "start_type_description_service"})


def is_live(name: str) -> bool:
    """Whether parameter ``name`` is applied live by a configured node (module doc)."""
    parts = name.split(".")
    if len(parts) == 2 and parts[0] == "engine":
        return parts[1] in LIVE_ENGINE_FIELDS
    if len(parts) == 2 and parts[0] == "rtc":
        return parts[1] in LIVE_RTC_FIELDS
    if len(parts) == 3 and parts[0] == "tasks":
        return parts[2] in LIVE_TASK_FIELDS
    return name in LIVE_NODE_PARAMS or name in RCLPY_PARAMS


def refusal(name: str, state: str) -> str:
    """Why setting ``name`` is refused in lifecycle ``state`` (``inactive`` / ``active``) and how
    to apply it instead."""
    if name == "autostart":
        return "autostart is read once, at start-up (it decides whether main() configures and activates)"
    steps = (
        "deactivate, cleanup, set it, configure, activate"
        if state == "active"
        else "cleanup, set it, configure, activate"
    )
    return (
        f"{name} is read at configure (it sizes, loads or connects something) and cannot change "
        f"while the node is {state}; to apply it: {steps} "
        f"(oxygen lifecycle …, or ros2 lifecycle set on apt ROS)"
    )


def updated_config(cfg: NodeConfig, values: dict[str, Any]) -> NodeConfig:
    """``cfg`` with the live parameters ``values`` (name → checked value) applied.

    Raises:
        KeyError: a name that is not a live parameter of ``cfg`` (an unknown task included).
    """
    engine, rtc, plain = cfg.engine, cfg.rtc, {}
    for name, value in values.items():
        if not is_live(name) or name in RCLPY_PARAMS:
            raise KeyError(name)
        parts = name.split(".")
        if parts[0] == "engine":
            engine = dataclasses.replace(engine, **{parts[1]: value})
        elif parts[0] == "rtc":
            rtc = dataclasses.replace(rtc, **{parts[1]: value})
        elif parts[0] == "tasks":
            engine = replace_task(engine, parts[1], **{parts[2]: value})
        else:
            plain[name] = value
    return dataclasses.replace(cfg, engine=engine, rtc=rtc, **plain)


def checked_values(cfg: NodeConfig, params: dict[str, Any], state: str) -> tuple[dict[str, Any], list[str]]:
    """``params`` (name → value as set) type- and range-checked against the node's specs, rclpy's
    own parameters left out; the second item lists the refusals (not live, bad value)."""
    specs = {s.name: s for s in node_specs()}
    for task in cfg.task_topics:
        specs.update((s.name, s) for s in task_specs(task))
    values, problems = {}, []
    for name, value in params.items():
        if name in RCLPY_PARAMS:
            continue
        if not is_live(name) or name not in specs:
            problems.append(refusal(name, state))
            continue
        value, problem = check_value(specs[name], value)
        if problem:
            problems.append(problem)
        else:
            values[name] = value
    return values, problems


def _unchanged(current: Any, value: Any) -> bool:
    if isinstance(value, (list, tuple)) or isinstance(current, (list, tuple)):
        return isinstance(current, (list, tuple)) and isinstance(value, (list, tuple)) and list(value) == list(current)
    return (
        type(value) is type(current)
        and value == current
        or (
            isinstance(value, (int, float))
            and isinstance(current, (int, float))
            and not isinstance(value, bool)
            and not isinstance(current, bool)
            and float(value) == float(current)
        )
    )


@dataclass(frozen=True)
class LiveUpdate:
    """A checked set of live parameter changes, as values for each part of the node.

    Attributes:
        cfg: the node's configuration with the changes.
        engine / rtc: the running engine's configs with the changes (for ``Engine.reconfigure``).
        changed: the parameter names that change.
    """

    cfg: NodeConfig
    engine: EngineConfig
    rtc: RTCConfig
    changed: frozenset[str]


def live_update(
    cfg: NodeConfig,
    engine: EngineConfig,
    rtc: RTCConfig,
    current: Callable[[str], Any],
    params: dict[str, Any],
    state: str,
) -> LiveUpdate | str | None:
    """Check ``params`` (name → new value) against a configured node in lifecycle ``state``
    (``inactive`` / ``active``) whose configuration is ``cfg`` and whose engine runs ``engine`` /
    ``rtc``; ``current(name)`` is a parameter's value now (``None`` if undeclared).

    Returns:
        The :class:`LiveUpdate` to apply; ``None`` when nothing changes (every value as it is);
        or the reason every one is refused (each named) — all or none.
    """
    params = {k: v for k, v in params.items() if not _unchanged(current(k), v)}  # the same value: no-op
    values, problems = checked_values(cfg, params, state)
    if problems:
        return "; ".join(problems)
    if not values:
        return None
    try:
        new = updated_config(cfg, values)
        if len(new.instruction) > new.max_instruction_chars and (
            "instruction" in values or "max_instruction_chars" in values
        ):
            return (
                f"instruction has {len(new.instruction)} characters, more than max_instruction_chars = "
                f"{new.max_instruction_chars}"
            )
        running = updated_config(dataclasses.replace(cfg, engine=engine, rtc=rtc), values)
        engine_cfg, rtc_cfg = live_configs(engine, running.engine, rtc, running.rtc)  # validated, not applied
    except (ConfigError, KeyError, ValueError) as exc:
        return str(exc).strip("'")
    return LiveUpdate(new, engine_cfg, rtc_cfg, frozenset(values))
