"""Node parameters: generated from the core dataclasses, described, ranged, validated at configure."""

from __future__ import annotations

import contextlib
import dataclasses
import os

os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"

import pytest  # noqa: E402
import rclpy  # noqa: E402
from domain_coordinator import domain_id  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.signals import SignalHandlerOptions  # noqa: E402
from ros_helpers import ALOHA_JOINTS, REPO  # noqa: E402

from oxygen_ros.core.config import DEFAULT_TASKS, EngineConfig, TaskConfig  # noqa: E402
from oxygen_ros.core.rtc.config import RTCConfig  # noqa: E402
from oxygen_ros.ros.params.node_config import declare_node_params, node_specs, read_node_config  # noqa: E402
from oxygen_ros.ros.params.specs import ParamError, attribute_docs, engine_specs, rtc_specs, task_specs  # noqa: E402

pytestmark = pytest.mark.ros
MINIMAL = ["-p", "model:=pi05-tiny", "-p", "joint_names:=[a,b]", "-p", "cameras.base_0_rgb.topic:=cam"]


@contextlib.contextmanager
def param_node(*args: str):
    """A plain rclpy node named ``oxygen`` with the node's parameters declared from ``args``."""
    with domain_id() as dom:
        ctx = Context()
        rclpy.init(
            context=ctx, domain_id=dom, args=["--ros-args", *args], signal_handler_options=SignalHandlerOptions.NO
        )
        node = Node("oxygen", context=ctx)
        try:
            declare_node_params(node)
            yield node
        finally:
            node.destroy_node()
            ctx.try_shutdown()


def test_engine_parameters_mirror_engine_config_fields():
    specs = {s.name: s for s in engine_specs()}
    defaults = EngineConfig()
    for f in dataclasses.fields(EngineConfig):
        if f.name == "tasks":
            continue
        spec = specs.pop(f"engine.{f.name}")
        assert spec.default == getattr(defaults, f.name)  # the dataclass is the only default
        assert len(spec.description) > 10, f.name
        if isinstance(spec.default, str):
            assert spec.choices, f.name
        elif not isinstance(spec.default, bool):
            assert spec.lo is not None, f"{f.name} has no range"
    assert not specs


def test_rtc_parameters_mirror_rtc_config_and_take_the_control_period():
    specs = {s.name: s for s in rtc_specs()}
    for f in dataclasses.fields(RTCConfig):
        if f.name == "control_period_s":  # the node's own control_period_s
            assert f"rtc.{f.name}" not in specs
            continue
        spec = specs.pop(f"rtc.{f.name}")
        assert spec.default == getattr(RTCConfig(), f.name) and len(spec.description) > 10, f.name
        assert spec.choices or spec.lo is not None or isinstance(spec.default, bool), f.name
    assert not specs
    with param_node(
        *MINIMAL,
        "-p",
        "rtc.enabled:=true",
        "-p",
        "rtc.schedule:=exp",
        "-p",
        "rtc.inference_delay_mode:=fixed",
        "-p",
        "rtc.inference_delay:=3",
        "-p",
        "control_period_s:=0.05",
    ) as node:
        assert "exp" in node.describe_parameter("rtc.schedule").description
        assert not node.set_parameters([Parameter("rtc.execution_horizon", value=0)])[0].successful
        cfg = read_node_config(node)
    assert cfg.rtc == RTCConfig(
        enabled=True, schedule="exp", inference_delay_mode="fixed", inference_delay=3, control_period_s=0.05
    )
    with param_node(*MINIMAL, "-p", "rtc.schedule:=cubic", "-p", "rtc.guidance:=full") as node:
        with pytest.raises(ParamError) as info:
            read_node_config(node)
    assert "rtc.schedule" in str(info.value) and "rtc.guidance" in str(info.value)


def test_task_parameters_mirror_task_config_and_default_tasks():
    for t in DEFAULT_TASKS:
        specs = {s.name: s for s in task_specs(t.name)}
        for f in dataclasses.fields(TaskConfig):
            if f.name != "name":
                assert specs[f"tasks.{t.name}.{f.name}"].default == getattr(t, f.name)
        assert specs[f"tasks.{t.name}.delta_topic"].default == f"{t.name}/delta"
    other = {s.name: s for s in task_specs("narration")}
    assert other["tasks.narration.max_new_tokens"].default == TaskConfig("x").max_new_tokens


