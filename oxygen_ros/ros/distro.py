"""What differs between the ROS 2 distributions this package runs on, handled by feature, never by
version number.

Tested on ROS 2 Kilted (rclpy 9.1) and Jazzy (rclpy 7.1, the LTS release of JetPack 7 / Jetson
Thor): ``make test`` and ``make test ROS_DISTRO=jazzy`` (docs/development.md). Differences found:

- **Nodes outlive their context on Jazzy.** Kilted's ``Context.shutdown`` destroys the nodes
  created in it (``Context.track_node``); Jazzy's leaves them, and with them their DDS endpoints,
  alive until ``Node.destroy_node``. A closed helper node on Jazzy kept its subscriptions in the
  graph: publishers of a later run on the same domain saw a reliable subscriber that no longer
  read anything (rclpy's "requesting incompatible QoS" warning). :func:`close_context` destroys
  the nodes explicitly, which is harmless where the context already did.
- **The C++ events executor** is ``rclpy.experimental.EventsExecutor`` on both (backported to
  Jazzy 7.1); :func:`events_executor` returns it where the module has it, else None.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rclpy.executors import Executor

__all__ = ["close_context", "events_executor"]


def close_context(
    context: Any,
    nodes: Iterable[Any] = (),
    executor: Any | None = None,
    thread: threading.Thread | None = None,
    timeout_s: float = 5.0,
) -> None:
    """Shut down a private rclpy ``Context`` spun by ``thread`` and destroy ``nodes``.

    Order: the context first (a spin loop ``while context.ok()`` ends), then the spin thread is
    joined (``timeout_s``), the executor shut down, and every node destroyed — on Jazzy this is what
    removes the node's publishers and subscriptions from the ROS graph (module doc). Safe to call
    when the context is already shut down or a node already destroyed.
    """
    context.try_shutdown()
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout_s)
    if executor is not None:
        executor.shutdown(timeout_s)  # bounded: never hang a closing tool on a stuck callback
    for node in nodes:
        node.destroy_node()


def events_executor() -> Callable[..., Executor] | None:
    """rclpy's C++ ``EventsExecutor`` class where this rclpy has it (Jazzy 7.1 and Kilted), else None."""
    try:
        from rclpy.experimental import EventsExecutor
    except ImportError:
        return None
    return EventsExecutor
