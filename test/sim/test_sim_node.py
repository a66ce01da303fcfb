"""The ``aloha_sim`` node: parameter files and launch file (static), pacing, and the node itself
over Fast DDS (its own process): sensors and /clock out, time-aligned chunk execution, rejection of
bad chunks, hold + loss report, reset service/topic, the per-step command stream and raw images."""

from __future__ import annotations

import importlib.util
import math
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import yaml
from ros_helpers import REPO, RosPeer, node_process

pytest.importorskip("mujoco")
pytest.importorskip("gym_aloha")

from builtin_interfaces.msg import Duration  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from domain_coordinator import domain_id  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image, JointState  # noqa: E402
from std_msgs.msg import Empty  # noqa: E402
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint  # noqa: E402

from oxygen_ros.ros.convert import (  # noqa: E402
    compressed_to_rgb,
    image_to_rgb,
    sec_to_stamp,
    stamp_to_sec,
)
from oxygen_ros.ros.qos import reliable_qos, sensor_data_qos  # noqa: E402
from oxygen_ros.sim.node import STATUS_NAME, Pacer, sim_specs  # noqa: E402
from oxygen_ros.sim.scene import JOINT_NAMES  # noqa: E402

SIM_YAML = REPO / "config" / "sim.yaml"
SIM_MODULE = "oxygen_ros.sim.node"
OXYGEN_YAML = REPO / "config" / "oxygen.yaml"
DT = 0.02
CAMS = ("cam_high/image_raw/compressed", "cam_left_wrist/image_raw/compressed", "cam_right_wrist/image_raw/compressed")


# ---------------------------------------------------------------------------------------- static
def _section(path: Path, node: str) -> dict:
    doc = yaml.safe_load(path.read_text())
    return next(v["ros__parameters"] for k, v in doc.items() if k.split("/")[-1] == node)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_sim_yaml_matches_the_oxygen_node():
    sim = _section(SIM_YAML, "aloha_sim")
    oxygen = _flatten(_section(OXYGEN_YAML, "oxygen")) | _flatten(_section(SIM_YAML, "oxygen"))
    specs = {s.name for s in sim_specs()}
    assert set(sim) <= specs, set(sim) - specs
    assert tuple(oxygen["joint_names"]) == JOINT_NAMES
    assert oxygen["control_period_s"] == pytest.approx(1.0 / sim["control_rate_hz"])
    assert oxygen["joint_state_topic"] == sim["joint_state_topic"]
    assert oxygen["action_topic"] == sim["action_topic"]
    assert oxygen["command_topic"] == sim["command_topic"]
    assert oxygen["command_type"] == sim["command_type"]
    slots = {"top": "base_0_rgb", "left_wrist": "left_wrist_0_rgb", "right_wrist": "right_wrist_0_rgb"}
    kind = "compressed" if sim["image_format"] in ("jpeg", "png") else "raw"
    for cam, topic in zip(sim["cameras"], sim["camera_topics"], strict=True):
        assert oxygen[f"cameras.{slots[cam]}.topic"] == topic
        assert oxygen[f"cameras.{slots[cam]}.type"] == kind


