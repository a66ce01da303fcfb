"""One trajectory per controller, over Fast DDS: the oxygen node process runs config/humanoid.yaml
(pi05-tiny weights) and this process plays the robot — cameras and joint states in, and one fake
ros2_control controller (a subscription) per controller group: the two arms and the waist
(JointTrajectory), the two hands (forward_command: Float64MultiArray per step).

Each controller must get exactly its joints, in its own order; the groups of one chunk carry the
chunk's stamp and time_from_start (time-aligned) and the very values of /action_chunk's columns;
the hands get points of the chunks, six values each; nothing goes to the whole-robot command topic.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from ros_helpers import REPO, RosPeer, SensorFeed, node_process
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

pytestmark = pytest.mark.ros
PROFILE = REPO / "config" / "humanoid.yaml"


def _profile() -> dict:
    return yaml.safe_load(PROFILE.read_text())["/**/oxygen"]["ros__parameters"]


def _stamp(msg) -> int:
    return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec


@pytest.mark.slow
def test_each_controller_gets_its_own_joints_time_aligned(tmp_path: Path):
    prof = _profile()
    joints = tuple(prof["joint_names"])
    groups = {name: prof["controllers"][name] for name in prof["controller_names"]}
    trajectory = {n: g["joints"] for n, g in groups.items() if g.get("type", "joint_trajectory") == "joint_trajectory"}
    forward = {n: g["joints"] for n, g in groups.items() if g.get("type") == "forward_command"}
    assert len(trajectory) == 3 and len(forward) == 2
    cameras = {slot: c["topic"] for slot, c in prof["cameras"].items()}
    with domain_id() as dom:
        peer = RosPeer(dom, "fake_controllers")
        try:
            peer.collect(JointTrajectory, "action_chunk")
            peer.collect(JointState, "joint_command")
            peer.collect(DiagnosticArray, "/diagnostics")
            for name in trajectory:
                peer.collect(JointTrajectory, f"{name}/joint_trajectory")
            for name in forward:
                peer.collect(Float64MultiArray, f"{name}/commands")
            params = {
                "model": "pi05-tiny",
                "num_threads": 1,
                "diagnostics_period_s": 0.25,
                "instruction": "grasp",
            }  # pi05-tiny's 64-token prompt: 27 state tokens + a short task
            with node_process(dom, tmp_path / "node.log", PROFILE, params) as node:
                feed = SensorFeed(peer, cameras, joints, rate_hz=30.0, compressed=True).start()
                try:
                    outs = ["action_chunk"] + [f"{n}/joint_trajectory" for n in trajectory]
                    peer.wait_outputs_matched(outs + [f"{n}/commands" for n in forward], 120)
                    ok = peer.wait_for(
                        lambda: (
                            all(len(peer.messages(t)) >= 6 for t in outs)
                            and all(len(peer.messages(f"{n}/commands")) >= 30 for n in forward)
                        ),
                        120,
                    )
                finally:
                    feed.stop()
                assert node.poll() is None, "node died"
            assert node.returncode == 0
        finally:
            peer.close()
    log = (tmp_path / "node.log").read_text()
    assert ok, f"not every controller was fed; node log:\n{log}"
    chunks = {_stamp(m): m for m in peer.messages("action_chunk")}
    assert all(list(m.joint_names) == list(joints) for m in chunks.values())
    stamps_per_group = []
    for name, names in trajectory.items():
        msgs = peer.messages(f"{name}/joint_trajectory")
        stamps_per_group.append({_stamp(m) for m in msgs})
        cols = [joints.index(j) for j in names]
        for msg in msgs:
            assert list(msg.joint_names) == list(names), name
            whole = chunks.get(_stamp(msg))
            if whole is None:  # its /action_chunk was published after the listener stopped
                continue
            assert len(msg.points) == len(whole.points)
            for p, q in zip(msg.points, whole.points):
                assert p.time_from_start == q.time_from_start
                assert list(p.positions) == [q.positions[c] for c in cols]
                assert not p.velocities and not p.accelerations
    # one chunk -> one trajectory per controller, with the same stamp (time-aligned)
    common = set.intersection(*stamps_per_group)
    assert len(common) >= 5 and common <= set(chunks)
    for name, names in forward.items():
        cols = [joints.index(j) for j in names]
        points = {tuple(p.positions[c] for c in cols) for m in chunks.values() for p in m.points}
        cmds = peer.messages(f"{name}/commands")
        assert all(len(c.data) == len(names) for c in cmds)
        assert sum(tuple(c.data) in points for c in cmds) >= 0.9 * len(cmds)  # the rest: chunks not heard
    assert peer.messages("joint_command") == [], "with controller groups the whole-robot stream is off"
