"""Shadow mode: the comparison of chunks with operator commands (exact numbers, every bad operator
message counted), the parameters, and over Fast DDS the real node process in shadow mode — chunks
on the shadow topic only, nothing on any command topic, ``SHADOW`` and a finite action error on
/diagnostics, read back with ``oxygen status --key 'shadow_*'``."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import numpy as np
import pytest

from oxygen_ros.ros.params.node_config import ParamsFileError, load_node_config
from oxygen_ros.ros.shadow import ShadowComparison

JOINTS = ("a", "b", "c")
BASE = ["model:=pi05-tiny", "joint_names:=[a, b, c]", "cameras.base_0_rgb.topic:=cam"]


def comparison() -> ShadowComparison:
    cmp = ShadowComparison(JOINTS, control_period_s=0.1, window_s=1.0)
    cmp.set_chunk(np.array([[1.0, 2.0, 3.0], [1.5, 2.5, 3.5], [2.0, 3.0, 4.0]]), stamp=10.0)  # due 10.1, 10.2, 10.3
    return cmp


def test_each_command_is_compared_with_the_point_due_at_its_time_by_joint_name():
    cmp = comparison()
    assert cmp.add_command(["c", "a"], [3.25, 0.5], 10.1)  # point 0: |3.25-3|, |0.5-1|
    assert cmp.add_command(["b"], [3.5], 10.21)  # point 1 (nearest): |3.5-2.5|
    s = cmp.summary()
    assert s["shadow_compared"] == 2 and s["shadow_error_max"] == 1.0
    assert s["shadow_error_mean"] == pytest.approx((0.25 + 0.5 + 1.0) / 3)
    assert s["shadow_error_mean a"] == 0.5 and s["shadow_error_mean b"] == 1.0 and s["shadow_error_mean c"] == 0.25
    assert s["shadow_error_worst_joint"] == "b"
    assert s["shadow_error_max a"] == 0.5 and s["shadow_error_max b"] == 1.0 and s["shadow_error_max c"] == 0.25
    assert cmp.add_command(["a"], [2.5], 10.3)  # point 2: |2.5-2|
    assert cmp.add_command(["a"], [1.0], 10.2)  # point 1: |1.0-1.5|
    assert cmp.add_command(["a"], [2.75], 10.3)  # point 2: |2.75-2|
    s = cmp.summary()
    assert s["shadow_error_max a"] == 0.75 and s["shadow_error_mean a"] == pytest.approx((0.5 * 3 + 0.75) / 4)
    assert s["shadow_error_max b"] == 1.0 and s["shadow_error_max"] == 1.0 and s["shadow_compared"] == 5


def test_bad_operator_messages_are_counted_never_raised():
    cmp = comparison()
    assert not cmp.add_command(["a", "b"], [1.0], 10.1)  # lengths differ
    assert not cmp.add_command(["a"], [math.nan], 10.1)  # non-finite
    assert not cmp.add_command(["a"], [1.0], math.inf)  # non-finite time
    assert not cmp.add_command(["x", "y"], [1.0, 2.0], 10.1)  # no joint in common
    assert cmp.add_command(["a", "gripper"], [1.0, 0.0], 10.1)  # unknown joints listed, the rest compared
    assert not cmp.add_command(["a"], [1.0], 10.0)  # before the chunk's first point
    assert not cmp.add_command(["a"], [1.0], 10.4)  # after its last
    s = cmp.summary()
    assert (s["shadow_operator_dropped"], s["shadow_not_covered"], s["shadow_compared"]) == (4, 2, 1)
    assert s["shadow_operator_joints_unknown"] == "gripper,x,y"
    fresh = ShadowComparison(JOINTS, 0.1)
    assert not fresh.add_command(["a"], [1.0], 10.1)  # no chunk yet
    assert fresh.summary()["shadow_not_covered"] == 1 and fresh.summary()["shadow_error_mean"] == -1


def test_the_window_forgets_old_errors():
    cmp = comparison()
    cmp.add_command(["a"], [5.0], 10.1)  # error 4
    cmp.set_chunk(np.zeros((3, 3)), stamp=20.0)
    cmp.add_command(["a"], [0.5], 20.1)  # 10 s later: the window (1 s) holds only this one
    assert cmp.summary()["shadow_error_max"] == 0.5 and cmp.summary()["shadow_compared"] == 2


def test_shadow_parameters():
    cfg = load_node_config(None, BASE + ["shadow.enabled:=true", "shadow.operator_topic:=leader/joint_states"])
    assert cfg.shadow.enabled and cfg.shadow.topic == "shadow/action_chunk"
    assert cfg.shadow.operator_type == "joint_state" and cfg.shadow.window_s == 10.0
    with pytest.raises(ParamsFileError, match="shadow.topic='action_chunk': shadow chunks need a topic of their own"):
        load_node_config(None, BASE + ["shadow.enabled:=true", "shadow.topic:=action_chunk"])
    with pytest.raises(ParamsFileError, match=r"shadow.operator_type='teleop': must be one of"):
        load_node_config(None, BASE + ["shadow.operator_type:=teleop"])
    with pytest.raises(ParamsFileError, match="shadow.operator_topic with action_space.kind='velocity'"):
        load_node_config(None, BASE + ["shadow.operator_topic:=x", "action_space.kind:=velocity"])


@pytest.mark.ros
@pytest.mark.slow
def test_in_shadow_mode_nothing_is_commanded_and_the_error_is_on_diagnostics(tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray
    from domain_coordinator import domain_id
    from ros_helpers import ALOHA_COMPRESSED, ALOHA_JOINTS, REPO, RosPeer, SensorFeed, node_process, ros_env
    from sensor_msgs.msg import JointState
    from trajectory_msgs.msg import JointTrajectory

    from oxygen_ros.ros.convert import sec_to_stamp
    from oxygen_ros.ros.qos import sensor_data_qos

    params = {
        "model": "pi05-tiny",
        "num_threads": 1,
        "diagnostics_period_s": 0.25,
        "action_rate_hz": 50.0,
        "shadow.enabled": True,
        "shadow.operator_topic": "leader/joint_states",
    }
    with domain_id() as dom:
        peer = RosPeer(dom, "operator")
        try:
            for topic, kind in (
                ("action_chunk", JointTrajectory),
                ("joint_command", JointState),
                ("shadow/action_chunk", JointTrajectory),
            ):
                peer.collect(kind, topic)
            peer.collect(DiagnosticArray, "/diagnostics")
            leader = peer.node.create_publisher(JointState, "leader/joint_states", sensor_data_qos(5))
            with node_process(dom, tmp_path / "node.log", REPO / "config" / "oxygen.yaml", params) as node:
                feed = SensorFeed(peer, ALOHA_COMPRESSED, ALOHA_JOINTS, rate_hz=20.0, compressed=True)

                def operator(js: JointState) -> JointState:  # the leader arm: the follower's state, now
                    cmd = JointState(name=list(js.name), position=list(js.position))
                    cmd.header.stamp = sec_to_stamp(js.header.stamp.sec + js.header.stamp.nanosec * 1e-9 + 0.02)
                    leader.publish(cmd)
                    bad = JointState(name=["left_waist"], position=[math.nan])  # counted, never a crash
                    bad.header.stamp = cmd.header.stamp
                    leader.publish(bad)
                    return js

                feed.state_hook = operator
                feed.start()
                try:
                    peer.wait_outputs_matched(["shadow/action_chunk"], 120)
                    compared = peer.wait_for(
                        lambda: [
                            d
                            for d in peer.diagnostics()
                            if int(d.get("shadow_compared", 0)) >= 5 and int(d.get("shadow_operator_dropped", 0)) >= 5
                        ],
                        90,
                    )
                    r = subprocess.run(
                        [sys.executable, "-m", "oxygen_ros.ros.cli", "status", "--key", "shadow*"],
                        cwd=REPO,
                        env=ros_env(dom),
                        capture_output=True,
                        text=True,
                        timeout=90,
                    )
                    time.sleep(0.5)  # anything a command topic would get has arrived by now
                finally:
                    feed.stop()
                assert node.poll() is None, "node died"
            assert node.returncode == 0
        finally:
            peer.close()
    log = (tmp_path / "node.log").read_text()
    assert compared, f"no comparison on /diagnostics: {peer.diagnostics()[-1:]}\n{log}"
    d = compared[-1]
    assert d["shadow"] == "True" and math.isfinite(float(d["shadow_error_mean"])) and float(d["shadow_error_max"]) >= 0
    assert d["shadow_operator_joints_unknown"] == "none" and d["shadow_error_worst_joint"] in ALOHA_JOINTS
    assert len(peer.messages("shadow/action_chunk")) >= 3
    assert peer.messages("action_chunk") == [] and peer.messages("joint_command") == [], "shadow mode commanded"
    lines = r.stdout.splitlines()
    assert "SHADOW: nothing commanded" in lines[0], r
    assert "  shadow: True" in lines and any(line.startswith("  shadow_error_mean: ") for line in lines), r.stdout
