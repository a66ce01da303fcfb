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
from typing import Any

from oxygen_ros.core.config import ConfigError
from oxygen_ros.core.live import LIVE_ENGINE_FIELDS, LIVE_RTC_FIELDS, LIVE_TASK_FIELDS, replace_task
from oxygen_ros.ros.params.node_config import NodeConfig, node_specs
from oxygen_ros.ros.params.specs import check_value, task_specs

__all__ = ['LIVE_NODE_PARAMS', 'apply_live', 'is_live', 'refusal', 'updated_config']

#: Node-level parameters read where they are used (the assembler, the command stream, the text
#: streams, the diagnostics timer), so a new value applies from the next message or period.
LIVE_NODE_PARAMS = frozenset({
    'instruction', 'state_tolerance_s', 'camera_max_age_s', 'camera_sync_s', 'time_jump_s',
    'command_max_hold_s', 'text_header', 'diagnostics_period_s', 'input_timeout_s',
    'max_instruction_chars', 'max_image_pixels', 'chunk_timeout_s',
})
#: Parameters rclpy itself owns and handles (the clock source); never refused here.
RCLPY_PARAMS = frozenset({'use_sim_time', 'start_type_description_service'})


def is_live(name: str) -> bool:
    """Whether parameter ``name`` is applied live by a configured node (module doc)."""
    parts = name.split('.')
    if len(parts) == 2 and parts[0] == 'engine':
        return parts[1] in LIVE_ENGINE_FIELDS
    if len(parts) == 2 and parts[0] == 'rtc':
        return parts[1] in LIVE_RTC_FIELDS
    if len(parts) == 3 and parts[0] == 'tasks':
        return parts[2] in LIVE_TASK_FIELDS
    return name in LIVE_NODE_PARAMS or name in RCLPY_PARAMS


def refusal(name: str, state: str) -> str:
    """Why setting ``name`` is refused in lifecycle ``state`` (``inactive`` / ``active``) and how
    to apply it instead."""
    if name == 'autostart':
        return 'autostart is read once, at start-up (it decides whether main() configures and activates)'
    steps = 'deactivate, cleanup, set it, configure, activate' if state == 'active' else \
        'cleanup, set it, configure, activate'
    return (f'{name} is read at configure (it sizes, loads or connects something) and cannot change '
            f'while the node is {state}; to apply it: {steps} '
            f'(oxygen lifecycle …, or ros2 lifecycle set on apt ROS)')


def updated_config(cfg: NodeConfig, values: dict[str, Any]) -> NodeConfig:
    """``cfg`` with the live parameters ``values`` (name → checked value) applied.

    Raises:
        KeyError: a name that is not a live parameter of ``cfg`` (an unknown task included).
    """
    engine, rtc, plain = cfg.engine, cfg.rtc, {}
    for name, value in values.items():
        if not is_live(name) or name in RCLPY_PARAMS:
            raise KeyError(name)
        parts = name.split('.')
        if parts[0] == 'engine':
            engine = dataclasses.replace(engine, **{parts[1]: value})
        elif parts[0] == 'rtc':
            rtc = dataclasses.replace(rtc, **{parts[1]: value})
        elif parts[0] == 'tasks':
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


def _unchanged(node: Any, name: str, value: Any) -> bool:
    current = node.get_parameter(name).value if node.has_parameter(name) else None
    if isinstance(value, (list, tuple)) or isinstance(current, (list, tuple)):
        return isinstance(current, (list, tuple)) and isinstance(value, (list, tuple)) and list(value) == list(current)
    return type(value) is type(current) and value == current or (
        isinstance(value, (int, float)) and isinstance(current, (int, float)) and not isinstance(value, bool)
        and not isinstance(current, bool) and float(value) == float(current))


def apply_live(node: Any, params: dict[str, Any]) -> str:
    """Check ``params`` (name → new value) against the configured ``node`` (an
    :class:`~oxygen_ros.ros.node.OxygenNode` in *inactive* or *active*) and apply them all — the
    engine and RTC settings through :meth:`Engine.reconfigure`, the node's own to the assembler,
    the inference worker, the command stream, the text streams and the diagnostics timer — or
    none. Returns ``''`` when applied, else the reason every one was refused (each named).
    """
    params = {k: v for k, v in params.items() if not _unchanged(node, k, v)}  # setting the same value: no-op
    values, problems = checked_values(node.cfg, params, node.lifecycle_state)
    if problems:
        return '; '.join(problems)
    if not values:
        return ''
    try:
        new = updated_config(node.cfg, values)
        if len(new.instruction) > new.max_instruction_chars and ('instruction' in values
                                                                  or 'max_instruction_chars' in values):
            return (f'instruction has {len(new.instruction)} characters, more than max_instruction_chars = '
                    f'{new.max_instruction_chars}')
        running = updated_config(dataclasses.replace(node.cfg, engine=node.engine.cfg, rtc=node.engine.rtc), values)
        node.engine.reconfigure(running.engine, running.rtc)  # validates first: nothing applied on error
    except (ConfigError, KeyError, ValueError) as exc:
        return str(exc).strip("'")
    asm = node.assembler
    asm.cfg = dataclasses.replace(asm.cfg, state_tolerance_s=new.state_tolerance_s,
                                  camera_max_age_s=new.camera_max_age_s, time_jump_s=new.time_jump_s)
    if 'instruction' in values:
        asm.set_instruction(new.instruction)
    node.worker.camera_sync_s = new.camera_sync_s
    node.worker.utterances.set_header(new.text_header)
    node.outputs.command_stream.max_hold_s = new.command_max_hold_s
    node.inputs.reconfigure(new)
    if new.diagnostics_period_s != node.cfg.diagnostics_period_s:
        node.set_diagnostics_period(new.diagnostics_period_s)
    node.cfg = new
    return ''
