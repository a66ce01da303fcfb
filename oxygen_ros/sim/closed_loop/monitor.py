"""The closed-loop script's ROS listener: chunks, executed commands, joint states, text and
diagnostics of the sim and oxygen nodes, collected in a background thread; optionally the top
camera's frames, handed decoded to a callback (the episode video)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["LoopMonitor"]


class LoopMonitor:
    """A ROS participant (own Context) watching the loop: chunks, text, diagnostics, commands.

    Args:
        domain_id: ROS domain of the loop.
        ask_topic: where :meth:`ask` publishes (the oxygen node's conversation ask topic).
        delta_topic / text_topic: the conversation task's outputs.
        action_topic: the chunk topic.
        oxygen_status: name of the oxygen node's inference status on ``/diagnostics``.
        camera_topic / on_frame: with both, every ``CompressedImage`` on ``camera_topic`` is
            decoded to RGB and passed to ``on_frame(stamp_s, rgb)`` in the monitor's thread (outside
            its lock: the callback may query the monitor); an undecodable frame is counted in
            ``bad_frames``.
    """

    def __init__(
        self,
        domain_id: int,
        ask_topic: str = "ask",
        delta_topic: str = "conversation/delta",
        text_topic: str = "conversation/text",
        action_topic: str = "action_chunk",
        oxygen_status: str = "oxygen: inference",
        camera_topic: str | None = None,
        on_frame: Callable[[float, np.ndarray], None] | None = None,
    ) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.signals import SignalHandlerOptions
        from sensor_msgs.msg import JointState
        from std_msgs.msg import String
        from trajectory_msgs.msg import JointTrajectory

        from oxygen_ros.ros.qos import reliable_qos, sensor_data_qos, text_qos

        self._String = String
        self._oxygen_status = oxygen_status
        self._answer_topics = tuple("/" + t.lstrip("/") for t in (delta_topic, text_topic))
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node("closed_loop_monitor", context=self.context)
        self._lock = threading.Lock()
        self.chunks: list[tuple[float, float]] = []  # (wall receive, stamp)
        self.deltas: list[tuple[float, str]] = []
        self.texts: list[tuple[float, str]] = []
        self.diags: dict[str, list[tuple[float, dict[str, str], int, str]]] = {}
        self.executed: list[tuple[float, str, np.ndarray]] = []  # (stamp, state, positions)
        self.joint_first: np.ndarray | None = None
        self.joint_max_dev = 0.0
        self.frames = 0
        self.bad_frames = 0
        self._on_frame = on_frame
        n = self.node
        if camera_topic and on_frame is not None:
            from sensor_msgs.msg import CompressedImage

            n.create_subscription(CompressedImage, camera_topic, self._on_image, sensor_data_qos(5))
        n.create_subscription(JointTrajectory, action_topic, self._on_chunk, reliable_qos(100))
        n.create_subscription(String, delta_topic, lambda m: self._text(self.deltas, m), text_qos())
        n.create_subscription(String, text_topic, lambda m: self._text(self.texts, m), text_qos())
        n.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, reliable_qos(50))
        n.create_subscription(JointState, "aloha_sim/executed_command", self._on_executed, reliable_qos(500))
        n.create_subscription(JointState, "joint_states", self._on_joints, sensor_data_qos(10))
        self.ask_pub = n.create_publisher(String, ask_topic, reliable_qos())
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(n)
        self._thread = threading.Thread(target=self._spin, name="loop-monitor", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while self.context.ok():
            try:
                self._executor.spin_once(timeout_sec=0.05)
            except Exception:
                if not self.context.ok():
                    return
                raise

    # callbacks
    def _on_chunk(self, msg: Any) -> None:
        with self._lock:
            stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
            self.chunks.append((time.monotonic(), stamp))

    def _text(self, sink: list[tuple[float, str]], msg: Any) -> None:
        with self._lock:
            sink.append((time.monotonic(), msg.data))

    def _on_diag(self, msg: Any) -> None:
        now = time.monotonic()
        with self._lock:
            for st in msg.status:
                values = {kv.key: kv.value for kv in st.values}
                self.diags.setdefault(st.name, []).append((now, values, st.level[0], st.message))

    def _on_image(self, msg: Any) -> None:
        from oxygen_ros.ros.convert.images import ImageConversionError, compressed_to_rgb

        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        try:
            rgb = compressed_to_rgb(msg)
        except ImageConversionError:
            with self._lock:
                self.bad_frames += 1
            return
        with self._lock:
            self.frames += 1
        if self._on_frame is not None:
            self._on_frame(stamp, rgb)

    def _on_executed(self, msg: Any) -> None:
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        with self._lock:
            self.executed.append((stamp, msg.header.frame_id, np.asarray(msg.position, dtype=float)))

    def _on_joints(self, msg: Any) -> None:
        q = np.asarray(msg.position, dtype=float)
        with self._lock:
            if self.joint_first is None:
                self.joint_first = q
            elif q.shape == self.joint_first.shape:
                self.joint_max_dev = max(self.joint_max_dev, float(np.max(np.abs(q - self.joint_first))))

    # queries
    def n_chunks(self) -> int:
        with self._lock:
            return len(self.chunks)

    def last_diag(self, name: str) -> dict[str, str]:
        """Key/values of the newest status ``name`` (empty when none yet)."""
        with self._lock:
            items = self.diags.get(name, [])
            return dict(items[-1][1]) if items else {}

    def diag_history(self, name: str) -> list[tuple[float, dict[str, str], int, str]]:
        with self._lock:
            return list(self.diags.get(name, []))

    def n_diags(self, name: str) -> int:
        with self._lock:
            return len(self.diags.get(name, []))

    def text_messages(self) -> list[str]:
        """The finished utterances (and notices) on the text topic so far, in arrival order."""
        with self._lock:
            return [t for _, t in self.texts]

    def latest_text(self) -> str:
        """The utterance streaming now (its deltas since the last finished text), else the last
        finished text ("" when none)."""
        with self._lock:
            t_last = self.texts[-1][0] if self.texts else -1.0
            live = "".join(d for t, d in self.deltas if t > t_last)
            return live or (self.texts[-1][1] if self.texts else "")

    def ask(self, text: str) -> bool:
        """Publish an ask once the answer cannot be lost on the way: the oxygen node's ask
        subscription has matched this publisher, and its ``/diagnostics`` show its publishers of
        the delta and text topics matched (writer side: reliable messages published from then on
        reach this monitor). Returns whether it was sent (call again later when not)."""
        if self.ask_pub.get_subscription_count() == 0:
            return False
        diag = self.last_diag(self._oxygen_status)
        matched = [
            int(v) >= 1 for k, v in diag.items() if k.startswith("subscribers ") and k.endswith(self._answer_topics)
        ]
        if len(matched) < len(self._answer_topics) or not all(matched):
            return False
        self.ask_pub.publish(self._String(data=text))
        return True

    def close(self) -> None:
        from oxygen_ros.ros.distro import close_context

        close_context(self.context, [self.node], self._executor, self._thread)
