"""The sim node's publishers: joint states (+ /clock), executed commands, cameras, diagnostics."""

from __future__ import annotations

from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CompressedImage, Image, JointState

from oxygen_ros.ros.convert import rgb_to_compressed_msg, rgb_to_image_msg, sec_to_stamp
from oxygen_ros.ros.qos import qos_from_name, reliable_qos
from oxygen_ros.sim.executor import Command
from oxygen_ros.sim.scene import JOINT_NAMES

__all__ = ["SimPublishers"]


class SimPublishers:
    """Creates the sim node's publishers from its parameters ``p`` and publishes its outputs.

    Stamps are simulation-clock seconds since the epoch.
    """

    def __init__(self, node: Node, p: dict[str, Any], cameras: tuple[str, ...], topics: tuple[str, ...]) -> None:
        self.p = p
        self.joint = node.create_publisher(JointState, p["joint_state_topic"], qos_from_name(p["joint_state_qos"]))
        self.executed = node.create_publisher(JointState, "~/executed_command", reliable_qos(50))
        cam_type = CompressedImage if p["image_format"] in ("jpeg", "png") else Image
        self.cameras = {
            c: node.create_publisher(cam_type, t, qos_from_name(p["camera_qos"]))
            for c, t in zip(cameras, topics, strict=True)
        }
        self.clock = None
        if p["publish_clock"]:
            self.clock = node.create_publisher(
                Clock, "/clock", QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
            )
        self.diagnostics = node.create_publisher(DiagnosticArray, "/diagnostics", 10)

    def state(self, t: float, position: np.ndarray, velocity: np.ndarray) -> None:
        """Publish the joint state (rad / gripper units, and their rates) at ``t``; /clock too."""
        stamp = sec_to_stamp(t)
        msg = JointState(name=list(JOINT_NAMES), position=position.tolist(), velocity=velocity.tolist())
        msg.header.stamp, msg.header.frame_id = stamp, self.p["frame_id"]
        self.joint.publish(msg)
        if self.clock is not None:
            self.clock.publish(Clock(clock=stamp))

    def executed_command(self, t: float, cmd: Command) -> None:
        """Publish what was applied at ``t``; ``frame_id`` carries the executor state."""
        msg = JointState(name=list(JOINT_NAMES), position=cmd.positions.tolist())
        msg.header.stamp, msg.header.frame_id = sec_to_stamp(t), cmd.state.value
        self.executed.publish(msg)

    def images(self, stamp: float, images: dict[str, np.ndarray]) -> None:
        """Publish each camera's uint8 ``[H, W, 3]`` RGB frame in the configured format."""
        fmt = self.p["image_format"]
        for cam, rgb in images.items():
            if fmt in ("jpeg", "png"):
                msg = rgb_to_compressed_msg(rgb, fmt, self.p["jpeg_quality"], stamp, cam)
            else:
                msg = rgb_to_image_msg(rgb, fmt, stamp, cam)
            self.cameras[cam].publish(msg)

    def status(self, status: DiagnosticStatus, t: float) -> None:
        """Publish one status on /diagnostics stamped ``t``."""
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = sec_to_stamp(t)
        self.diagnostics.publish(msg)
