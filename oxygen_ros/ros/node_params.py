"""The ``oxygen`` node's parameter set and the validated :class:`NodeConfig` built from it.

Node-side parameters (model, device, topics, QoS, timing) are listed here; the engine and task
parameters are generated from the core dataclasses by :mod:`oxygen_ros.ros.params`. All topic names
are relative, so the node's namespace applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rclpy.node import Node
from rclpy.parameter import Parameter

from oxygen_ros.core.config import DEFAULT_TASKS, IMAGE_SLOTS, ConfigError, EngineConfig, TaskConfig
from oxygen_ros.ros.params import ParamError, ParamSpec, collect_values, declare, engine_specs, task_specs
from oxygen_ros.ros.qos import QOS_NAMES

__all__ = ['CAMERA_TYPES', 'COMMAND_TYPES', 'NodeConfig', 'TaskTopics', 'declare_node_params',
           'node_specs', 'read_node_config']

CAMERA_TYPES = ('raw', 'compressed')
COMMAND_TYPES = ('joint_state', 'float64_multi_array')
DTYPES = ('', 'float32', 'bfloat16', 'float16')

_S, _I, _F, _B = (Parameter.Type.STRING, Parameter.Type.INTEGER, Parameter.Type.DOUBLE,
                  Parameter.Type.BOOL)
_SA = Parameter.Type.STRING_ARRAY


def node_specs() -> list[ParamSpec]:
    """Every node-level parameter except the per-task ones (which depend on ``task_names``)."""
    qos = tuple(QOS_NAMES)
    specs = [
        ParamSpec('autostart', _B, True, 'Configure and activate right after start-up.'),
        ParamSpec('model', _S, '', 'Checkpoint folder (openpi or LeRobot pi05) or a random-weight '
                  'preset name (pi05, pi05-small, pi05-tiny). Required.'),
        ParamSpec('device', _S, '', "Torch device, e.g. 'cuda', 'cuda:1', 'cpu' ('' = CUDA if "
                  'available, else CPU).'),
        ParamSpec('dtype', _S, '', "Model dtype ('' = bfloat16 on CUDA, float32 on CPU).",
                  choices=DTYPES),
        ParamSpec('num_threads', _I, 0, 'Torch intra-op CPU threads (0 = torch default).', 0, 1024),
        ParamSpec('joint_names', _SA, None, 'Robot joint names: the state is read from JointState '
                  'by these names and action columns are published under them. Required.'),
        ParamSpec('joint_state_topic', _S, 'joint_states', 'sensor_msgs/JointState input.'),
        ParamSpec('joint_state_qos', _S, 'sensor_data', 'QoS profile name of the joint states.',
                  choices=qos),
        ParamSpec('camera_qos', _S, 'sensor_data', 'QoS profile name of the cameras.', choices=qos),
        ParamSpec('instruction_topic', _S, 'instruction', 'std_msgs/String task instruction input.'),
        ParamSpec('instruction_qos', _S, 'reliable', 'QoS profile name of the instruction.',
                  choices=qos),
        ParamSpec('instruction', _S, '', 'Instruction used until one arrives on instruction_topic.'),
        ParamSpec('ask_qos', _S, 'reliable', 'QoS profile name of the ask topics.', choices=qos),
        ParamSpec('text_qos', _S, 'text', 'QoS profile name of the delta/text topics.', choices=qos),
        ParamSpec('state_tolerance_s', _F, 0.1, 'Largest |image - joint state| stamp difference '
                  'accepted in one observation, seconds.', 0.0, 60.0),
        ParamSpec('camera_max_age_s', _F, 0.5, 'A camera older than this (behind the newest input) '
                  'is stale: its slot is masked, seconds.', 0.001, 3600.0),
        ParamSpec('camera_sync_s', _F, 0.01, 'After a new camera image, wait up to this long for '
                  "the other live cameras' images before starting a frame, seconds.", 0.0, 1.0),
        ParamSpec('time_jump_s', _F, 1.0, 'A stamp this far behind its stream is a backwards time '
                  'jump (buffers cleared); closer ones are dropped as out of order, seconds.',
                  0.001, 3600.0),
        ParamSpec('control_period_s', _F, 0.02, 'Time between consecutive actions of a chunk '
                  '(JointTrajectory time_from_start step), seconds.', 1e-4, 10.0),
        ParamSpec('frame_id', _S, '', 'header.frame_id of published trajectories/commands.'),
        ParamSpec('action_topic', _S, 'action_chunk', 'trajectory_msgs/JointTrajectory output.'),
        ParamSpec('action_qos', _S, 'reliable', 'QoS profile name of the action chunks.',
                  choices=qos),
        ParamSpec('action_rate_hz', _F, 0.0, 'Rate of the per-step command stream, Hz (0 = off).',
                  0.0, 1000.0),
        ParamSpec('command_topic', _S, 'joint_command', 'Per-step command output topic.'),
        ParamSpec('command_type', _S, 'joint_state', "Per-step command message: 'joint_state' "
                  "(sensor_msgs/JointState) or 'float64_multi_array' (ros2_control forward "
                  'controllers).', choices=COMMAND_TYPES),
        ParamSpec('command_qos', _S, 'reliable', 'QoS profile name of the command stream.',
                  choices=qos),
        ParamSpec('command_max_hold_s', _F, 0.5, 'Hold the last point of an exhausted chunk at most '
                  'this long, then stop commanding, seconds.', 0.0, 60.0),
        ParamSpec('diagnostics_period_s', _F, 1.0, 'Period of /diagnostics, seconds.', 0.05, 60.0),
        ParamSpec('debug_model_input', _B, False, 'Publish what the model sees per slot as rgb8 '
                  'images on ~/model_input/<slot>.'),
        ParamSpec('task_names', _SA, [t.name for t in DEFAULT_TASKS], 'Language tasks; each has '
                  'tasks.<name>.* parameters.'),
    ]
    for slot in IMAGE_SLOTS:
        specs.append(ParamSpec(f'cameras.{slot}.topic', _S, '', f'Camera topic of image slot {slot} '
                               '(empty = slot unused, always masked).'))
        specs.append(ParamSpec(f'cameras.{slot}.type', _S, 'raw', 'sensor_msgs/Image (raw) or '
                               'CompressedImage (compressed).', choices=CAMERA_TYPES))
    return specs + engine_specs()


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
    cameras: dict[str, tuple[str, str]] = field(default_factory=dict)  # slot -> (topic, type)
    engine: EngineConfig = field(default_factory=EngineConfig)
    task_topics: dict[str, TaskTopics] = field(default_factory=dict)


def _task_names(node: Node) -> list[str]:
    value = node.get_parameter('task_names').value
    if not isinstance(value, (list, tuple)):
        return []
    return [n for n in value if isinstance(n, str) and n and n.replace('_', '').isalnum()]


def declare_node_params(node: Node) -> None:
    """Declare every parameter (idempotent: tasks added to ``task_names`` later get declared)."""
    declare(node, node_specs())
    for name in _task_names(node):
        declare(node, task_specs(name))


def read_node_config(node: Node) -> NodeConfig:
    """Read, check and assemble the configuration (call at configure).

    Raises:
        ParamError: every invalid parameter, by name (types, ranges, choices, required values,
            cross-checks), or the first complaint of the core dataclasses' own ``validate()``.
    """
    declare_node_params(node)
    values, problems = collect_values(node, node_specs())
    raw_names = values.get('task_names', [])
    names = _task_names(node)
    for bad in [n for n in raw_names if n not in names]:
        problems.append(f'task_names: {bad!r} is not a valid task name (letters, digits, _)')
    if len(set(raw_names)) != len(raw_names):
        problems.append(f'task_names={raw_names!r}: duplicate names')
    for name in names:
        task_values, task_problems = collect_values(node, task_specs(name))
        values.update(task_values)
        problems += task_problems
        for key in ('delta_topic', 'text_topic'):
            if task_values.get(f'tasks.{name}.{key}') == '':
                problems.append(f'tasks.{name}.{key} is empty')
    joints = values.get('joint_names')
    if joints is not None and (not joints or len(set(joints)) != len(joints) or '' in joints):
        problems.append(f'joint_names={joints!r}: must be non-empty, unique names')
    cameras = {s: (values[f'cameras.{s}.topic'], values.get(f'cameras.{s}.type', 'raw'))
               for s in IMAGE_SLOTS if values.get(f'cameras.{s}.topic')}
    if not cameras:
        problems.append('cameras.<slot>.topic: no camera configured; set at least one of '
                        + ', '.join(f'cameras.{s}.topic' for s in IMAGE_SLOTS))
    if values.get('model') == '':
        problems.append('model is empty: give a checkpoint folder or a preset name')
    if problems:
        raise ParamError(problems)
    topics, tasks = {}, []
    for name in names:
        p = f'tasks.{name}.'
        topics[name] = TaskTopics(values[p + 'ask_topic'], values[p + 'delta_topic'],
                                  values[p + 'text_topic'])
        tasks.append(TaskConfig(name=name, **{k: values[p + k] for k in (
            'template', 'max_new_tokens', 'temperature', 'top_k', 'every_n_frames')}))
    eng = {k[len('engine.'):]: v for k, v in values.items() if k.startswith('engine.')}
    try:
        engine = EngineConfig(**eng, tasks=tuple(tasks)).validate()
    except ConfigError as e:
        raise ParamError([str(e)]) from e
    plain = {k: v for k, v in values.items() if '.' not in k and k not in ('task_names', 'autostart')}
    plain['joint_names'] = tuple(plain['joint_names'])
    return NodeConfig(**plain, cameras=cameras, engine=engine, task_topics=topics)