def test_attribute_docs_reads_the_dataclass_docstring():
    docs = attribute_docs(EngineConfig)
    assert "decode steps per frame" in docs["tokens_per_frame"]
    assert "``" not in docs["mode"]


def test_descriptors_carry_descriptions_and_ranges():
    with param_node(*MINIMAL) as node:
        d = node.describe_parameter("engine.tokens_per_frame")
        assert d.integer_range[0].from_value == 1 and "decode steps" in d.description
        d = node.describe_parameter("camera_max_age_s")
        assert d.floating_point_range and "stale" in d.description
        assert "'unified'" in node.describe_parameter("engine.mode").description
        # out-of-range runtime changes are refused by rclpy itself
        res = node.set_parameters([Parameter("engine.block_size", value=0)])
        assert not res[0].successful
        cfg = read_node_config(node)
    assert cfg.engine == EngineConfig(tasks=cfg.engine.tasks)
    assert [t.name for t in cfg.engine.tasks] == [t.name for t in DEFAULT_TASKS]
    assert cfg.cameras == {"base_0_rgb": ("cam", "raw")} and cfg.joint_names == ("a", "b")


def test_invalid_values_do_not_crash_and_are_all_named_at_configure():
    bad = [
        "-p",
        "model:=pi05-tiny",
        "-p",
        "engine.tokens_per_frame:=0",
        "-p",
        "engine.mode:=turbo",
        "-p",
        "state_tolerance_s:=abc",
        "-p",
        "camera_qos:=fast",
        "-p",
        "cameras.left_wrist_0_rgb.type:=h264",
        "-p",
        "cameras.base_0_rgb.topic:=c",
        "-p",
        "tasks.memory.max_new_tokens:=0",
        "-p",
        "action_rate_hz:=-1.0",
    ]
    with param_node(*bad) as node:  # declaring must not raise
        with pytest.raises(ParamError) as info:
            read_node_config(node)
    msg = str(info.value)
    for name in (
        "engine.tokens_per_frame",
        "engine.mode",
        "state_tolerance_s",
        "camera_qos",
        "cameras.left_wrist_0_rgb.type",
        "tasks.memory.max_new_tokens",
        "action_rate_hz",
        "joint_names",
    ):
        assert name in msg, name


def test_missing_camera_and_model_and_cross_field_rule():
    with param_node("-p", "joint_names:=[a]") as node:
        with pytest.raises(ParamError, match=r"cameras\.<slot>\.topic.*|model is empty") as info:
            read_node_config(node)
        assert "model is empty" in str(info.value) and "no camera configured" in str(info.value)
    args = [*MINIMAL, "-p", "engine.min_decode_steps:=9", "-p", "engine.max_decode_steps:=3"]
    with param_node(*args) as node:
        with pytest.raises(ParamError, match=r"engine\.min_decode_steps=9"):
            read_node_config(node)


def test_weights_parameter_choices_and_dtype_agreement():
    with param_node(*MINIMAL) as node:
        assert read_node_config(node).weights == ""  # default: the dtype's floats, unquantized
    with param_node(*MINIMAL, "-p", "weights:=int8", "-p", "dtype:=bfloat16") as node:
        assert read_node_config(node).weights == "int8"
    with param_node(*MINIMAL, "-p", "weights:=int3") as node:
        with pytest.raises(ParamError, match="weights"):
            read_node_config(node)
    with param_node(*MINIMAL, "-p", "weights:=bf16", "-p", "dtype:=float32") as node:
        with pytest.raises(ParamError, match="weights='bf16' computes in bfloat16 but dtype='float32'"):
            read_node_config(node)


def test_int_for_float_is_accepted_and_extra_task_is_declared():
    args = [
        *MINIMAL,
        "-p",
        "state_tolerance_s:=1",
        "-p",
        "task_names:=[narration]",
        "-p",
        "tasks.narration.every_n_frames:=5",
        "-p",
        "tasks.narration.template:=Now",
    ]
    with param_node(*args) as node:
        cfg = read_node_config(node)
    assert cfg.state_tolerance_s == 1.0
    assert cfg.engine.task("narration").every_n_frames == 5
    assert cfg.task_topics["narration"].ask == "narration/ask"


@pytest.mark.parametrize("name, cameras, joints", [("oxygen.yaml", 3, ALOHA_JOINTS), ("droid.yaml", 2, None)])
def test_shipped_parameter_files_are_valid(name, cameras, joints):
    with param_node("--params-file", str(REPO / "config" / name), "-r", "__ns:=/robot1") as node:
        cfg = read_node_config(node)
    assert len(cfg.cameras) == cameras
    if joints:
        assert cfg.joint_names == joints
    assert cfg.engine.mode == "unified"
    assert cfg.engine.task("memory").every_n_frames > 0
    names = {s.name for s in node_specs()}
    assert {"model", "device", "joint_names", "control_period_s", "action_rate_hz"} <= names


