"""The Kilted/Jazzy differences of :mod:`oxygen_ros.ros.distro`, each checked on the distro the
test runs on (``make test`` is Kilted, ``make test ROS_DISTRO=jazzy`` is Jazzy)."""

from __future__ import annotations

import sys
import threading
import time

import pytest
import rclpy
from domain_coordinator import domain_id
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import JointState

from oxygen_ros.ros.distro import close_context, events_executor
from oxygen_ros.ros.node import make_executor
from oxygen_ros.ros.qos import reliable_qos

pytestmark = pytest.mark.ros


def _context(dom: int) -> Context:
    ctx = Context()
    rclpy.init(context=ctx, domain_id=dom, signal_handler_options=SignalHandlerOptions.NO)
    return ctx


def _subscribers(node, topic: str, want: list[str], timeout_s: float = 10.0) -> list[str]:
    end = time.monotonic() + timeout_s
    while True:
        names = [i.node_name for i in node.get_subscriptions_info_by_topic(topic)]
        if names == want or time.monotonic() > end:
            return names
        time.sleep(0.05)


def test_a_closed_context_leaves_no_endpoint_in_the_graph() -> None:
    """Jazzy's Context.shutdown leaves the node (and its subscription) alive; close_context must
    not. Without the explicit destroy_node this fails on Jazzy and passes on Kilted."""
    with domain_id() as dom:
        observer_ctx = _context(dom)
        observer = rclpy.create_node("observer", context=observer_ctx)
        try:
            ctx = _context(dom)
            node = rclpy.create_node("closing", context=ctx)
            node.create_subscription(JointState, "joint_states", lambda m: None, reliable_qos())
            executor = SingleThreadedExecutor(context=ctx)
            executor.add_node(node)

            def spin() -> None:
                while ctx.ok():
                    try:
                        executor.spin_once(timeout_sec=0.05)
                    except Exception:
                        if ctx.ok():
                            raise

            thread = threading.Thread(target=spin, daemon=True)
            thread.start()
            assert _subscribers(observer, "/joint_states", ["closing"]) == ["closing"]
            close_context(ctx, [node], executor, thread)
            assert not thread.is_alive()
            assert _subscribers(observer, "/joint_states", []) == []
            close_context(ctx, [node], executor)  # twice is harmless
        finally:
            close_context(observer_ctx, [observer])


def test_events_executor_where_rclpy_has_it_else_the_single_threaded_one(monkeypatch) -> None:
    assert events_executor() is not None  # both pinned distros (Kilted 9.1, Jazzy 7.1) have it
    ctx = _context(0)
    try:
        ex, kind = make_executor(ctx)
        assert kind == "EventsExecutor" and not isinstance(ex, SingleThreadedExecutor)
        ex.shutdown()
        monkeypatch.setitem(sys.modules, "rclpy.experimental", None)  # an rclpy without the module
        assert events_executor() is None
        ex, kind = make_executor(ctx)
        assert kind == "SingleThreadedExecutor" and isinstance(ex, SingleThreadedExecutor)
        ex.shutdown()
    finally:
        ctx.try_shutdown()
