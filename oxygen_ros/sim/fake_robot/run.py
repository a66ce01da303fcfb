"""``fake_robot``: play the robot of a profile to the ``oxygen`` node and check what it commands.

    fake_robot --params-file config/humanoid.yaml --duration 20

From the same parameter file the node runs with, it publishes ``joint_names`` on
``joint_state_topic`` (``sensor_msgs/JointState``: slow sines around 0, rad) and a synthetic picture
on every ``cameras.<slot>.topic`` (``Image`` rgb8 or ``CompressedImage`` JPEG, as the slot's
``type`` says), stamped now, at ``--rate`` Hz. In place of the robot's controllers it subscribes to
what the node commands: one fake controller per controller group (``controllers.<name>``: a
``JointTrajectory`` or, for ``forward_command``, a ``Float64MultiArray``), or ``action_topic``
when the profile declares no groups. Each fake controller checks every message as ros2_control
would take it — the joint names and their order, the number of values per point, finite values —
counts what it accepted and rejected, and names the first problem. At the end (``--duration`` or
Ctrl-C) it prints one line per controller. ``--operator TOPIC`` also publishes the joint states as
an operator's commands on TOPIC (shadow mode's ``shadow.operator_topic``).

Exit status: 0 every controller received messages and rejected none; 1 a message was rejected, or
a controller received nothing; 2 a bad parameter file or argument.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oxygen_ros.ros.params.node_config import NodeConfig

__all__ = ["ControllerCheck", "build_parser", "main"]


@dataclass
class ControllerCheck:
    """What one fake controller received: messages accepted / rejected and the first problem.

    Attributes:
        name: the controller (``left_arm_controller``; ``action_topic`` without groups).
        topic: its topic.
        joints: the joints it owns, in its order.
        kind: ``joint_trajectory`` or ``forward_command``.
    """

    name: str
    topic: str
    joints: tuple[str, ...]
    kind: str = "joint_trajectory"
    accepted: int = 0
    rejected: int = 0
    problem: str = ""

    def check(self, msg: Any) -> bool:
        """Check one message (JointTrajectory or Float64MultiArray) as the controller would take
        it; count it. Returns True when accepted."""
        why = self._problem(msg)
        if why:
            self.rejected += 1
            self.problem = self.problem or why
            return False
        self.accepted += 1
        return True

    def on_message(self, msg: Any) -> None:
        """Subscription callback: :meth:`check` ``msg``."""
        self.check(msg)

    def _problem(self, msg: Any) -> str:
        n = len(self.joints)
        if self.kind == "forward_command":
            data = list(msg.data)
            if len(data) != n:
                return f"{len(data)} values for {n} joints"
            return "" if all(math.isfinite(v) for v in data) else "a non-finite value"
        if list(msg.joint_names) != list(self.joints):
            return f"joint_names {list(msg.joint_names)} are not {list(self.joints)} (names and order)"
        if not msg.points:
            return "no points"
        for i, p in enumerate(msg.points):
            values = list(p.positions) or list(p.velocities)
            if len(values) != n:
                return f"point {i} has {len(values)} values for {n} joints"
            if not all(math.isfinite(v) for v in values):
                return f"point {i} has a non-finite value"
        return ""

    def line(self) -> str:
        """``name (topic): N accepted, M rejected[: first problem]``."""
        tail = f": {self.problem}" if self.problem else ("" if self.accepted else ": nothing received")
        return f"{self.name} ({self.topic}): {self.accepted} accepted, {self.rejected} rejected{tail}"


def controller_checks(cfg: NodeConfig) -> list[ControllerCheck]:
    """One :class:`ControllerCheck` per controller group of the node configuration ``cfg``, or one
    for ``action_topic`` when it declares none."""
    if cfg.controllers:
        return [ControllerCheck(g.name, g.topic, tuple(g.joints), g.type) for g in cfg.controllers]
    return [ControllerCheck("action_topic", cfg.action_topic, tuple(cfg.joint_names))]


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(
        prog="fake_robot", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--params-file", type=Path, required=True, help="the node's parameter file (the robot profile)")
    p.add_argument(
        "-p", "--param", action="append", default=[], metavar="NAME:=VALUE", help="override, as the node takes"
    )
    p.add_argument("--rate", type=float, default=30.0, help="joint states and camera images per second")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
    p.add_argument("--namespace", default="/", help="the node's namespace (relative topics resolve against it)")
    p.add_argument(
        "--operator",
        default="",
        metavar="TOPIC",
        help="also publish the joint states as an operator's commands (JointState) on TOPIC, e.g. the "
        "node's shadow.operator_topic, for trying shadow mode's comparison",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Console script ``fake_robot``; returns the exit status (module doc)."""
    args = build_parser().parse_args(argv)
    if not args.rate > 0 or (args.duration is not None and not args.duration > 0):
        print("fake_robot: error: --rate and --duration must be > 0", file=sys.stderr)
        return 2

    import numpy as np
    import rclpy
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    from sensor_msgs.msg import CompressedImage, Image, JointState
    from std_msgs.msg import Float64MultiArray
    from trajectory_msgs.msg import JointTrajectory

    from oxygen_ros.ros.convert import rgb_to_compressed_msg, rgb_to_image_msg, sec_to_stamp
    from oxygen_ros.ros.params.node_config import ParamsFileError, load_node_config
    from oxygen_ros.ros.qos import qos_from_name, sensor_data_qos
    from oxygen_ros.ros.signals import init_without_signal_handlers

    try:
        cfg = load_node_config(args.params_file, args.param, namespace=args.namespace)
    except ParamsFileError as exc:
        print(f"fake_robot: error: {exc}", file=sys.stderr)
        return 2
    checks = controller_checks(cfg)
    stop = init_without_signal_handlers()
    node = rclpy.create_node("fake_robot", namespace=args.namespace)
    yy, xx = np.mgrid[0:240, 0:320]
    picture = np.stack([xx % 256, yy % 256, (xx + yy) % 256], -1).astype(np.uint8)  # a gradient, 320x240
    joints = node.create_publisher(JointState, cfg.joint_state_topic, sensor_data_qos())
    operator = node.create_publisher(JointState, args.operator, sensor_data_qos()) if args.operator else None
    cameras = [
        (node.create_publisher(CompressedImage if kind == "compressed" else Image, topic, sensor_data_qos()), kind)
        for topic, kind in cfg.cameras.values()
    ]
    for c in checks:
        if c.kind == "forward_command":
            node.create_subscription(Float64MultiArray, c.topic, c.on_message, qos_from_name(cfg.command_qos))
        else:
            node.create_subscription(JointTrajectory, c.topic, c.on_message, qos_from_name(cfg.action_qos))
    t0 = time.monotonic()

    def tick() -> None:
        now = time.time()
        t = time.monotonic() - t0
        js = JointState(
            name=list(cfg.state_joint_names),
            position=[0.2 * math.sin(0.5 * t + i) for i in range(len(cfg.state_joint_names))],
        )
        js.header.stamp = sec_to_stamp(now)
        joints.publish(js)
        if operator is not None:  # a leader arm: where the robot is now, as the command for now
            operator.publish(js)
        for pub, kind in cameras:
            pub.publish(
                rgb_to_compressed_msg(picture, "jpeg", stamp=now)
                if kind == "compressed"
                else rgb_to_image_msg(picture, "rgb8", stamp=now)
            )

    node.create_timer(1.0 / args.rate, tick)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    print(
        f"fake_robot: publishing {len(cfg.state_joint_names)} joints on {cfg.joint_state_topic} and "
        f"{len(cameras)} camera(s) at {args.rate:g} Hz; checking {', '.join(c.topic for c in checks)}",
        file=sys.stderr,
        flush=True,
    )
    try:
        end = None if args.duration is None else time.monotonic() + args.duration
        while rclpy.ok() and not stop.is_set() and (end is None or time.monotonic() < end):
            executor.spin_once(timeout_sec=0.05)
    except ExternalShutdownException:
        pass
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    for c in checks:
        print(c.line())
    return 0 if all(c.accepted and not c.rejected for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
