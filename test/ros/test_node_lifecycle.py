"""Lifecycle of the oxygen node (in this process, own Context): configure loads the model and the
KV pool, activate starts the inference thread, deactivate stops it, cleanup frees everything;
invalid parameters fail configure with a message naming them (and an ERROR diagnostic)."""

from __future__ import annotations

import gc
import os
import time
import weakref

os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"

import pytest  # noqa: E402
import rclpy  # noqa: E402
from domain_coordinator import domain_id  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.signals import SignalHandlerOptions  # noqa: E402
from ros_helpers import REPO, RosPeer  # noqa: E402

from oxygen_ros.ros.node import OxygenNode  # noqa: E402
from oxygen_ros.ros.node_status import inference_status  # noqa: E402

pytestmark = pytest.mark.ros
OK, FAIL = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE


@pytest.fixture
def make_node():
    made = []

    def make(*args: str) -> OxygenNode:
        ctx = Context()
        rclpy.init(
            context=ctx,
            domain_id=dom,
            signal_handler_options=SignalHandlerOptions.NO,
            args=["--ros-args", "--params-file", str(REPO / "config" / "oxygen.yaml"), "-p", "model:=pi05-tiny", *args],
        )
        node = OxygenNode(context=ctx)
        made.append((node, ctx))
        return node

    with domain_id() as dom:
        yield make
        for node, ctx in made:
            node.teardown()
            node.destroy_node()
            ctx.try_shutdown()


def test_configure_activate_deactivate_cleanup(make_node):
    node = make_node()
    assert node.engine is None and node.lifecycle_state == "unconfigured"
    assert node.trigger_configure() == OK
    assert node.engine is not None and node.engine.pool.blocks.num_blocks > 0
    assert node.policy.cfg.name == "pi05-tiny"
    assert node.worker is not None and not node.worker.alive
    assert node.trigger_activate() == OK
    assert node.worker.alive and node.inputs.active
    worker = node.worker
    assert node.trigger_deactivate() == OK
    assert not worker.alive and not node.inputs.active
    del worker
    assert node.trigger_activate() == OK and node.worker.alive
    assert node.trigger_deactivate() == OK
    refs = [weakref.ref(node.engine), weakref.ref(node.policy), weakref.ref(node.engine.pool)]
    assert node.trigger_cleanup() == OK
    assert node.engine is None and node.policy is None and node.worker is None
    gc.collect()
    assert all(r() is None for r in refs), "model or KV pool still referenced after cleanup"
    assert node.trigger_configure() == OK  # reconfigure from scratch
    assert node.trigger_shutdown() == OK
    assert node.engine is None


def test_invalid_parameters_fail_configure_with_named_message(make_node):
    node = make_node("-p", "engine.block_size:=0", "-p", "control_period_s:=-0.1")
    assert node.trigger_configure() == FAIL
    assert "engine.block_size" in node.configure_error
    assert "control_period_s" in node.configure_error
    status = inference_status(node, time.monotonic())
    assert status.level[0] == 2 and "engine.block_size" in status.message
    node.set_parameters([Parameter("engine.block_size", value=16), Parameter("control_period_s", value=0.02)])
    assert node.trigger_configure() == OK
    assert node.configure_error == ""
    status = inference_status(node, time.monotonic())
    assert status.level[0] == 1 and "not active (inactive)" in status.message


def test_model_load_errors_fail_configure(make_node):
    node = make_node("-p", "model:=no-such-model")
    assert node.trigger_configure() == FAIL
    assert "no-such-model" in node.configure_error
    node2 = make_node("-p", "model:=pi05-tiny", "-p", "device:=nonsense")
    assert node2.trigger_configure() == FAIL and node2.engine is None


def test_a_destroyed_node_leaves_the_graph_while_the_object_lives():
    """rclpy's LifecycleNode.destroy_node leaves the lifecycle state machine to the garbage collector,
    and with it the node handle: a destroyed node whose Python object was still referenced (a
    reference cycle, a frozen heap) stayed in every peer's graph as a ghost ``/oxygen`` with only
    ``/rosout`` and ``~/transition_event`` -- beside a new node of the same name on the domain."""
    with domain_id() as dom:
        ctx = Context()
        rclpy.init(
            context=ctx,
            domain_id=dom,
            signal_handler_options=SignalHandlerOptions.NO,
            args=["--ros-args", "-p", "model:=pi05-tiny"],
        )
        node = OxygenNode(context=ctx)
        peer = RosPeer(dom, "graph_watch")
        try:
            assert peer.wait_for(lambda: "oxygen" in peer.node.get_node_names(), 20)
            node.teardown()
            node.destroy_node()
            assert peer.wait_for(lambda: "oxygen" not in peer.node.get_node_names(), 10), (
                peer.node.get_publisher_names_and_types_by_node("oxygen", "/")
            )
        finally:
            peer.close()
            ctx.try_shutdown()
        del node
