"""``fake_robot`` against the real node over Fast DDS: with config/humanoid.yaml it feeds the node and
its five fake controllers accept what the node commands (exit 0); told to expect another joint order
for one controller, that controller rejects every trajectory, names why, and the exit status is 1.
Plus the checks of one fake controller on hand-made messages."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.sim.fake_robot.run import ControllerCheck


def _trajectory(names, rows) -> JointTrajectory:
    return JointTrajectory(joint_names=list(names), points=[JointTrajectoryPoint(positions=list(r)) for r in rows])


def test_a_fake_controller_checks_names_order_counts_and_finiteness():
    arm = ControllerCheck("arm", "arm/joint_trajectory", ("a", "b"))
    assert arm.check(_trajectory("ab", [[0.0, 1.0], [0.5, 1.5]]))
    assert not arm.check(_trajectory("ba", [[0.0, 1.0]]))
    assert not arm.check(_trajectory("ab", [[0.0]]))
    assert not arm.check(_trajectory("ab", [[0.0, math.nan]]))
    assert not arm.check(_trajectory("ab", []))
    assert (arm.accepted, arm.rejected) == (1, 4)
    assert (
        arm.line() == "arm (arm/joint_trajectory): 1 accepted, 4 rejected: joint_names ['b', 'a'] are not "
        "['a', 'b'] (names and order)"
    )
    hand = ControllerCheck("hand", "hand/commands", ("x", "y", "z"), "forward_command")
    assert hand.check(Float64MultiArray(data=[1.0, 2.0, 3.0]))
    assert not hand.check(Float64MultiArray(data=[1.0, 2.0]))
    assert not hand.check(Float64MultiArray(data=[1.0, 2.0, math.inf]))
    assert ControllerCheck("idle", "t", ("a",)).line() == "idle (t): 0 accepted, 0 rejected: nothing received"


@pytest.mark.ros
@pytest.mark.slow
def test_fake_robot_feeds_the_node_and_checks_every_controller(tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray
    from domain_coordinator import domain_id
    from ros_helpers import REPO, RosPeer, node_process, ros_env

    profile = REPO / "config" / "humanoid.yaml"
    short = "instruction:=grasp"  # pi05-tiny's 64-token prompt: 27 state tokens and a short task
    with domain_id() as dom:
        peer = RosPeer(dom, "watcher")
        try:
            peer.collect(DiagnosticArray, "/diagnostics")
            with node_process(
                dom, tmp_path / "node.log", profile, {"model": "pi05-tiny", "num_threads": 1, "instruction": "grasp"}
            ) as node:
                active = peer.wait_for(lambda: any(d.get("state") == "active" for d in peer.diagnostics()), 120)
                assert active, (tmp_path / "node.log").read_text()
                run = lambda *extra: subprocess.run(  # noqa: E731
                    [
                        sys.executable,
                        "-m",
                        "oxygen_ros.sim.fake_robot.run",
                        "--params-file",
                        str(profile),
                        "-p",
                        short,
                        "--duration",
                        "8",
                        *extra,
                    ],
                    cwd=REPO,
                    env=ros_env(dom),
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                good = run()
                reversed_arm = run(
                    "-p",
                    "controllers.left_arm_controller.joints:=[left_wrist_roll, left_wrist_pitch, "
                    "left_wrist_yaw, left_elbow, left_shoulder_yaw, left_shoulder_roll, "
                    "left_shoulder_pitch]",
                )
                assert node.poll() is None, "node died"
            assert node.returncode == 0
        finally:
            peer.close()
    lines = good.stdout.splitlines()
    assert good.returncode == 0, (good.stdout, good.stderr, (tmp_path / "node.log").read_text())
    assert [line.split(" ")[0] for line in lines] == [
        "left_arm_controller",
        "right_arm_controller",
        "left_hand_controller",
        "right_hand_controller",
        "waist_controller",
    ], lines
    assert all(" 0 rejected" in line and " 0 accepted" not in line for line in lines), lines
    assert "Traceback" not in good.stderr and "exception" not in good.stderr.lower(), good.stderr
    assert reversed_arm.returncode == 1, reversed_arm
    arm = reversed_arm.stdout.splitlines()[0]
    assert (
        arm.startswith("left_arm_controller (left_arm_controller/joint_trajectory): 0 accepted, ")
        and "(names and order)" in arm
    ), arm
