"""ROS parameters of the ``oxygen`` node: specifications, declaration and reading.

The engine and language-task parameters are generated from the core dataclasses
(:class:`~oxygen_ros.core.config.EngineConfig` -> ``engine.<field>``,
:class:`~oxygen_ros.core.config.TaskConfig` -> ``tasks.<task>.<field>``): names, types and defaults
come from the dataclass fields (task defaults from ``DEFAULT_TASKS`` where the task is listed
there), descriptions from the class docstring; only the allowed ranges live here. Node-side
parameters (topics, QoS, timing) are listed in :mod:`oxygen_ros.ros.params.node_config`.

Parameters are declared when the node is created and read (and validated) at *configure*, so a
bad value never crashes the process: :func:`declare` accepts any value rclpy would refuse (wrong
type, out of range) and :func:`read_values` reports every bad one, by name, in one
:class:`ParamError`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import (
    InvalidParameterTypeException,
    InvalidParameterValueException,
    ParameterUninitializedException,
)
from rclpy.node import Node
from rclpy.parameter import Parameter

from oxygen_ros.core.config import (
    ATTENTIONS,
    BATCHER_POLICIES,
    BUDGETS,
    COMPILE_MODES,
    DEFAULT_TASKS,
    MODES,
    SCHEDULES,
    EngineConfig,
    TaskConfig,
)
from oxygen_ros.core.rtc.config import DELAY_MODES, GUIDANCE_MODES, RTCConfig
from oxygen_ros.core.rtc.config import SCHEDULES as RTC_SCHEDULES

__all__ = [
    "ParamError",
    "ParamSpec",
    "check_value",
    "collect_values",
    "declare",
    "engine_specs",
    "read_values",
    "task_specs",
]

_INT_MAX = 2**31 - 1
_TYPES = {
    bool: Parameter.Type.BOOL,
    int: Parameter.Type.INTEGER,
    float: Parameter.Type.DOUBLE,
    str: Parameter.Type.STRING,
}


class ParamError(ValueError):
    """Invalid parameter values; ``problems`` lists one message per parameter, each naming it."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid parameters: " + "; ".join(self.problems))


@dataclass(frozen=True)
class ParamSpec:
    """One ROS parameter.

    Attributes:
        name: full parameter name (``engine.tokens_per_frame``).
        ptype: the rclpy parameter type.
        default: default value; None for a required parameter without default.
        description: one line for ``ros2 param describe`` (units included).
        lo, hi: inclusive numeric range (None: unbounded on that side).
        choices: allowed values of a string parameter (empty: any).
        read_only: declared read-only: only its start-up value counts (rclpy refuses every change).
    """

    name: str
    ptype: Parameter.Type
    default: Any
    description: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    read_only: bool = False

    def descriptor(self, with_range: bool = True) -> ParameterDescriptor:
        """The rcl_interfaces descriptor (range only when ``with_range``)."""
        text = self.description
        if self.choices:
            text += f" One of: {', '.join(repr(c) for c in self.choices)}."
        d = ParameterDescriptor(name=self.name, type=self.ptype.value, description=text, read_only=self.read_only)
        if with_range and (self.lo is not None or self.hi is not None):
            if self.ptype == Parameter.Type.INTEGER:
                d.integer_range = [
                    IntegerRange(
                        from_value=int(self.lo if self.lo is not None else -_INT_MAX),
                        to_value=int(self.hi if self.hi is not None else _INT_MAX),
                        step=1,
                    )
                ]
            elif self.ptype == Parameter.Type.DOUBLE:
                d.floating_point_range = [
                    FloatingPointRange(
                        from_value=float(self.lo if self.lo is not None else -math.inf),
                        to_value=float(self.hi if self.hi is not None else math.inf),
                        step=0.0,
                    )
                ]
        return d


