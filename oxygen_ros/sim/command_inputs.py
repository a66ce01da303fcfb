"""The sim node's command inputs: action chunks or per-step commands handed to the executor.

Never raises on input: malformed messages become rejected verdicts, logged once per kind and
counted by the executor.

Added latency (``command_delay_s`` > 0): a message is read when it arrives (its stamp, or the
arrival time for a stamp of zero) but offered to the executor only when the sim clock has advanced
``delay_s`` past its arrival, by :meth:`CommandInputs.release` on the simulation thread before each
step. The executor then aligns it by its stamp as any late chunk, so the observation the policy saw
is ``delay_s`` staler than without the delay: a slower policy computer, emulated on the robot's side
for any policy.
"""

from __future__ import annotations

from collections import deque
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

    def __init__(self, executor: ChunkExecutor, logger: Any, now: Callable[[], float], delay_s: float = 0.0) -> None:
        if not delay_s >= 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.executor = executor
        self.logger = logger
        self.now = now
        self.delay_s = float(delay_s)
        self._warned: set[str] = set()
        # (release sim time, offer(now)); appended by the ROS callback thread, popped only by the
        # simulation thread (release): deque's append / popleft are atomic
        self._held: deque[tuple[float, Callable[[float], None]]] = deque()

    def _offer(self, arrival: float, offer: Callable[[float], None]) -> None:
        if self.delay_s <= 0:
            offer(arrival)
        else:
            self._held.append((arrival + self.delay_s, offer))

    def release(self, now: float) -> int:
        """Offer the held messages whose delay is over at sim time ``now`` (epoch seconds), in
        arrival order; call it on the simulation thread before each executor step.

        Returns:
            How many were offered.
        """
        n = 0
        while self._held and self._held[0][0] <= now + 1e-9:
            self._held.popleft()[1](now)
            n += 1
        return n

    @property
    def held(self) -> int:
        """Messages received and not yet offered (added latency)."""
        return len(self._held)

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
        arrival = self.now()
        stamp = self._stamp(msg, arrival)
        try:
            names = list(msg.joint_names)
            tfs = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in msg.points]
            rows = [list(p.positions) for p in msg.points]
        except Exception:  # never crash on input
            names, tfs, rows = [], [], []

        def offer(now: float) -> None:
            self._verdict(self.executor.offer_trajectory(names, stamp, tfs, rows, now), "action chunk", stamp)

        self._offer(arrival, offer)

    def on_command(self, msg: JointState) -> None:
        arrival = self.now()
        stamp = self._stamp(msg, arrival)
        names, positions = list(msg.name), list(msg.position)

        def offer(now: float) -> None:
            self._verdict(self.executor.offer_command(names, stamp, positions, now), "joint command", stamp)

        self._offer(arrival, offer)

    def on_command_array(self, msg: Float64MultiArray) -> None:
        arrival = self.now()
        data = list(msg.data)

        def offer(now: float) -> None:
            self._verdict(self.executor.offer_command(None, arrival, data, now), "joint command", arrival)

        self._offer(arrival, offer)
