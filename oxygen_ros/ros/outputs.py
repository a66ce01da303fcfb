"""Publications of the ``oxygen`` node: action chunks, per-step commands, text, model input.

The action, command and debug-image publishers are lifecycle publishers (silent unless the node is
active). The text topics (``<task>/delta``, ``<task>/text``) are plain publishers, so an ask is
answered in every state in which the node listens: while inactive with a notice that it is
ignored, and on deactivation or shutdown with the end of every utterance in flight. ``publish_*``
methods are called from the inference thread (chunks, text, debug images), the command timer or
an ask callback (notices); none of them raises for bad data — a chunk with the wrong shape or a
non-finite value is refused and reported, so nothing non-finite ever reaches the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from rclpy.lifecycle import LifecycleNode
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.core.action_space import RobotCommand
from oxygen_ros.core.processing import resize_with_pad
from oxygen_ros.core.types import ActionChunk
from oxygen_ros.ros.convert import (
    chunk_to_joint_trajectory,
    command_messages,
    primary_values,
    rgb_to_image_msg,
    sec_to_stamp,
)
from oxygen_ros.ros.diagnostics import ERROR, WARN
from oxygen_ros.ros.params.node_config import NodeConfig
from oxygen_ros.ros.qos import qos_from_name, sensor_data_qos
from oxygen_ros.streams.commands import CommandStream
from oxygen_ros.streams.text import Emit

if TYPE_CHECKING:
    from rclpy.lifecycle import LifecyclePublisher
    from rclpy.publisher import Publisher

__all__ = ["Outputs"]


class Outputs:
    """Creates the node's publishers and publishes onto them.

    Args:
        node: the lifecycle node.
        cfg: the validated configuration.
        slots: model image slots (for the debug model-input topics).
        image_size: model image side in pixels (debug images show the resized, padded input).
        report: ``report(kind, message, level)`` for refused outputs.
        stamp_of: float seconds -> ``builtin_interfaces/Time`` of an output's header (the inputs'
            :class:`~oxygen_ros.ros.convert.stamps.StampBook` gives the input's stamp bit for bit).
        shadow: the shadow-mode comparison with the operator's commands (``shadow.operator_topic``),
            or ``None``; destroyed with the outputs.
    """

    def __init__(
        self,
        node: LifecycleNode,
        cfg: NodeConfig,
        slots: tuple[str, ...],
        image_size: int,
        report: Callable[[str, str, int], None],
        stamp_of: Callable[[float], Any] = sec_to_stamp,
        shadow: Any = None,
    ) -> None:
        self._node, self._cfg, self._report, self._size = node, cfg, report, image_size
        self._pubs = []
        space = cfg.action_space
        # Shadow mode commands nothing: the chunk goes to shadow.topic, and no command publisher
        # (position_action_topic, command stream, controller groups) is created at all.
        self.commanding = not cfg.shadow.enabled
        self.action = self._pub(
            Float64MultiArray if space.kind == "ee_delta" else JointTrajectory,
            cfg.action_topic if self.commanding else cfg.shadow.topic,
            cfg.action_qos,
        )
        self.shadow = shadow  # ros/shadow.py ShadowMonitor (shadow.operator_topic) or None
        self.position_action = None
        if self.commanding and space.kind == "velocity" and space.absolute_joints:
            self.position_action = self._pub(JointTrajectory, cfg.position_action_topic, cfg.action_qos)
        self._command_field = "velocity" if space.kind == "velocity" else "position"
        self._command_names: tuple[str, ...] = ()
        self.deltas: dict[str, Publisher[String]] = {}
        self.texts: dict[str, Publisher[String]] = {}
        self._text_pubs = []  # plain publishers (see the module doc)
        for task, topics in cfg.task_topics.items():
            for book, topic in ((self.deltas, topics.delta), (self.texts, topics.text)):
                book[task] = node.create_publisher(String, topic, qos_from_name(cfg.text_qos))
                self._text_pubs.append(book[task])
        self.command_stream = CommandStream(cfg.control_period_s, cfg.command_max_hold_s)
        self.stamp_of = stamp_of
        self.command: LifecyclePublisher[Any] | None = None
        if self.commanding and cfg.action_rate_hz > 0 and not cfg.controllers:
            cmd_type = JointState if cfg.command_type == "joint_state" else Float64MultiArray
            self.command = self._pub(cmd_type, cfg.command_topic, cfg.command_qos)
        # ros2_control controller groups (params/controllers.py): (group, publisher)
        self.trajectory_groups, self.forward_groups = [], []
        for g in cfg.controllers if self.commanding else ():
            if g.type == "joint_trajectory":
                self.trajectory_groups.append((g, self._pub(JointTrajectory, g.topic, cfg.action_qos)))
            else:
                self.forward_groups.append((g, self._pub(Float64MultiArray, g.topic, cfg.command_qos)))
        self.model_input = {}
        if cfg.debug_model_input:
            for slot in slots:
                self.model_input[slot] = node.create_lifecycle_publisher(
                    Image, f"~/model_input/{slot}", sensor_data_qos()
                )
                self._pubs.append(self.model_input[slot])
        self.chunks = 0
        self.commands = 0

    def _pub(self, msg_type: type[Any], topic: str, qos: str) -> LifecyclePublisher[Any]:
        pub: LifecyclePublisher[Any] = self._node.create_lifecycle_publisher(msg_type, topic, qos_from_name(qos))
        self._pubs.append(pub)
        return pub

    def reconfigure(self, cfg: NodeConfig) -> None:
        """Take the node's live parameters: ``command_max_hold_s`` of the command stream."""
        self._cfg = cfg
        self.command_stream.max_hold_s = cfg.command_max_hold_s

    def subscribers(self) -> dict[str, int]:
        """``subscribers <topic>`` -> subscriptions matched by that output's publisher (writer
        side: what a reliable message published now reaches), for ``/diagnostics``."""
        return {f"subscribers {p.topic_name}": p.get_subscription_count() for p in self._pubs + self._text_pubs}

    def destroy(self) -> None:
        """Destroy every publisher (and the shadow comparison's subscription)."""
        if self.shadow is not None:
            self.shadow.destroy()
            self.shadow = None
        for pub in self._pubs:
            self._node.destroy_lifecycle_publisher(pub)
        for text_pub in self._text_pubs:
            self._node.destroy_publisher(text_pub)
        self._pubs.clear()
        self._text_pubs.clear()

    # ------------------------------------------------------------------ inference thread
    def publish_chunk(self, chunk: ActionChunk, cmd: RobotCommand) -> bool:
        """Publish a chunk's robot command (stamp = observation stamp): positions or velocities
        JointTrajectory on ``action_topic`` (the position joints of a velocity space on
        ``position_action_topic``), end-effector commands as Float64MultiArray; and hand the
        ``action_topic`` values to the command stream. Returns False (and reports) when refused."""
        try:
            main, positions = command_messages(
                cmd, self.stamp_of(chunk.stamp), self._cfg.control_period_s, self._cfg.frame_id
            )
        except ValueError as exc:
            self._report("action_refused", f"action chunk of frame {chunk.frame_id} not published: {exc}", ERROR)
            return False
        group_msgs = []
        if self.trajectory_groups:
            # Checked (shape, finite) by command_messages above; one stamp for every group.
            stamp, column = main.header.stamp, {j: i for i, j in enumerate(cmd.position_joints)}
            group_msgs = [
                (
                    pub,
                    chunk_to_joint_trajectory(
                        cmd.positions[:, [column[j] for j in g.joints]],
                        g.joints,
                        stamp,
                        self._cfg.control_period_s,
                        self._cfg.frame_id,
                    ),
                )
                for g, pub in self.trajectory_groups
            ]
        self.action.publish(main)
        if positions is not None and self.position_action is not None:
            self.position_action.publish(positions)
        for pub, msg in group_msgs:
            pub.publish(msg)
        self.chunks += 1
        if self.shadow is not None and cmd.ee is None:
            names, values, _ = primary_values(cmd)
            if names == self.shadow.comparison.joints:
                self.shadow.set_chunk(values, chunk.stamp)
        if self.command is not None or self.forward_groups:
            names, values, _ = primary_values(cmd)
            self._command_names = names
            self.command_stream.set_chunk(values, chunk.stamp)
        return True

    def publish_text(self, task: str, emits: list[Emit]) -> None:
        """Publish a task's deltas / finished texts in order (empty deltas are skipped)."""
        for e in emits:
            if e.kind == "delta" and not e.text:
                continue
            pub = self.deltas[task] if e.kind == "delta" else self.texts[task]
            pub.publish(String(data=e.text))

    def publish_model_input(self, images: dict[str, np.ndarray | None], stamp: float) -> None:
        """Publish each present slot as the model sees it (resized with padding, rgb8)."""
        for slot, img in images.items():
            pub = self.model_input.get(slot)
            if pub is None or img is None:
                continue
            x = resize_with_pad(img, self._size, name=slot)  # [-1, 1]
            rgb = np.clip(np.rint((x + 1.0) * 127.5), 0, 255).astype(np.uint8)
            pub.publish(rgb_to_image_msg(rgb, "rgb8", stamp=stamp, frame_id=slot))

    # ------------------------------------------------------------------ command timer
    def publish_command(self, now: float) -> bool:
        """One command tick at ``now`` (node clock, seconds): the whole-robot command on
        ``command_topic``, or with controller groups one Float64MultiArray per ``forward_command``
        group (its joints, in its order). Returns True if a command went out."""
        if self.command is None and not self.forward_groups:
            return False
        sample = self.command_stream.sample(now)
        if sample.positions is None:
            if sample.reason == "chunk expired":
                self._report(
                    "command_expired",
                    "per-step commands paused: the newest chunk has expired (no new chunk in time)",
                    WARN,
                )
            return False
        if self.forward_groups:
            column = {j: i for i, j in enumerate(self._command_names)}
            for g, pub in self.forward_groups:
                pub.publish(Float64MultiArray(data=[float(sample.positions[column[j]]) for j in g.joints]))
            self.commands += 1
            return True
        header_stamp = sec_to_stamp(now)
        if self._cfg.command_type == "joint_state":
            msg = JointState(name=list(self._command_names))
            setattr(msg, self._command_field, sample.positions.tolist())  # velocities never as positions
            msg.header.stamp, msg.header.frame_id = header_stamp, self._cfg.frame_id
        else:
            msg = Float64MultiArray(data=sample.positions.tolist())
        assert self.command is not None  # no forward groups (returned above): the command publisher
        self.command.publish(msg)
        self.commands += 1
        return True