class _Recorder:
    """Stand-in for launch / launch_ros classes: keeps its arguments."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class _Config(_Recorder):
    def perform(self, context):
        return context[self.args[0]]


class _Path(_Recorder):
    def perform(self, context):
        return str(REPO / Path(*self.args[0][1:]))


def _load_launch(monkeypatch):
    mods = {
        name: types.ModuleType(name)
        for name in (
            "launch",
            "launch.actions",
            "launch.substitutions",
            "launch_ros",
            "launch_ros.actions",
            "launch_ros.substitutions",
        )
    }
    mods["launch"].LaunchDescription = lambda entities: list(entities)
    mods["launch.actions"].DeclareLaunchArgument = _Recorder
    mods["launch.actions"].OpaqueFunction = _Recorder
    mods["launch.substitutions"].LaunchConfiguration = _Config
    mods["launch.substitutions"].PathJoinSubstitution = _Path
    mods["launch_ros.actions"].Node = type("Node", (_Recorder,), {})
    mods["launch_ros.actions"].LifecycleNode = type("LifecycleNode", (_Recorder,), {})
    mods["launch_ros.substitutions"].FindPackageShare = _Recorder
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    spec = importlib.util.spec_from_file_location("sim_launch", REPO / "launch" / "sim.launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "args, sim_time",
    [
        ({}, False),
        ({"real_time_factor": "0.25"}, True),
        ({"use_sim_time": "true"}, True),
        ({"real_time_factor": "1.0", "model": "pi05-tiny", "device": "cpu"}, False),
    ],
)
def test_launch_file_starts_both_nodes_with_matching_parameters(monkeypatch, args, sim_time):
    launch = _load_launch(monkeypatch)
    entities = launch.generate_launch_description()
    declared = {e.args[0]: e.kwargs["default_value"] for e in entities if type(e).__name__ == "_Recorder" and e.args}
    context = {k: (v.perform(None) if isinstance(v, _Path) else v) for k, v in declared.items()}
    context.update(args)
    opaque = [e for e in entities if "function" in e.kwargs]
    sim, oxygen = opaque[0].kwargs["function"](context)
    assert (sim.kwargs["executable"], sim.kwargs["name"]) == ("aloha_sim", "aloha_sim")
    assert (oxygen.kwargs["executable"], oxygen.kwargs["name"]) == ("oxygen_node", "oxygen")
    assert type(oxygen).__name__ == "LifecycleNode"
    sim_files = [p.args[0] for p in sim.kwargs["parameters"] if isinstance(p, _Config)]
    oxy_files = [p.args[0] for p in oxygen.kwargs["parameters"] if isinstance(p, _Config)]
    assert sim_files == ["sim_params_file"]
    assert oxy_files == ["oxygen_params_file", "sim_params_file"]  # sim.yaml wins
    assert context["sim_params_file"].endswith("config/sim.yaml")
    sim_over, oxy_over = sim.kwargs["parameters"][-1], oxygen.kwargs["parameters"][-1]
    assert sim_over["publish_clock"] is sim_time and oxy_over["use_sim_time"] is sim_time
    if "real_time_factor" in args:
        assert sim_over["real_time_factor"] == float(args["real_time_factor"])
    assert oxy_over.get("model") == args.get("model")
    assert sim.kwargs["namespace"].args[0] == oxygen.kwargs["namespace"].args[0] == "namespace"


def test_launch_file_switches_to_sim_time_for_a_slow_sim_in_the_params_file(monkeypatch, tmp_path):
    launch = _load_launch(monkeypatch)
    slow = tmp_path / "slow.yaml"
    slow.write_text(SIM_YAML.read_text().replace("real_time_factor: 1.0", "real_time_factor: 0.5"))
    context = {
        "sim_params_file": str(slow),
        "oxygen_params_file": str(OXYGEN_YAML),
        "namespace": "",
        "model": "",
        "device": "",
        "real_time_factor": "",
        "use_sim_time": "false",
        "log_level": "info",
    }
    sim, oxygen = launch._nodes(context)
    assert sim.kwargs["parameters"][-1] == {"publish_clock": True}
    assert oxygen.kwargs["parameters"][-1] == {"use_sim_time": True}
    context["sim_params_file"] = str(SIM_YAML)
    sim, oxygen = launch._nodes(context)
    assert oxygen.kwargs["parameters"][-1] == {"use_sim_time": False}


def test_pacer_paces_and_handles_falling_behind():
    wall = [100.0]
    p = Pacer(0.02, 1.0, max_lag_s=0.25, wall=lambda: wall[0])
    assert p.delay() == 0.0
    p.advance()
    assert p.delay() == pytest.approx(0.02)
    wall[0] += 0.02
    p.advance()
    wall[0] += 0.1  # a small stall: catch up without sleeping
    assert p.delay() == 0.0 and p.overruns == 0
    wall[0] += 1.0  # a long stall in real time: the sim clock jumps ahead to the wall clock
    before = p.elapsed
    assert p.delay() == 0.0 and p.overruns == 1
    assert p.elapsed - before == pytest.approx(1.08)
    p.advance()
    assert p.delay() == pytest.approx(0.02)
    slow = Pacer(0.02, 0.5, max_lag_s=0.25, wall=lambda: wall[0])
    slow.advance()
    assert slow.delay() == pytest.approx(0.04)  # half speed
    wall[0] += 5.0
    t = slow.elapsed
    assert slow.delay() == 0.0 and slow.elapsed == t  # sim time never jumps when not real time
    assert Pacer(0.02, 0.0, 0.25).delay() == 0.0


@pytest.mark.ros
def test_invalid_parameters_are_named(tmp_path):
    import subprocess

    from ros_helpers import ros_env

    with domain_id() as dom:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "oxygen_ros.sim.node",
                "--ros-args",
                "-p",
                "camera_topics:=[a,b]",
                "-p",
                "image_format:=gif",
                "-p",
                "control_rate_hz:=-3.0",
            ],
            cwd=REPO,
            env=ros_env(dom),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stdout + proc.stderr
    assert "image_format" in err and "control_rate_hz" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------- process
def _diag(peer: RosPeer) -> dict[str, str]:
    for msg in reversed(peer.messages("/diagnostics")):
        for st in msg.status:
            if st.name == STATUS_NAME:
                return {kv.key: kv.value for kv in st.values}
    return {}


def _count(peer: RosPeer, key: str) -> int:
    value = _diag(peer).get(key, "0")
    return int(float(value)) if value else 0


def _latest_state(peer: RosPeer) -> tuple[float, np.ndarray]:
    msg = peer.messages("joint_states")[-1]
    return stamp_to_sec(msg.header.stamp), np.asarray(msg.position)


def _chunk(stamp: float, rows: np.ndarray, first: float, names=JOINT_NAMES) -> JointTrajectory:
    msg = JointTrajectory(joint_names=list(names))
    msg.header.stamp = sec_to_stamp(stamp)
    for i, row in enumerate(rows):
        sec, ns = divmod(round((first + i * DT) * 1e9), 10**9)
        msg.points.append(
            JointTrajectoryPoint(positions=[float(v) for v in row], time_from_start=Duration(sec=sec, nanosec=ns))
        )
    return msg


def _executed(peer: RosPeer) -> list[tuple[float, str, np.ndarray]]:
    return [
        (stamp_to_sec(m.header.stamp), m.header.frame_id, np.asarray(m.position))
        for m in peer.messages("aloha_sim/executed_command")
    ]


@pytest.mark.ros
@pytest.mark.slow
def test_sim_node_executes_chunks_by_time_rejects_bad_ones_holds_and_resets(tmp_path):
    log = tmp_path / "sim.log"
    with domain_id() as dom:
        peer = RosPeer(dom, "sim_test")
        try:
            for topic in CAMS:
                peer.collect(CompressedImage, topic, sensor_data_qos(10))
            peer.collect(JointState, "joint_states", sensor_data_qos(50))
            peer.collect(JointState, "aloha_sim/executed_command", reliable_qos(500))
            peer.collect(Clock, "/clock", sensor_data_qos(10))
            peer.collect(DiagnosticArray, "/diagnostics", reliable_qos(50))
            chunks = peer.node.create_publisher(JointTrajectory, "action_chunk", reliable_qos())
            reset_pub = peer.node.create_publisher(Empty, "aloha_sim/reset", reliable_qos())
            params = {
                "publish_clock": True,
                "loss_timeout_s": 0.2,
                "diagnostics_period_s": 0.2,
                "image_width": 64,
                "image_height": 48,
                "camera_rate_hz": 5.0,
            }
            with node_process(dom, log, SIM_YAML, params, module=SIM_MODULE) as sim:
                ready = peer.wait_for(lambda: len(peer.messages(CAMS[2])) >= 2 and _diag(peer), 60)
                assert ready, log.read_text()
                # sensors: joint states with the 14 joints, cameras decode, /clock follows
                js = peer.messages("joint_states")[-1]
                assert tuple(js.name) == JOINT_NAMES and len(js.velocity) == 14
                img = compressed_to_rgb(peer.messages(CAMS[0])[-1])
                assert img.shape == (48, 64, 3) and img.std() > 1
                state_stamps = {round(stamp_to_sec(m.header.stamp), 6) for m in peer.messages("joint_states")}
                cam_stamp = round(stamp_to_sec(peer.messages(CAMS[1])[-1].header.stamp), 6)
                assert cam_stamp in state_stamps  # images are stamped with a joint-state time
                assert peer.messages("/clock")
                assert _diag(peer)["state"] == "waiting"
                t_state, q0 = _latest_state(peer)

                # bad chunks: rejected, counted, never executed
                bad = np.tile(q0, (10, 1))
                bad[3, 2] = math.nan
                peer.publish_matched(chunks, _chunk(t_state, bad, 0.1))
                chunks.publish(_chunk(t_state, np.tile(q0, (10, 1)), 0.1, JOINT_NAMES[::-1][:13]))
                chunks.publish(_chunk(t_state, np.tile(q0[:7], (10, 1)), 0.1))
                assert peer.wait_for(
                    lambda: (
                        _count(peer, "non_finite") == 1
                        and _count(peer, "bad_names") == 1
                        and _count(peer, "bad_shape") == 1
                    ),
                    10,
                ), _diag(peer)
                assert _diag(peer)["state"] == "waiting"

                # a good chunk: small steps on the right arm's waist, due from LEAD s after its
                # stamp (LEAD covers delivery on a loaded machine: every point must run)
                LEAD = 1.0
                t_state, q0 = _latest_state(peer)
                held = _executed(peer)[-1][2]
                rows = np.tile(held, (15, 1))
                rows[:, 7] = held[7] + 0.04 * np.arange(1, 16)  # 0.04 per step < speed limit 0.06
                stamp = t_state
                chunks.publish(_chunk(stamp, rows, LEAD))
                assert peer.wait_for(lambda: _count(peer, "losses") == 1, 15), _diag(peer)
                ex = [e for e in _executed(peer) if e[0] >= stamp + LEAD - 0.011]
                ran = [e for e in ex if e[1] == "executing"]
                assert len(ran) == 15, [(round(t - stamp, 3), s) for t, s, _ in ex[:20]]
                for t, _, pos in ran:  # the point due at each step, exactly
                    i = int(math.floor((t + 0.01 - stamp - LEAD) / DT + 1e-9))
                    np.testing.assert_allclose(pos, rows[i], atol=1e-12)
                # after the chunk: the last point is held, finite, no jump; then a loss report
                after = [e for e in ex if e[0] > ran[-1][0]]
                assert after and all(np.array_equal(p, rows[-1]) for _, _, p in after)
                assert {s for _, s, _ in after} <= {"holding", "lost"}
                assert _diag(peer)["state"] == "lost"
                # the simulated arm followed the command
                peer.wait_for(lambda: abs(_latest_state(peer)[1][7] - rows[-1, 7]) < 0.05, 5)
                assert abs(_latest_state(peer)[1][7] - rows[-1, 7]) < 0.05
                assert abs(_latest_state(peer)[1][7] - q0[7]) > 0.4

                # an older chunk is dropped, a fresh one resumes
                chunks.publish(_chunk(stamp - 0.5, rows, 0.1))
                t_state, _ = _latest_state(peer)
                back = np.tile(rows[-1], (10, 1))
                back[:, 7] = rows[-1, 7] - 0.04 * np.arange(1, 11)
                chunks.publish(_chunk(t_state, back, LEAD))
                assert peer.wait_for(lambda: _count(peer, "resumes") == 1 and _count(peer, "out_of_order") == 1, 10), (
                    _diag(peer)
                )

                # reset: service (std_srvs) or topic -> start pose again, chunks start over
                try:
                    from std_srvs.srv import Trigger
                except ImportError:
                    Trigger = None
                if Trigger is not None:
                    client = peer.node.create_client(Trigger, "aloha_sim/reset")
                    assert client.wait_for_service(timeout_sec=10)
                    future = client.call_async(Trigger.Request())
                    assert peer.wait_for(future.done, 15)
                    assert future.result().success, future.result().message
                else:
                    peer.publish_matched(reset_pub, Empty())
                assert peer.wait_for(lambda: _count(peer, "resets") >= 1, 10), _diag(peer)
                peer.wait_for(lambda: _diag(peer).get("state") == "waiting", 5)
                assert _diag(peer)["state"] == "waiting"
                peer.wait_for(
                    lambda: (
                        np.allclose(_latest_state(peer)[1][:6], q0[:6], atol=0.05)
                        and np.allclose(_latest_state(peer)[1][7:13], q0[7:13], atol=0.05)
                    ),
                    10,
                )
                q_reset = _latest_state(peer)[1]
                np.testing.assert_allclose(q_reset[:6], q0[:6], atol=0.05)
                np.testing.assert_allclose(q_reset[7:13], q0[7:13], atol=0.05)
                n_resets = _count(peer, "resets")
                peer.publish_matched(reset_pub, Empty())
                assert peer.wait_for(lambda: _count(peer, "resets") == n_resets + 1, 10)

                for _, _, pos in _executed(peer):
                    assert np.isfinite(pos).all()
                steps = np.diff(np.stack([p for _, s, p in _executed(peer)]), axis=0)
                assert sim.poll() is None
            assert sim.returncode == 0, log.read_text()
        finally:
            peer.close()
    text = log.read_text()
    assert "command loss" in text and "commands resumed" in text
    assert "non_finite" in text and "bad_names" in text  # logged once each
    assert text.count("non_finite:") == 1
    assert "Traceback" not in text and "incompatible" not in text.lower()
    assert "final:" in text
    # the only big jumps are the two resets (teleport to the start pose)
    assert (np.abs(steps).max(axis=1) > 3.0 * DT + 1e-9).sum() <= 2


@pytest.mark.ros
@pytest.mark.slow
def test_stream_source_raw_images_and_faster_than_real_time(tmp_path):
    log = tmp_path / "sim.log"
    topics = ["cam_high/image_raw", "cam_left_wrist/image_raw", "cam_right_wrist/image_raw"]
    with domain_id() as dom:
        peer = RosPeer(dom, "stream_test")
        try:
            for topic in topics:
                peer.collect(Image, topic, sensor_data_qos(10))
            peer.collect(JointState, "joint_states", sensor_data_qos(50))
            peer.collect(JointState, "aloha_sim/executed_command", reliable_qos(500))
            peer.collect(DiagnosticArray, "/diagnostics", reliable_qos(50))
            cmd_pub = peer.node.create_publisher(JointState, "joint_command", reliable_qos())
            params = {
                "command_source": "stream",
                "image_format": "rgb8",
                "camera_topics": topics,
                "real_time_factor": 2.0,
                "publish_clock": True,
                "image_width": 32,
                "image_height": 24,
                "camera_rate_hz": 2.0,
                "diagnostics_period_s": 0.5,
                "command_timeout_s": 2.0,
            }  # sim s (1 s wall): a loaded machine's delivery lag is no gap
            with node_process(dom, log, SIM_YAML, params, module=SIM_MODULE) as sim:
                assert peer.wait_for(lambda: peer.messages(topics[0]) and _diag(peer), 60), log.read_text()
                rgb = image_to_rgb(peer.messages(topics[0])[-1])
                assert rgb.shape == (24, 32, 3)
                peer.wait_for(lambda: float(_diag(peer).get("sim_time", 0)) > 2.0, 10)
                rtf = float(_diag(peer)["real_time_factor"])
                assert 1.2 < rtf < 2.5, _diag(peer)  # loose: the machine is shared
                assert peer.wait_for(lambda: cmd_pub.get_subscription_count() > 0, 30)
                target = _executed(peer)[-1][2].copy()  # the held start pose
                target[0] += 0.02
                order = list(reversed(range(14)))  # by name, any order
                losses = _count(peer, "losses")
                deadline = time.monotonic() + 30
                # A per-step stream stamped on the sim clock, until the sim reports five accepted
                # (on a loaded machine a command can reach it after command_timeout_s: expired).
                while _count(peer, "accepted") < 5 and time.monotonic() < deadline:
                    t, _ = _latest_state(peer)
                    msg = JointState(name=[JOINT_NAMES[i] for i in order], position=[float(target[i]) for i in order])
                    msg.header.stamp = sec_to_stamp(t)
                    cmd_pub.publish(msg)
                    time.sleep(0.01)
                assert _count(peer, "accepted") >= 5, _diag(peer)
                # the stream stopped: the sim holds and reports a command loss
                assert peer.wait_for(
                    lambda: _diag(peer).get("state") == "lost" and _count(peer, "losses") > losses, 10
                ), _diag(peer)
                ran = [p for _, s, p in _executed(peer) if s == "executing"]
                assert ran and all(np.allclose(p, target) for p in ran)
                assert sim.poll() is None
            assert sim.returncode == 0, log.read_text()
        finally:
            peer.close()
    assert "Traceback" not in log.read_text()
