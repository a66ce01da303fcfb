"""The scripted oracle policy as a ROS 2 node (console script ``scripted_policy``, node
``scripted_policy``): the sim's scripted pick-and-lift, published as action chunks through the same
path as the oxygen node.

It stands in for the oxygen node: one ``trajectory_msgs/JointTrajectory`` chunk on ``action_topic``
per image of ``camera_topic`` (the oxygen node makes one frame per new image), the 14 ALOHA joint
names, ``horizon`` points ``control_period_s`` apart (point ``i`` at ``(i + 1) * control_period_s``
after the stamp), ``header.stamp`` = the image stamp (the observation time), published as soon as
the image arrives (an added latency is the sim's ``command_delay_s``, the same for every policy).
No chunk before a joint state has arrived (like the oxygen node, which needs the state for an
observation).

An oracle: it knows the cube placement from the sim's ``seed`` (see
:class:`~oxygen_ros.sim.task.oracle.OracleScript`); script time 0 = the first observation of the
episode. Resets: it follows the ``resets`` counter of the sim's ``aloha_sim: executor`` status on
``/diagnostics`` (the sim publishes it at once on a reset): a new count plans the episode of seed
``seed + resets`` and drops chunks of observations stamped before the reset.

Run: ``scripted_policy --ros-args -p seed:=0``.
"""

from __future__ import annotations

import sys
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import CompressedImage, Image, JointState
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.ros.convert.trajectory import chunk_to_joint_trajectory
from oxygen_ros.ros.params.files import check_node_arguments
from oxygen_ros.ros.qos import reliable_qos, sensor_data_qos
from oxygen_ros.ros.signals import init_without_signal_handlers
from oxygen_ros.sim.params import STATUS_NAME
from oxygen_ros.sim.scene import JOINT_NAMES
from oxygen_ros.sim.task.oracle import OracleScript

__all__ = ["ScriptedPolicyNode", "main"]

NODE_NAME = "scripted_policy"


def _sec(stamp: Any) -> float:
    return float(stamp.sec + stamp.nanosec * 1e-9)


class ScriptedPolicyNode(Node):
    """The oracle policy (module doc)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        d = self.declare_parameter
        self.seed = int(d("seed", 0).value)
        horizon = int(d("horizon", 50).value)
        self.period_s = float(d("control_period_s", 0.02).value)
        camera_topic = str(d("camera_topic", "cam_high/image_raw/compressed").value)
        raw = str(d("camera_type", "compressed").value) == "raw"
        if horizon < 1 or not 0 < self.period_s <= 1:
            raise ValueError(f"horizon {horizon} / control_period_s {self.period_s} out of range")
        self.oracle = OracleScript(self.seed, horizon, self.period_s)
        self._have_state = False
        self._min_stamp = -1.0  # observations at or before a reset are dropped
        self.published = 0
        self.pub = self.create_publisher(JointTrajectory, str(d("action_topic", "action_chunk").value), reliable_qos())
        self.create_subscription(Image if raw else CompressedImage, camera_topic, self._on_image, sensor_data_qos())
        self.create_subscription(
            JointState, str(d("joint_state_topic", "joint_states").value), self._on_state, sensor_data_qos()
        )
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, reliable_qos(10))
        self.get_logger().info(
            f"scripted oracle policy: seed {self.seed}, {horizon} points every "
            f"{self.period_s * 1e3:g} ms, one chunk per image of {camera_topic}"
        )

    def _on_state(self, _msg: JointState) -> None:
        self._have_state = True

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for st in msg.status:
            if st.name != STATUS_NAME:
                continue
            values = {kv.key: kv.value for kv in st.values}
            try:
                resets = int(values.get("resets", "0"))
            except ValueError:
                continue
            if resets > self.oracle.resets:
                self.oracle.new_episode(resets)
                self._min_stamp = _sec(msg.header.stamp)
                self.get_logger().info(f"sim reset #{resets}: new episode, cube seed {self.oracle.seed}")

    def _on_image(self, msg: Any) -> None:
        t = _sec(msg.header.stamp)
        if not self._have_state or t <= self._min_stamp:
            return
        rows = self.oracle.chunk(t)
        traj = chunk_to_joint_trajectory(rows, JOINT_NAMES, msg.header.stamp, self.period_s)
        self.pub.publish(traj)
        self.published += 1


def main(args: list[str] | None = None) -> int:
    """Console script ``scripted_policy``: run until SIGINT or SIGTERM (exit 0; 2 for bad
    parameters). A signal ends the spin loop, then executor, node and context are torn down in that
    order (:mod:`oxygen_ros.ros.signals`)."""
    check_node_arguments("scripted_policy", __doc__.split("\n\n")[0], args)  # --help; a non-ROS argument: exit 2
    stop = init_without_signal_handlers(args)
    try:
        node = ScriptedPolicyNode()
    except ValueError as exc:
        rclpy.logging.get_logger(NODE_NAME).error(str(exc))
        rclpy.try_shutdown()
        return 2
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        while rclpy.ok() and not stop.is_set():
            executor.spin_once(timeout_sec=0.1)
    except ExternalShutdownException:
        pass
    finally:
        executor.shutdown()
        node.destroy_node()
        node.oracle.close()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