# ------------------------------------------------------------------ generated from the dataclasses
# Inclusive ranges of the numeric dataclass fields (validate() has the same lower bounds).
_ENGINE_RANGES: dict[str, tuple[float | None, float | None]] = {
    "tokens_per_frame": (1, 1024),
    "min_decode_steps": (0, 1024),
    "max_decode_steps": (1, 1024),
    "frame_deadline_s": (0.0, 3600.0),
    "block_size": (1, 4096),
    "kv_blocks": (0, None),
    "kv_memory_mb": (0.0, None),
    "kv_memory_fraction": (0.0, 1.0),
    "requests_per_frame": (0.0, 100.0),
    "max_running_requests": (0, 4096),
    "max_queued_requests": (0, None),
    "max_queue_wait_s": (0.0, None),
    "max_overtakes": (0, None),
    "seed": (0, None),
    "num_denoise_steps": (0, 1000),
    "max_request_tokens": (1, 16384),
    "max_request_chars": (1, 1 << 20),
    "max_top_k": (1, 1 << 20),
}
_ENGINE_CHOICES = {
    "mode": MODES,
    "decode_budget": BUDGETS,
    "compile": COMPILE_MODES,
    "attention": ATTENTIONS,
    "schedule": SCHEDULES,
    "batcher_policy": BATCHER_POLICIES,
}
_TASK_RANGES: dict[str, tuple[float | None, float | None]] = {
    "max_new_tokens": (1, 4096),
    "temperature": (0.0, 100.0),
    "top_k": (0, None),
    "every_n_frames": (0, None),
}
_TASK_DOCS = {
    "template": "Prompt template appended after the shared observation prefix; placeholders "
    "{text} (the ask) and {instruction} (the current task instruction).",
    "max_new_tokens": "Token budget of one request of this task.",
    "temperature": "Sampling temperature (0 = greedy).",
    "top_k": "Sample among the k most likely tokens (0 = all).",
    "every_n_frames": "Submit a request of this task every N control frames (0 = only on asks).",
    "own_prefix": "Put the filled template inside its own bidirectional prefix (images + prompt, no "
    "state), as pi0.5 subtask prediction does; one extra prefill per request.",
}


def attribute_docs(cls: type) -> dict[str, str]:
    """Field descriptions from the ``Attributes:`` section of a class docstring (Google style).

    Continuation lines are joined; ``a / b: text`` gives both fields the text (it describes them
    together); several names on one line (``a: x; b: y``) are not split.
    """
    doc = cls.__doc__ or ""
    fields = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    section, current = False, None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped == "Attributes:":
            section = True
            continue
        if not section:
            continue
        if not stripped:
            current = None
            continue
        m = re.match(r"^(\w+(?: / \w+)*): (.*)$", stripped)
        names = m.group(1).split(" / ") if m else []
        if m and (len(line) - len(line.lstrip())) <= 8 and set(names) <= fields:
            current = names
            for n in names:
                out[n] = m.group(2)
        elif current is not None:
            for n in current:
                out[n] += " " + stripped
    return {k: v.replace("``", "") for k, v in out.items()}


def _field_specs(
    cls: type,
    prefix: str,
    defaults: Any,
    ranges: Mapping[str, tuple[float | None, float | None]],
    choices: Mapping[str, Sequence[str]],
    docs: dict[str, str],
    skip: tuple[str, ...],
) -> list[ParamSpec]:
    specs = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = getattr(defaults, f.name)
        ptype = _TYPES[type(default)]
        lo, hi = ranges.get(f.name, (None, None))
        desc = docs.get(f.name) or f"{cls.__name__}.{f.name}."
        specs.append(ParamSpec(f"{prefix}{f.name}", ptype, default, desc, lo, hi, tuple(choices.get(f.name, ()))))
    return specs


def engine_specs() -> list[ParamSpec]:
    """``engine.<field>`` for every :class:`EngineConfig` field except ``tasks``."""
    docs = attribute_docs(EngineConfig)
    docs.setdefault("min_decode_steps", "Fewest decode steps per frame in adaptive mode.")
    docs.setdefault("max_decode_steps", "Most decode steps per frame in adaptive mode.")
    return _field_specs(EngineConfig, "engine.", EngineConfig(), _ENGINE_RANGES, _ENGINE_CHOICES, docs, skip=("tasks",))


def rtc_specs() -> list[ParamSpec]:
    """``rtc.<field>`` for every :class:`~oxygen_ros.core.rtc.config.RTCConfig` field but
    ``control_period_s`` (the node's own ``control_period_s`` fills it)."""
    ranges = {
        "execution_horizon": (1, 10000),
        "max_guidance_weight": (0.0, 1e6),
        "inference_delay": (0, 10000),
        "delay_percentile": (1.0, 100.0),
        "delay_window": (1, 1 << 20),
    }
    choices = {"schedule": RTC_SCHEDULES, "guidance": GUIDANCE_MODES, "inference_delay_mode": DELAY_MODES}
    return _field_specs(
        RTCConfig, "rtc.", RTCConfig(), ranges, choices, attribute_docs(RTCConfig), skip=("control_period_s",)
    )


