"""Shadow mode: the policy runs on the live robot and commands nothing; its chunks are compared
with what the operator commands.

With ``shadow.enabled`` the node publishes each chunk on ``shadow.topic`` only (no ``action_topic``,
no command stream, no controller groups: :class:`~oxygen_ros.ros.outputs.Outputs` creates no
command publisher), and ``/diagnostics`` says ``SHADOW``. With ``shadow.operator_topic`` set it
subscribes to the operator's commands (``sensor_msgs/JointState`` positions by name, or
``trajectory_msgs/JointTrajectory`` — the first point, due at header stamp + its
``time_from_start``) and compares each with the policy's action *for that time*: the point of the
newest chunk covering it (chunk point ``i`` is due at chunk stamp + ``(i + 1)·control_period_s``,
as the trajectory says). The absolute errors of a sliding window go to ``/diagnostics``
(``shadow_*`` keys): overall mean and max, the joint with the largest mean error, per-joint means and maxima,
counts of compared commands, of operator messages dropped (non-finite, lengths that do not match
the names) and of commands no chunk covered yet; operator joints the policy does not command are
listed once. This is the "compare the policy with the operator's teleop before it moves the
robot" step of a first deployment.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from builtin_interfaces.msg import Time
    from rclpy.node import Node
    from rclpy.qos import QoSProfile
    from sensor_msgs.msg import JointState
    from trajectory_msgs.msg import JointTrajectory

__all__ = ["OPERATOR_TYPES", "ShadowComparison", "ShadowConfig", "ShadowMonitor"]

OPERATOR_TYPES = ("joint_state", "joint_trajectory")


@dataclass(frozen=True)
class ShadowConfig:
    """Shadow-mode settings (``shadow.*`` parameters).

    Attributes:
        enabled: compute and publish chunks on ``topic`` only; command nothing.
        topic: where the chunks go in shadow mode (JointTrajectory / Float64MultiArray as on
            ``action_topic``).
        operator_topic: the operator's command topic to compare with ('' = no comparison).
        operator_type: ``joint_state`` or ``joint_trajectory``.
        window_s: the comparison window, seconds of operator commands.
    """

    enabled: bool = False
    topic: str = "shadow/action_chunk"
    operator_topic: str = ""
    operator_type: str = "joint_state"
    window_s: float = 10.0


class ShadowComparison:
    """Policy chunk vs operator commands, by joint name and time (pure numpy, no ROS).

    Args:
        joints: the policy's joint names (the chunk's columns).
        control_period_s: seconds between chunk points (> 0).
        window_s: errors older than this (operator time) are forgotten.
    """

    def __init__(self, joints: Sequence[str], control_period_s: float, window_s: float = 10.0) -> None:
        self.joints = tuple(joints)
        self._col = {j: i for i, j in enumerate(self.joints)}
        self.period, self.window_s = float(control_period_s), float(window_s)
        self._chunk: np.ndarray | None = None  # [H, n]
        self._stamp = 0.0
        self._errors: deque[tuple[float, np.ndarray]] = deque()  # (time, [n] abs error, NaN = not compared)
        self.compared = 0
        self.dropped = 0
        self.uncovered = 0
        self.unknown_joints: set[str] = set()
        self._lock = threading.Lock()  # chunks (inference thread), commands (executor), summary (timer)

    def set_chunk(self, values: np.ndarray, stamp: float) -> None:
        """The newest chunk: ``values`` ``[H, n]`` in ``joints`` order (robot units), ``stamp`` its
        observation time (seconds). Point ``i`` is due at ``stamp + (i + 1) * period``."""
        chunk = np.asarray(values, np.float64)
        with self._lock:
            self._chunk, self._stamp = chunk, float(stamp)

    def add_command(self, names: Sequence[str], positions: Sequence[float], t: float) -> bool:
        """Compare one operator command (``positions`` of ``names`` due at ``t`` seconds) with the
        policy's point for ``t``. Returns True when compared; counts it otherwise (``dropped``: a
        length mismatch, a non-finite value or no joint in common; ``uncovered``: no chunk covers
        ``t``, i.e. before the first chunk, or more than half a period before or after the newest
        chunk's points)."""
        with self._lock:
            return self._add(names, positions, t)

    def _add(self, names: Sequence[str], positions: Sequence[float], t: float) -> bool:
        values = np.asarray(list(positions), np.float64)
        if len(values) != len(names) or not np.isfinite(values).all() or not math.isfinite(t):
            self.dropped += 1
            return False
        cols, vals = [], []
        for name, v in zip(names, values):
            col = self._col.get(name)
            if col is None:
                self.unknown_joints.add(name)
            else:
                cols.append(col)
                vals.append(v)
        if not cols:
            self.dropped += 1
            return False
        if self._chunk is None:
            self.uncovered += 1
            return False
        k = round((t - self._stamp) / self.period) - 1  # the point due nearest t
        if k < 0 or k >= len(self._chunk) or abs(t - (self._stamp + (k + 1) * self.period)) > 0.5 * self.period:
            self.uncovered += 1
            return False
        err = np.full(len(self.joints), np.nan)
        err[cols] = np.abs(self._chunk[k, cols] - np.asarray(vals))
        self._errors.append((t, err))
        while self._errors and self._errors[0][0] < t - self.window_s:
            self._errors.popleft()
        self.compared += 1
        return True

    def summary(self) -> dict[str, object]:
        """``shadow_*`` diagnostics: counts, and over the window the overall mean / max absolute
        error, the worst joint (largest mean) and each joint's mean and max (robot units; -1 when
        nothing was compared; a joint never compared has no per-joint keys)."""
        with self._lock:
            return self._summary()

    def _summary(self) -> dict[str, object]:
        out: dict[str, object] = {
            "shadow_compared": self.compared,
            "shadow_operator_dropped": self.dropped,
            "shadow_not_covered": self.uncovered,
            "shadow_operator_joints_unknown": ",".join(sorted(self.unknown_joints)) or "none",
        }
        if not self._errors:
            out.update(shadow_error_mean=-1, shadow_error_max=-1, shadow_error_worst_joint="none")
            return out
        errs = np.stack([e for _, e in self._errors])  # [N, n]
        seen = ~np.isnan(errs).all(0)
        means, maxes = np.full(len(self.joints), np.nan), np.full(len(self.joints), np.nan)
        means[seen], maxes[seen] = np.nanmean(errs[:, seen], 0), np.nanmax(errs[:, seen], 0)
        worst = int(np.nanargmax(means))
        out.update(
            shadow_error_mean=round(float(np.nanmean(errs)), 6),
            shadow_error_max=round(float(np.nanmax(errs)), 6),
            shadow_error_worst_joint=self.joints[worst],
        )
        out.update({f"shadow_error_mean {j}": round(float(means[i]), 6) for i, j in enumerate(self.joints) if seen[i]})
        out.update({f"shadow_error_max {j}": round(float(maxes[i]), 6) for i, j in enumerate(self.joints) if seen[i]})
        return out


