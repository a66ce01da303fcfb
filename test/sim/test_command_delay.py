"""The sim's added latency (``command_delay_s``, :mod:`oxygen_ros.sim.command_inputs`): a message is
read on arrival and offered to the real :class:`~oxygen_ros.sim.executor.ChunkExecutor` only once
the sim clock is ``delay_s`` past its arrival, in arrival order; the executor then aligns it by its
stamp, skipping the points already past due. The process-level check (through the sim node and
``closed_loop --latency-ms``) is in test_closed_loop.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("rclpy")

from builtin_interfaces.msg import Duration  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint  # noqa: E402

from oxygen_ros.ros.convert import sec_to_stamp  # noqa: E402
from oxygen_ros.sim.command_inputs import CommandInputs  # noqa: E402
from oxygen_ros.sim.executor import ChunkExecutor, ExecState  # noqa: E402
from oxygen_ros.sim.scene import JOINT_NAMES  # noqa: E402

DT = 0.02
T0 = 100.0


def _chunk(stamp: float, base: float, h: int = 50) -> JointTrajectory:
    msg = JointTrajectory()
    msg.header.stamp = sec_to_stamp(stamp)
    msg.joint_names = list(JOINT_NAMES)
    for i in range(h):
        t = (i + 1) * DT
        msg.points.append(
            JointTrajectoryPoint(
                positions=[base + 0.001 * i] * len(JOINT_NAMES),
                time_from_start=Duration(sec=int(t), nanosec=int(round((t % 1) * 1e9))),
            )
        )
    return msg


class _Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def _inputs(delay_s: float) -> tuple[CommandInputs, ChunkExecutor, _Clock]:
    ex = ChunkExecutor(JOINT_NAMES, DT, np.zeros(len(JOINT_NAMES)), max_speed=0.0)
    clock = _Clock()
    return CommandInputs(ex, logging.getLogger("test"), clock, delay_s), ex, clock


def test_a_chunk_waits_the_delay_then_joins_at_the_point_due_now():
    inputs, ex, clock = _inputs(0.3)
    clock.t = T0 + 0.01  # arrives 10 ms after its observation
    inputs.on_trajectory(_chunk(T0, 1.0))
    assert inputs.held == 1 and ex.counts().get("chunks_executed", 0) == 0
    clock.t = T0 + 0.30
    assert inputs.release(clock.t) == 0 and ex.step(clock.t).state is ExecState.WAITING
    clock.t = T0 + 0.31
    assert inputs.release(clock.t) == 1 and inputs.held == 0
    cmd = ex.step(T0 + 0.32)
    assert cmd.state is ExecState.EXECUTING
    assert cmd.positions[0] == pytest.approx(1.0 + 0.001 * 15)  # point 15 is due 0.32 s after the stamp
    assert ex.age_stats()["arrival_latency_p50_ms"] == pytest.approx(310.0)
    assert ex.counts().get("late_points", 0) > 0


def test_messages_are_released_in_arrival_order_and_commands_too():
    inputs, ex, clock = _inputs(0.1)
    inputs.on_trajectory(_chunk(T0, 1.0))
    clock.t = T0 + 0.05
    inputs.on_trajectory(_chunk(T0 + 0.05, 2.0))
    clock.t = T0 + 0.12
    assert inputs.release(clock.t) == 1  # the second one is not due yet
    assert ex.step(clock.t).positions[0] == pytest.approx(1.0 + 0.001 * 5)
    clock.t = T0 + 0.17
    assert inputs.release(clock.t) == 1
    assert ex.step(clock.t).positions[0] == pytest.approx(2.0 + 0.001 * 5)

    inputs, ex, clock = _inputs(0.1)  # the per-step stream goes through the same hold
    msg = JointState(name=list(JOINT_NAMES), position=[0.5] * len(JOINT_NAMES))
    msg.header.stamp = sec_to_stamp(T0)
    inputs.on_command(msg)
    assert inputs.held == 1 and inputs.release(T0 + 0.05) == 0 and inputs.release(T0 + 0.1) == 1


def test_a_malformed_message_is_rejected_when_released_never_raised():
    inputs, ex, clock = _inputs(0.05)
    bad = _chunk(T0, float("nan"))
    inputs.on_trajectory(bad)
    assert inputs.release(T0 + 0.05) == 1
    assert ex.counts().get("non_finite", 0) == 1 and ex.counts().get("chunks_executed", 0) == 0


def test_without_a_delay_the_executor_sees_it_at_once_and_a_negative_delay_is_refused():
    inputs, ex, clock = _inputs(0.0)
    inputs.on_trajectory(_chunk(T0, 1.0))
    assert inputs.held == 0 and ex.age_stats()["arrival_latency_p50_ms"] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="delay_s"):
        _inputs(-0.1)