def default_task(name: str) -> TaskConfig:
    """The task's defaults: its ``DEFAULT_TASKS`` entry, else plain :class:`TaskConfig` defaults."""
    for t in DEFAULT_TASKS:
        if t.name == name:
            return t
    return TaskConfig(name=name)


def task_specs(name: str) -> list[ParamSpec]:
    """``tasks.<name>.<field>`` for every :class:`TaskConfig` field but ``name``, plus its topics."""
    base = default_task(name)
    specs = _field_specs(TaskConfig, f"tasks.{name}.", base, _TASK_RANGES, {}, _TASK_DOCS, skip=("name",))
    s = Parameter.Type.STRING
    specs += [
        ParamSpec(
            f"tasks.{name}.ask_topic",
            s,
            f"{name}/ask",
            "std_msgs/String topic whose messages start a request (text = the ask); empty = never asked.",
        ),
        ParamSpec(
            f"tasks.{name}.delta_topic",
            s,
            f"{name}/delta",
            "std_msgs/String topic for streamed text deltas (one utterance at a time).",
        ),
        ParamSpec(
            f"tasks.{name}.text_topic",
            s,
            f"{name}/text",
            "std_msgs/String topic for each finished utterance (the deltas concatenated).",
        ),
    ]
    return specs


# ------------------------------------------------------------------ declare / read
def declare(node: Node, specs: list[ParamSpec]) -> None:
    """Declare every not-yet-declared spec, taking values from the overrides (YAML, ``-p``).

    A value rclpy refuses (wrong type or out of range) is kept anyway — the parameter is then
    declared with dynamic typing and no range — so :func:`read_values` can report it at configure.
    """
    for spec in specs:
        if node.has_parameter(spec.name):
            continue
        default = spec.ptype if spec.default is None else spec.default
        try:
            node.declare_parameter(spec.name, default, spec.descriptor())
        except (InvalidParameterTypeException, InvalidParameterValueException):
            loose = spec.descriptor(with_range=False)
            loose.dynamic_typing = True
            node.declare_parameter(spec.name, spec.default, loose)


def check_value(spec: ParamSpec, value: Any) -> tuple[Any, str | None]:
    """``(value, None)`` with ints for float parameters converted and arrays as lists, or
    ``(value, message)`` naming the parameter when the type, range or choice is wrong."""
    t = spec.ptype
    name = f"{spec.name}={value!r}"
    if t == Parameter.Type.BOOL:
        ok = isinstance(value, bool)
    elif t == Parameter.Type.INTEGER:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif t == Parameter.Type.DOUBLE:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
        if ok and not math.isfinite(value):
            return value, f"{name}: must be a finite number"
    elif t == Parameter.Type.STRING:
        ok = isinstance(value, str)
    else:  # STRING_ARRAY
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        value = list(value) if ok else value
    if not ok:
        return value, f"{name}: expected {t.name.lower().replace('_', ' ')}"
    if spec.lo is not None and value < spec.lo or spec.hi is not None and value > spec.hi:
        return value, f"{name}: out of range [{spec.lo}, {spec.hi}]"
    if spec.choices and value not in spec.choices:
        return value, f"{name}: must be one of {list(spec.choices)}"
    return value, None


def collect_values(node: Node, specs: list[ParamSpec]) -> tuple[dict[str, Any], list[str]]:
    """Current values of ``specs``, type- and range-checked.

    Returns:
        (name -> value for every valid parameter — ints accepted for float parameters and
        converted, arrays as lists; one message per missing, mistyped or out-of-range parameter).
    """
    values: dict[str, Any] = {}
    problems: list[str] = []
    for spec in specs:
        try:
            value = node.get_parameter(spec.name).value
        except ParameterUninitializedException:
            value = None
        if value is None:
            problems.append(f"{spec.name} is not set ({spec.description})")
            continue
        value, problem = check_value(spec, value)
        if problem:
            problems.append(problem)
        else:
            values[spec.name] = value
    return values, problems


def read_values(node: Node, specs: list[ParamSpec]) -> dict[str, Any]:
    """Like :func:`collect_values`, all-or-nothing.

    Raises:
        ParamError: listing every missing, mistyped or out-of-range parameter by name.
    """
    values, problems = collect_values(node, specs)
    if problems:
        raise ParamError(problems)
    return values