class ShadowMonitor:
    """The operator-topic subscription of shadow mode, feeding a :class:`ShadowComparison`.

    Args:
        node: the rclpy node (subscription created here, destroyed by :meth:`destroy`).
        shadow: the settings (``operator_topic`` non-empty).
        joints: the policy's joint names.
        control_period_s: seconds between chunk points.
        qos: the subscription's QoS profile.
    """

    def __init__(
        self, node: Node, shadow: ShadowConfig, joints: Sequence[str], control_period_s: float, qos: QoSProfile
    ) -> None:
        from sensor_msgs.msg import JointState
        from trajectory_msgs.msg import JointTrajectory

        self._node = node
        self.comparison = ShadowComparison(joints, control_period_s, shadow.window_s)
        msg_type = JointState if shadow.operator_type == "joint_state" else JointTrajectory
        self._sub = node.create_subscription(msg_type, shadow.operator_topic, self._on_command, qos)
        self._clock = node.get_clock()

    def _time(self, stamp: Time) -> float:
        t: float = stamp.sec + stamp.nanosec * 1e-9
        return t if t > 0 else self._clock.now().nanoseconds * 1e-9  # unstamped: received now

    def _on_command(self, msg: JointState | JointTrajectory) -> None:
        if hasattr(msg, "points"):  # JointTrajectory: its first point
            if not msg.points:
                self.comparison.add_command(list(msg.joint_names), [math.nan], math.nan)  # counted as dropped
                return
            p = msg.points[0]
            t = self._time(msg.header.stamp) + p.time_from_start.sec + p.time_from_start.nanosec * 1e-9
            self.comparison.add_command(list(msg.joint_names), list(p.positions), t)
        else:
            self.comparison.add_command(list(msg.name), list(msg.position), self._time(msg.header.stamp))

    def set_chunk(self, values: np.ndarray, stamp: float) -> None:
        """Hand the newest chunk (``[H, n]`` robot units, joints order) to the comparison."""
        self.comparison.set_chunk(values, stamp)

    def destroy(self) -> None:
        """Destroy the subscription."""
        self._node.destroy_subscription(self._sub)
