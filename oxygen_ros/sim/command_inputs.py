"""The sim node's command inputs: action chunks or per-step commands handed to the executor.

Never raises on input: malformed messages become rejected verdicts, logged once per kind and
counted by the executor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.ros.convert import stamp_to_sec
from oxygen_ros.ros.diagnostics import OK, WARN, log_at
from oxygen_ros.sim.executor import ChunkExecutor, Verdict
from oxygen_ros.sim.scene import JOINT_NAMES

__all__ = ["CommandInputs"]


class CommandInputs:
    """Subscription callbacks of the sim node; ``now()`` gives the sim clock (epoch seconds)."""

    def __init__(self, executor: ChunkExecutor, logger: Any, now: Callable[[], float]) -> None:
        self.executor = executor
        self.logger = logger
        self.now = now
        self._warned: set[str] = set()

    def warn_once(self, kind: str, message: str, level: int = WARN) -> None:
        """Log ``message`` the first time ``kind`` happens (then the executor only counts it);
        ``level`` is a problem level (``WARN``, ``ERROR``), logged from one call site per severity."""
        if kind in self._warned:
            return
        self._warned.add(kind)
        log_at(self.logger, level, f"{kind}: {message} (further ones are only counted)")

    def _verdict(self, verdict: Verdict, what: str, stamp: float) -> None:
        if verdict is Verdict.ACCEPTED or verdict is Verdict.WRONG_SOURCE:
            return
        if verdict.rejected:
            self.warn_once(
                verdict.value,
                f"{what} stamped {stamp:.3f} rejected "
                f"({verdict.value}); expected the {len(JOINT_NAMES)} joints "
                f"{list(JOINT_NAMES)} with finite positions and increasing times",
            )
        elif verdict is Verdict.STALE:
            self.warn_once("stale", f"{what} stamped {stamp:.3f} is older than the last reset; dropped", OK)
        else:
            self.warn_once(
                verdict.value, f"{what} stamped {stamp:.3f} dropped ({verdict.value}) at sim time {self.now():.3f}"
            )

    def _stamp(self, msg: Any, now: float) -> float:
        stamp = stamp_to_sec(msg.header.stamp)
        if stamp == 0.0:
            self.warn_once("zero_stamp", "input without header stamp: using the receive time")
            return now
        return stamp

    def on_trajectory(self, msg: JointTrajectory) -> None:
        now = self.now()
        stamp = self._stamp(msg, now)
        try:
            tfs = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in msg.points]
            rows = [p.positions for p in msg.points]
        except Exception:  # never crash on input
            tfs, rows = [], []
        verdict = self.executor.offer_trajectory(msg.joint_names, stamp, tfs, rows, now)
        self._verdict(verdict, "action chunk", stamp)

    def on_command(self, msg: JointState) -> None:
        now = self.now()
        stamp = self._stamp(msg, now)
        verdict = self.executor.offer_command(msg.name, stamp, msg.position, now)
        self._verdict(verdict, "joint command", stamp)

    def on_command_array(self, msg: Float64MultiArray) -> None:
        now = self.now()
        verdict = self.executor.offer_command(None, now, msg.data, now)
        self._verdict(verdict, "joint command", now)
