"""The ``oxygen`` command's own rclpy node: short-lived, in a private ``Context``, spun by the
command's thread while it waits for a condition (a node in the graph, a service, a matched
publisher, an answer), always with a deadline.

Only APIs present in rclpy 7.1 (Jazzy) and 9.1 (Kilted) are used; the context is closed with
:func:`oxygen_ros.ros.distro.close_context`, so on Jazzy too the node's endpoints leave the graph.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import rclpy
from lifecycle_msgs.srv import GetState
from rcl_interfaces.msg import ParameterDescriptor, ParameterType, ParameterValue
from rcl_interfaces.srv import DescribeParameters, GetParameters
from rclpy.client import Client
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from oxygen_ros.ros.distro import close_context

__all__ = [
    "DISCOVERY_S",
    "NODE_DISCOVERY_S",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "Peer",
    "from_parameter_value",
    "resolve_topic",
    "split_node_name",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Longest wait for the target node to appear in the ROS graph (bounded further by ``--timeout``).
DISCOVERY_S = 20.0
#: Longest wait for the target node to appear in the graph, seconds (localhost discovery takes
#: well under a second; a missing node should say so at once, not after the verb's timeout).
NODE_DISCOVERY_S = 5.0
#: After a service is seen, time for discovery to match its response path to this client, seconds.
SETTLE_S = 0.2
#: An idempotent request not answered in this long is sent again (a lost response), seconds.
RESEND_S = 3.0
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CliError(Exception):
    """A failure reported as one line on stderr; ``code`` is the exit status (1: the operation
    failed or timed out, 2: usage error, node or service not found)."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def split_node_name(name: str) -> tuple[str, str]:
    """``/robot/oxygen`` -> ``('/robot', 'oxygen')``; ``oxygen`` -> ``('/', 'oxygen')`` (a name
    without a leading ``/`` is taken from the root namespace).

    Raises:
        CliError: (code 2) not a valid ROS node name.
    """
    tokens = name.strip().strip("/").split("/")
    if not all(_TOKEN.fullmatch(t) for t in tokens):
        raise CliError(f"--node {name!r}: not a ROS node name (e.g. oxygen or /robot/oxygen)", EXIT_USAGE)
    return "/" + "/".join(tokens[:-1]), tokens[-1]


def resolve_topic(topic: str, namespace: str, fqn: str) -> str:
    """A topic name as the node with namespace ``namespace`` and full name ``fqn`` resolves it:
    absolute names stay, ``~/x`` is ``<fqn>/x``, relative names are under the namespace."""
    if topic.startswith("/"):
        return topic
    if topic.startswith("~"):
        return fqn + "/" + topic[1:].lstrip("/")
    return namespace.rstrip("/") + "/" + topic


def from_parameter_value(value: ParameterValue) -> Any:
    """The Python value of an ``rcl_interfaces/ParameterValue`` (None when not set)."""
    t = value.type
    fields = {
        ParameterType.PARAMETER_BOOL: "bool_value",
        ParameterType.PARAMETER_INTEGER: "integer_value",
        ParameterType.PARAMETER_DOUBLE: "double_value",
        ParameterType.PARAMETER_STRING: "string_value",
        ParameterType.PARAMETER_BYTE_ARRAY: "byte_array_value",
        ParameterType.PARAMETER_BOOL_ARRAY: "bool_array_value",
        ParameterType.PARAMETER_INTEGER_ARRAY: "integer_array_value",
        ParameterType.PARAMETER_DOUBLE_ARRAY: "double_array_value",
        ParameterType.PARAMETER_STRING_ARRAY: "string_array_value",
    }
    if t not in fields:
        return None
    got = getattr(value, fields[t])
    if t == ParameterType.PARAMETER_BYTE_ARRAY:
        return [b[0] if isinstance(b, bytes) else int(b) for b in got]
    return list(got) if t > ParameterType.PARAMETER_STRING else got