TYPO_FILE = """\
/**/oxygen:
  ros__parameters:
    model: pi05-tiny
    joint_names: [a, b]
    cameras:
      base_0_rgb: {topic: cam}
    camera_max_age: 0.5
    engine:
      tokens_per_fram: 4
/**/aloha_sim:
  ros__parameters:
    seed: 3
    real_time_factor: 0.5
"""


def test_misspelled_names_in_a_params_file_fail_configure_with_suggestions(tmp_path):
    path = tmp_path / "typos.yaml"
    path.write_text(TYPO_FILE)
    with param_node("--params-file", str(path)) as node:
        with pytest.raises(ParamError) as info:
            read_node_config(node)
    msg = str(info.value)
    assert "unknown parameter camera_max_age (did you mean camera_max_age_s?)" in msg
    assert "unknown parameter engine.tokens_per_fram (did you mean engine.tokens_per_frame?)" in msg
    assert "seed" not in msg and "real_time_factor" not in msg  # the other node's section is not ours


def test_replay_refuses_a_params_file_with_typos(tmp_path):
    from oxygen_ros.replay.prepare import ReplaySetupError, load_node_config

    path = tmp_path / "typos.yaml"
    path.write_text(TYPO_FILE)
    with pytest.raises(ReplaySetupError) as info:
        load_node_config(path)
    assert "did you mean camera_max_age_s?" in str(info.value)
    assert "did you mean engine.tokens_per_frame?" in str(info.value)
    with pytest.raises(ReplaySetupError, match=r"unknown parameter engine\.tokens_per_fram "):  # -p typos too
        load_node_config(
            None, ["model:=pi05-tiny", "joint_names:=[a]", "cameras.base_0_rgb.topic:=c", "engine.tokens_per_fram:=3"]
        )


def test_unknown_task_parameters_name_the_task_list_and_qos_overrides_pass():
    args = [
        *MINIMAL,
        "-p",
        "tasks.conversaton.temperature:=0.5",
        "-p",
        "tasks.narration.temprature:=1.0",
        "-p",
        "qos_overrides./joint_states.subscription.depth:=5",
        "-p",
        "use_sim_time:=false",
    ]
    with param_node(*args) as node:
        with pytest.raises(ParamError) as info:
            read_node_config(node)
    msg = str(info.value)
    assert (
        "unknown parameter tasks.conversaton.temperature (task 'conversaton' is not in task_names "
        "['conversation', 'memory']; did you mean tasks.conversation.temperature?)"
    ) in msg
    assert "tasks.narration.temprature (task 'narration' is not in task_names" in msg
    assert "qos_overrides" not in msg and "use_sim_time" not in msg


def test_a_task_left_out_of_task_names_is_a_note_not_an_error():
    """Narrowing task_names over a shared file (config/oxygen.yaml sets tasks.memory.*) turns the
    task off: its parameters are unused, said at configure, not a typo."""
    args = [
        "--params-file",
        str(REPO / "config" / "oxygen.yaml"),
        "-p",
        "task_names:=[conversation]",
        "-p",
        "tasks.narration.every_n_frames:=5",
    ]
    with param_node(*args) as node:
        cfg = read_node_config(node)
    assert [t.name for t in cfg.engine.tasks] == ["conversation"]
    assert "tasks.memory.every_n_frames is not used: task 'memory' is not in task_names ['conversation']" in cfg.notes
    assert any(n.startswith("tasks.narration.every_n_frames is not used") for n in cfg.notes)


def test_optional_lists_and_shipped_profiles_are_known_names():
    args = [*MINIMAL, "-p", "action_space.flip_joints:=[a]", "-p", "state_joint_names:=[a,b]"]
    with param_node(*args) as node:
        read_node_config(node)  # declared while reading: not unknown
    for name in ("aloha.yaml", "droid.yaml", "libero.yaml", "sim.yaml"):
        extra = [] if name != "sim.yaml" else ["-p", "model:=pi05-tiny"]
        with param_node("--params-file", str(REPO / "config" / name), *extra) as node:
            try:
                read_node_config(node)
            except ParamError as exc:
                assert "unknown parameter" not in str(exc), name
