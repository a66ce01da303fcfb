"""The ``oxygen`` node's parameter set and the validated :class:`NodeConfig` built from it.

Node-side parameters (model, device, topics, QoS, timing) are listed here; the engine and task
parameters are generated from the core dataclasses by :mod:`oxygen_ros.ros.params.specs`. All topic names
are relative, so the node's namespace applies.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.exceptions import ParameterUninitializedException
from rclpy.node import Node
from rclpy.parameter import Parameter

from oxygen_ros.core.action_space import GRIPPER_CONVERSIONS, KINDS, ActionSpaceConfig
from oxygen_ros.core.config import DEFAULT_TASKS, IMAGE_SLOTS, WEIGHT_FORMATS, ConfigError, EngineConfig, TaskConfig
from oxygen_ros.core.rtc.config import RTCConfig
from oxygen_ros.ros.params.controllers import (
    ControllerGroup,
    check_groups,
    declare_controller_params,
    read_controller_groups,
)
from oxygen_ros.ros.params.model_access import access_specs, check_model_access, with_model_lock
from oxygen_ros.ros.params.names import unknown_parameters
from oxygen_ros.ros.params.specs import (
    ParamError,
    ParamSpec,
    collect_values,
    declare,
    engine_specs,
    rtc_specs,
    task_specs,
)
from oxygen_ros.ros.qos import QOS_NAMES
from oxygen_ros.ros.shadow import OPERATOR_TYPES, ShadowConfig
from oxygen_ros.streams.text import HEADERS

__all__ = [
    "CAMERA_TYPES",
    "COMMAND_TYPES",
    "NodeConfig",
    "ParamsFileError",
    "TaskTopics",
    "declare_node_params",
    "load_node_config",
    "node_specs",
    "read_node_config",
]

CAMERA_TYPES = ("raw", "compressed")
COMMAND_TYPES = ("joint_state", "float64_multi_array")
DTYPES = ("", "float32", "bfloat16", "float16")

_S, _I, _F, _B = (Parameter.Type.STRING, Parameter.Type.INTEGER, Parameter.Type.DOUBLE, Parameter.Type.BOOL)
_SA = Parameter.Type.STRING_ARRAY
_INT_MAX = 2**31 - 1


def node_specs() -> list[ParamSpec]:
    """Every node-level parameter except the per-task ones (which depend on ``task_names``)."""
    qos = tuple(QOS_NAMES)
    specs = [
        ParamSpec("autostart", _B, True, "Configure and activate right after start-up."),
        ParamSpec(
            "model",
            _S,
            "",
            "Checkpoint folder (openpi or LeRobot pi05) or a random-weight "
            "preset name (pi05, pi05-small, pi05-tiny). Required. Read-only while model_locked is true.",
        ),
        *access_specs(),
        ParamSpec("device", _S, "", "Torch device, e.g. 'cuda', 'cuda:1', 'cpu' ('' = CUDA if available, else CPU)."),
        ParamSpec("dtype", _S, "", "Model dtype ('' = bfloat16 on CUDA, float32 on CPU).", choices=DTYPES),
        ParamSpec(
            "weights",
            _S,
            "",
            "Weight format of the Gemma projections (VLM and action expert): '' = the dtype's floats, "
            "fp32 / bf16 unquantized, int8 / fp8 / int4 torchao weight-only (fp8, int4: CUDA only).",
            choices=("", *WEIGHT_FORMATS),
        ),
        ParamSpec("num_threads", _I, 0, "Torch intra-op CPU threads (0 = torch default).", 0, 1024),
        ParamSpec(
            "joint_names",
            _SA,
            None,
            "Robot joint names: the state is read from JointState "
            "by these names and action columns are published under them. Required.",
        ),
        ParamSpec("joint_state_topic", _S, "joint_states", "sensor_msgs/JointState input."),
        ParamSpec("joint_state_qos", _S, "sensor_data", "QoS profile name of the joint states.", choices=qos),
        ParamSpec("camera_qos", _S, "sensor_data", "QoS profile name of the cameras.", choices=qos),
        ParamSpec("instruction_topic", _S, "instruction", "std_msgs/String task instruction input."),
        ParamSpec("instruction_qos", _S, "reliable", "QoS profile name of the instruction.", choices=qos),
        ParamSpec("instruction", _S, "", "Instruction used until one arrives on instruction_topic."),
        ParamSpec(
            "ask_qos",
            _S,
            "reliable_keep_all",
            "QoS profile name of the ask topics (keep all: a burst of asks is never overwritten in the reader).",
            choices=qos,
        ),
        ParamSpec(
            "max_instruction_chars",
            _I,
            1000,
            "Longest instruction accepted, characters (a "
            "longer one is refused and counted; the previous instruction stays).",
            1,
            1 << 20,
        ),
        ParamSpec(
            "max_image_pixels",
            _I,
            1920 * 1200,
            "Largest camera image accepted, width x height "
            "pixels, read from the message or the PNG/JPEG header before decoding (larger: "
            "dropped and counted).",
            1,
            _INT_MAX,
        ),
        ParamSpec(
            "chunk_timeout_s",
            _F,
            0.0,
            "While observations arrive, no action chunk published "
            "for this long is an ERROR on /diagnostics, seconds (0 = automatic: the larger of 2 s, "
            "2 x input_timeout_s and 10 median frame times).",
            0.0,
            3600.0,
        ),
        ParamSpec("text_qos", _S, "text", "QoS profile name of the delta/text topics.", choices=qos),
        ParamSpec(
            "text_header",
            _S,
            "ask",
            "Utterance header on the text topics: 'ask' ([#3 Q: <ask>] or [#7]), 'id' ([#3]) or 'none' (plain text).",
            choices=HEADERS,
        ),
        ParamSpec(
            "state_tolerance_s",
            _F,
            0.1,
            "Largest |image - joint state| stamp difference accepted in one observation, seconds.",
            0.0,
            60.0,
        ),
        ParamSpec(
            "camera_max_age_s",
            _F,
            0.5,
            "A camera older than this (behind the newest input) is stale: its slot is masked, seconds.",
            0.001,
            3600.0,
        ),
        ParamSpec(
            "camera_sync_s",
            _F,
            0.01,
            "After a new camera image, wait up to this long for "
            "the other live cameras' images before starting a frame, seconds.",
            0.0,
            1.0,
        ),
        ParamSpec(
            "time_jump_s",
            _F,
            1.0,
            "A stamp this far behind its stream is a backwards time "
            "jump (buffers cleared); closer ones are dropped as out of order, seconds.",
            0.001,
            3600.0,
        ),
        ParamSpec(
            "control_period_s",
            _F,
            0.02,
            "Time between consecutive actions of a chunk (JointTrajectory time_from_start step), seconds.",
            1e-4,
            10.0,
        ),
        ParamSpec("frame_id", _S, "", "header.frame_id of published trajectories/commands."),
        ParamSpec("action_topic", _S, "action_chunk", "trajectory_msgs/JointTrajectory output."),
        ParamSpec("action_qos", _S, "reliable", "QoS profile name of the action chunks.", choices=qos),
        ParamSpec("action_rate_hz", _F, 0.0, "Rate of the per-step command stream, Hz (0 = off).", 0.0, 1000.0),
        ParamSpec(
            "position_action_topic",
            _S,
            "action_chunk_positions",
            "JointTrajectory of the "
            "position joints (action_space.absolute_joints) of a velocity action space; the "
            "velocity joints go to action_topic.",
        ),
        ParamSpec(
            "action_space.kind",
            _S,
            "absolute",
            "What the checkpoint's actions are: absolute "
            "joint positions, delta (joint positions relative to the state at observation time), "
            "velocity (joint velocities, published as velocities), ee_delta (end-effector commands, "
            "published as Float64MultiArray).",
            choices=KINDS,
        ),
        ParamSpec(
            "action_space.gripper_conversion",
            _S,
            "none",
            "Gripper conversion of openpi's ALOHA policy ('aloha': adapt_to_pi) for action_space.gripper_joints.",
            choices=GRIPPER_CONVERSIONS,
        ),
        ParamSpec("command_topic", _S, "joint_command", "Per-step command output topic."),
        ParamSpec(
            "command_type",
            _S,
            "joint_state",
            "Per-step command message: 'joint_state' "
            "(sensor_msgs/JointState) or 'float64_multi_array' (ros2_control forward "
            "controllers).",
            choices=COMMAND_TYPES,
        ),
        ParamSpec("command_qos", _S, "reliable", "QoS profile name of the command stream.", choices=qos),
        ParamSpec(
            "command_max_hold_s",
            _F,
            0.5,
            "Hold the last point of an exhausted chunk at most this long, then stop commanding, seconds.",
            0.0,
            60.0,
        ),
        ParamSpec(
            "shadow.enabled",
            _B,
            False,
            "Shadow mode: compute chunks and publish them on shadow.topic only; "
            "nothing is commanded (no action_topic, command stream or controller groups). Read at configure: "
            "leaving shadow mode is a deliberate deactivate, cleanup, set, configure, activate.",
        ),
        ParamSpec("shadow.topic", _S, "shadow/action_chunk", "Where the chunks go in shadow mode."),
        ParamSpec(
            "shadow.operator_topic",
            _S,
            "",
            "The operator's command topic to compare the chunks with in shadow "
            "mode ('' = no comparison); the errors go to /diagnostics (shadow_* keys).",
        ),
        ParamSpec(
            "shadow.operator_type",
            _S,
            "joint_state",
            "Message of shadow.operator_topic: 'joint_state' "
            "(positions by name) or 'joint_trajectory' (its first point).",
            choices=OPERATOR_TYPES,
        ),
        ParamSpec("shadow.operator_qos", _S, "sensor_data", "QoS profile name of shadow.operator_topic.", choices=qos),
        ParamSpec(
            "shadow.window_s", _F, 10.0, "Window of the shadow comparison, seconds of operator commands.", 0.1, 3600.0
        ),
        ParamSpec("diagnostics_period_s", _F, 1.0, "Period of /diagnostics, seconds.", 0.05, 60.0),
        ParamSpec(
            "input_timeout_s",
            _F,
            1.0,
            "An input (a camera, the joint states) that has sent "
            "nothing for this long while active is stale: logged once and a WARN on /diagnostics "
            "(STALE when every input has stopped); wall-clock seconds.",
            0.01,
            3600.0,
        ),
        ParamSpec(
            "debug_model_input",
            _B,
            False,
            "Publish what the model sees per slot as rgb8 images on ~/model_input/<slot>.",
        ),
        ParamSpec(
            "task_names", _SA, [t.name for t in DEFAULT_TASKS], "Language tasks; each has tasks.<name>.* parameters."
        ),
    ]
    for slot in IMAGE_SLOTS:
        specs.append(
            ParamSpec(
                f"cameras.{slot}.topic",
                _S,
                "",
                f"Camera topic of image slot {slot} (empty = slot unused, always masked).",
            )
        )
        specs.append(
            ParamSpec(
                f"cameras.{slot}.type",
                _S,
                "raw",
                "sensor_msgs/Image (raw) or CompressedImage (compressed).",
                choices=CAMERA_TYPES,
            )
        )
    return specs + engine_specs() + rtc_specs()


@dataclass(frozen=True)
class TaskTopics:
    """Topics of one language task (empty ``ask`` = not triggered by asks)."""

    ask: str
    delta: str
    text: str


@dataclass(frozen=True)
class NodeConfig:
    """Validated node configuration (field names = parameter names, see :func:`node_specs`)."""

    model: str
    device: str
    dtype: str
    num_threads: int
    joint_names: tuple[str, ...]
    joint_state_topic: str
    joint_state_qos: str
    camera_qos: str
    instruction_topic: str
    instruction_qos: str
    instruction: str
    ask_qos: str
    text_qos: str
    state_tolerance_s: float
    camera_max_age_s: float
    camera_sync_s: float
    time_jump_s: float
    control_period_s: float
    frame_id: str
    action_topic: str
    action_qos: str
    action_rate_hz: float
    command_topic: str
    command_type: str
    command_qos: str
    command_max_hold_s: float
    diagnostics_period_s: float
    debug_model_input: bool
    text_header: str = "ask"
    input_timeout_s: float = 1.0
    max_instruction_chars: int = 1000
    max_image_pixels: int = 1920 * 1200
    chunk_timeout_s: float = 0.0
    position_action_topic: str = "action_chunk_positions"
    state_joint_names: tuple[str, ...] = ()  # read_node_config fills it (= joint_names when unset)
    action_space: ActionSpaceConfig = field(default_factory=ActionSpaceConfig)
    cameras: dict[str, tuple[str, str]] = field(default_factory=dict)  # slot -> (topic, type)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rtc: RTCConfig = field(default_factory=RTCConfig)
    task_topics: dict[str, TaskTopics] = field(default_factory=dict)
    controllers: tuple[ControllerGroup, ...] = ()
    shadow: ShadowConfig = field(default_factory=ShadowConfig)  # shadow mode (ros/shadow.py)
    shadow_operator_qos: str = "sensor_data"  # ros2_control controller groups (params/controllers.py)
    notes: tuple[str, ...] = ()  # parameters given but unused (a task not in task_names): logged
    model_locked: bool = True  # model read-only since start-up (params/model_access.py)
    model_folders: tuple[str, ...] = ("/",)  # the checkpoint's real path lies inside one of these
    weights: str = ""  # weight format (core.model.quantize); '' = the dtype's floats, unquantized


#: Optional joint lists of the action space (unset = empty: rcl's YAML parser rejects ``[]``).
ACTION_SPACE_LISTS = {
    "absolute_joints": "Joints whose action is an absolute position in a delta or velocity space "
    "(grippers). Unset = none.",
    "flip_joints": "Joints whose sign differs between robot and checkpoint (openpi ALOHA: shoulders, "
    "elbows). Unset = none.",
    "gripper_joints": "Joints converted with action_space.gripper_conversion. Unset = none.",
}


def _optional_list(node: Node, name: str, desc: str, problems: list[str]) -> tuple[str, ...] | None:
    """A string-array parameter that may stay unset (-> ``()``); None when it is not a list of str."""
    if not node.has_parameter(name):
        node.declare_parameter(name, _SA, ParameterDescriptor(description=desc, type=_SA.value))
    try:
        value = node.get_parameter(name).value
    except ParameterUninitializedException:
        value = None  # unset: the list is empty
    if value is not None and not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
        problems.append(f"{name}={value!r}: expected a list of joint names")
        return None
    return tuple(value or ())


def _action_space(node: Node, values: dict[str, Any], problems: list[str]) -> ActionSpaceConfig | None:
    lists = {}
    for name, desc in ACTION_SPACE_LISTS.items():
        got = _optional_list(node, f"action_space.{name}", desc, problems)
        if got is not None:
            lists[name] = got
    if "action_space.kind" not in values or len(lists) != len(ACTION_SPACE_LISTS):
        return None
    try:
        return ActionSpaceConfig(
            kind=values.pop("action_space.kind"),
            gripper_conversion=values.pop("action_space.gripper_conversion"),
            **lists,
        ).validate()
    except ConfigError as e:
        problems.append(str(e))
        return None


def _task_names(node: Node) -> list[str]:
    value = node.get_parameter("task_names").value
    if not isinstance(value, (list, tuple)):
        return []
    return [n for n in value if isinstance(n, str) and n and n.replace("_", "").isalnum()]


def declare_node_params(node: Node) -> None:
    """Declare every parameter (idempotent: tasks added to ``task_names`` later get declared)."""
    declare(node, with_model_lock(node, node_specs()))  # model read-only if model_locked at start-up
    for name in _task_names(node):
        declare(node, task_specs(name))
    declare_controller_params(node)


def read_node_config(node: Node) -> NodeConfig:
    """Read, check and assemble the configuration (call at configure).

    Raises:
        ParamError: every invalid parameter, by name (types, ranges, choices, required values,
            cross-checks, names the node does not declare — with the closest declared name), or the
            first complaint of the core dataclasses' own ``validate()``.
    """
    declare_node_params(node)
    values, problems = collect_values(node, node_specs())
    raw_names = values.get("task_names", [])
    names = _task_names(node)
    for bad in [n for n in raw_names if n not in names]:
        problems.append(f"task_names: {bad!r} is not a valid task name (letters, digits, _)")
    if len(set(raw_names)) != len(raw_names):
        problems.append(f"task_names={raw_names!r}: duplicate names")
    for name in names:
        task_values, task_problems = collect_values(node, task_specs(name))
        values.update(task_values)
        problems += task_problems
        for key in ("delta_topic", "text_topic"):
            if task_values.get(f"tasks.{name}.{key}") == "":
                problems.append(f"tasks.{name}.{key} is empty")
    joints = values.get("joint_names")
    if joints is not None and (not joints or len(set(joints)) != len(joints) or "" in joints):
        problems.append(f"joint_names={joints!r}: must be non-empty, unique names")
    cameras = {
        s: (values[f"cameras.{s}.topic"], values.get(f"cameras.{s}.type", "raw"))
        for s in IMAGE_SLOTS
        if values.get(f"cameras.{s}.topic")
    }
    if not cameras:
        problems.append(
            "cameras.<slot>.topic: no camera configured; set at least one of "
            + ", ".join(f"cameras.{s}.topic" for s in IMAGE_SLOTS)
        )
    if len(values.get("instruction", "")) > values.get("max_instruction_chars", 1 << 30):
        problems.append(
            f"instruction has {len(values['instruction'])} characters, more than "
            f"max_instruction_chars = {values['max_instruction_chars']}"
        )
    if values.get("model") == "":
        problems.append("model is empty: give a checkpoint folder or a preset name")
    float_weights = {"fp32": "float32", "bf16": "bfloat16", "int4": "bfloat16"}.get(values.get("weights", ""))
    if float_weights and values.get("dtype") not in ("", float_weights):
        problems.append(
            f"weights={values['weights']!r} computes in {float_weights} but dtype={values['dtype']!r}: "
            f"leave dtype empty or set it to {float_weights}"
        )
    space = _action_space(node, values, problems)
    state_names = _optional_list(
        node,
        "state_joint_names",
        "State dims read from JointState by these names, "
        "in the checkpoint's order, when they differ from joint_names (LIBERO: 8 "
        "state dims, 7 action dims). Unset = joint_names.",
        problems,
    )
    if state_names and len(set(state_names)) != len(state_names):
        problems.append(f"state_joint_names={list(state_names)!r}: names must be unique")
    if (
        space is not None
        and space.kind == "ee_delta"
        and values.get("action_rate_hz", 0) > 0
        and values.get("command_type") == "joint_state"
    ):
        problems.append(
            "command_type='joint_state' with action_space.kind='ee_delta': end-effector "
            "commands are not joint states; use command_type: float64_multi_array"
        )
    groups = read_controller_groups(node, problems)
    if space is not None and joints is not None:
        problems += check_groups(
            groups,
            tuple(joints),
            space.kind,
            values.get("action_rate_hz", 0.0),
            {values["action_topic"]: "action_topic"} if "action_topic" in values else {},
        )
    if values.get("shadow.operator_topic") and space is not None and space.kind not in ("absolute", "delta"):
        problems.append(
            f"shadow.operator_topic with action_space.kind={space.kind!r}: the comparison is of joint "
            "positions (kind absolute or delta)"
        )
    if values.get("shadow.enabled") and values.get("shadow.topic") in ("", values.get("action_topic")):
        problems.append(
            f"shadow.topic={values.get('shadow.topic')!r}: shadow chunks need a topic of their own, "
            "not action_topic (nothing may be commanded in shadow mode)"
        )
    unknown, notes = unknown_parameters(node, names)  # after every declaration above
    notes += check_model_access(values, problems)  # model inside model_folders; warns if open to anyone
    problems += unknown
    if problems:
        raise ParamError(problems)
    assert space is not None  # _action_space returns None only with a problem
    topics, tasks = {}, []
    for name in names:
        p = f"tasks.{name}."
        topics[name] = TaskTopics(values[p + "ask_topic"], values[p + "delta_topic"], values[p + "text_topic"])
        tasks.append(
            TaskConfig(
                name=name,
                **{
                    k: values[p + k]
                    for k in ("template", "max_new_tokens", "temperature", "top_k", "every_n_frames", "own_prefix")
                },
            )
        )
    eng = {k[len("engine.") :]: v for k, v in values.items() if k.startswith("engine.")}
    rtc_values = {k[len("rtc.") :]: v for k, v in values.items() if k.startswith("rtc.")}
    try:
        engine = EngineConfig(**eng, tasks=tuple(tasks)).validate()
        rtc = RTCConfig(**rtc_values, control_period_s=values["control_period_s"]).validate()
    except ConfigError as e:
        raise ParamError([str(e)]) from e
    plain = {k: v for k, v in values.items() if "." not in k and k not in ("task_names", "autostart")}
    plain["joint_names"] = tuple(plain["joint_names"])
    return NodeConfig(
        **plain,
        state_joint_names=state_names or plain["joint_names"],
        action_space=space,
        cameras=cameras,
        engine=engine,
        task_topics=topics,
        rtc=rtc,
        notes=tuple(notes),
        controllers=groups,
        shadow_operator_qos=values["shadow.operator_qos"],
        shadow=ShadowConfig(
            values["shadow.enabled"],
            values["shadow.topic"],
            values["shadow.operator_topic"],
            values["shadow.operator_type"],
            values["shadow.window_s"],
        ),
    )


class ParamsFileError(ValueError):
    """A parameter file or override that cannot be read or holds invalid parameters (named)."""


def load_node_config(
    params_file: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None,
    overrides: Sequence[str] = (),
    node_name: str = "oxygen",
    namespace: str = "/",
) -> NodeConfig:
    """Read the ``oxygen`` node's configuration from a parameter file, as the node does: a
    short-lived rclpy node in a private context declares the node's parameters, so names,
    defaults, types, ranges and error messages are the node's (used by ``replay`` and
    ``norm_stats``).

    Args:
        params_file: ``ros__parameters`` YAML (``--params-file``), or several (later ones win, as
            rcl merges them); None for defaults only.
        overrides: ``name:=value`` strings, as ``--ros-args -p name:=value``.
        node_name: node name the file's sections are matched against (``/**/oxygen``, ``/**``…).
        namespace: node namespace (relative topic names resolve against it).

    Raises:
        ParamsFileError: unreadable file, malformed override, or invalid parameters (every one
            named, from the node's own checks).
    """
    import rclpy
    from rclpy.context import Context
    from rclpy.signals import SignalHandlerOptions

    args = ["--ros-args"]
    files = [] if params_file is None else [params_file] if isinstance(params_file, (str, os.PathLike)) else params_file
    for path in map(Path, files):
        if not path.is_file():
            raise ParamsFileError(f"parameter file {path} does not exist")
        args += ["--params-file", str(path)]
    for item in overrides:
        if ":=" not in item:
            raise ParamsFileError(f"parameter override {item!r} must look like name:=value")
        args += ["-p", item]
    ctx = Context()
    try:
        rclpy.init(args=args, context=ctx, signal_handler_options=SignalHandlerOptions.NO)
    except Exception as exc:  # rcl's YAML parser / argument errors
        raise ParamsFileError(f"cannot read parameters ({' '.join(args[1:])}): {exc}") from exc
    try:
        node = Node(node_name, namespace=namespace, context=ctx, start_parameter_services=False, enable_rosout=False)
        try:
            return read_node_config(node)
        except ParamError as exc:
            where = f" in {', '.join(map(str, files))}" if files else ""
            raise ParamsFileError(f"invalid node parameters{where}: {exc}") from exc
        finally:
            node.destroy_node()
    finally:
        ctx.try_shutdown()