class Peer:
    """The command's node, talking to the ``oxygen`` node named ``node`` (``oxygen``,
    ``/robot/oxygen``). Use as a context manager; every wait is bounded by ``timeout`` seconds
    unless a call gives its own; finding the node by ``discovery_s`` (default
    ``min(timeout, NODE_DISCOVERY_S)``).

    Raises:
        CliError: (code 2) invalid node name, or rclpy cannot start (environment).
    """

    def __init__(self, node: str, timeout: float, discovery_s: float | None = None) -> None:
        self.namespace, self.name = split_node_name(node)
        self.fqn = self.namespace.rstrip("/") + "/" + self.name
        self.timeout = timeout
        self.discovery_s = min(timeout, NODE_DISCOVERY_S) if discovery_s is None else discovery_s
        self.context = Context()
        try:
            rclpy.init(args=[], context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        except Exception as exc:  # e.g. ROS_DOMAIN_ID not a number: rcl refuses to start
            raise CliError(f"cannot start rclpy: {exc}", EXIT_USAGE) from exc
        self.node = rclpy.create_node(
            f"oxygen_cli_{os.getpid()}", context=self.context, start_parameter_services=False, enable_rosout=False
        )
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut the context down and destroy the node (its endpoints leave the graph)."""
        close_context(self.context, [self.node], self.executor)

    # ------------------------------------------------------------------ waiting
    def spin_until(self, pred: Callable[[], Any], timeout: float | None = None) -> bool:
        """Run callbacks until ``pred()`` is truthy (True) or ``timeout`` seconds pass (False)."""
        end = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not pred():
            left = end - time.monotonic()
            if left <= 0:
                return bool(pred())
            self.executor.spin_once(timeout_sec=min(0.05, left))
        return True

    def spin_for(self, seconds: float | None, stop: Callable[[], bool] = lambda: False) -> None:
        """Run callbacks for ``seconds`` (forever when None) or until ``stop()``."""
        end = None if seconds is None else time.monotonic() + seconds
        while not stop():
            left = 0.05 if end is None else min(0.05, end - time.monotonic())
            if left <= 0:
                return
            self.executor.spin_once(timeout_sec=left)

    def find_node(self) -> None:
        """Wait (at most ``discovery_s``) until the target node is in the graph.

        Raises:
            CliError: (code 2) ``node /oxygen not found within 5 s; is it running? (ROS_DOMAIN_ID=…)``,
                naming nodes of the same name in other namespaces.
        """
        want = (self.name, self.namespace)
        if self.spin_until(lambda: want in self.node.get_node_names_and_namespaces(), self.discovery_s):
            return
        env = f"ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', '') or '0 (unset)'}"
        if os.environ.get("ROS_AUTOMATIC_DISCOVERY_RANGE"):
            env += f", ROS_AUTOMATIC_DISCOVERY_RANGE={os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE']}"
        others = sorted(
            f"{ns.rstrip('/')}/{n}" for n, ns in self.node.get_node_names_and_namespaces() if n == self.name
        )
        hint = f"; nodes of that name: {', '.join(others)}" if others else ""
        raise CliError(
            f"node {self.fqn} not found within {self.discovery_s:g} s; is it running? ({env}){hint}", EXIT_USAGE
        )

    # ------------------------------------------------------------------ services
    def call(
        self, srv_type: Any, suffix: str, request: Any, timeout: float | None = None, idempotent: bool = True
    ) -> Any:
        """Call the node's service ``<fqn>/<suffix>`` and return the response.

        A new client's request can be answered before the server has matched the client's response
        reader (DDS discovers the two directions separately), and that response is lost. So the
        client first gives discovery :data:`SETTLE_S`, and an ``idempotent`` request (a query, a
        parameter set) is sent again every :data:`RESEND_S` until answered.

        Raises:
            CliError: the service is not offered within the timeout (code 2) or does not answer
                (code 1).
        """
        name = f"{self.fqn}/{suffix}"
        client: Client[Any, Any] = self.node.create_client(srv_type, name)
        try:
            wait = self.timeout if timeout is None else timeout
            end = time.monotonic() + wait
            if not self.spin_until(client.service_is_ready, min(wait, DISCOVERY_S)):
                raise CliError(f"service {name} not available (is {self.fqn} an oxygen node?)", EXIT_USAGE)
            self.spin_for(SETTLE_S)
            while True:
                future = client.call_async(request)
                left = end - time.monotonic()
                if self.spin_until(future.done, min(left, RESEND_S) if idempotent else left):
                    return future.result()
                if not idempotent or time.monotonic() >= end:
                    raise CliError(f"no answer from {name} within {wait:g} s")
        finally:
            self.node.destroy_client(client)

    def parameters(self, names: Sequence[str]) -> dict[str, Any]:
        """The node's values of ``names`` (None for a name not declared or without value).

        Raises:
            CliError: see :meth:`call`.
        """
        values = self.call(GetParameters, "get_parameters", GetParameters.Request(names=list(names))).values
        if len(values) == len(names):  # rclpy answers nothing at all when one name is not set
            return {n: from_parameter_value(v) for n, v in zip(names, values)}
        if len(names) <= 1:
            return {n: None for n in names}
        half = len(names) // 2  # find the unset ones by bisection
        return {**self.parameters(names[:half]), **self.parameters(names[half:])}

    def descriptors(self, names: Sequence[str]) -> dict[str, ParameterDescriptor | None]:
        """The node's descriptors of ``names`` (None for an undeclared name)."""
        got = self.call(
            DescribeParameters, "describe_parameters", DescribeParameters.Request(names=list(names))
        ).descriptors
        if len(got) == len(names):  # again nothing at all when one name is not declared
            return dict(zip(names, got))
        if len(names) <= 1:
            return {n: None for n in names}
        half = len(names) // 2
        return {**self.descriptors(names[:half]), **self.descriptors(names[half:])}

    def lifecycle_state(self) -> str:
        """The node's lifecycle state label (``active``, ``inactive``, …).

        Raises:
            CliError: see :meth:`call`.
        """
        label: str = self.call(GetState, "get_state", GetState.Request()).current_state.label
        return label
