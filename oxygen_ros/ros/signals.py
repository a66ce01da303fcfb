"""How every long-running ROS process of this package ends on SIGINT / SIGTERM.

rclpy's own signal handlers (``rclpy.init``'s default) shut the context down on a signal, whatever
the main thread is doing: still spinning, or already tearing the node down. Two failures came from
that, both intermittent: on Kilted a take from a subscription the shutdown had destroyed
raised at exit; on Jazzy (rclpy 7.1) the oracle policy died with a segmentation fault inside
``Node.destroy_node`` (the closed-loop report's ``clean_exit`` check failed, exit status -11).

So the processes (``oxygen_node``, ``aloha_sim``, ``scripted_policy``, ``fake_robot``) start rclpy
with :func:`init_without_signal_handlers`: a signal only sets an event; the spin loop sees it
within one ``spin_once`` timeout and leaves, and then the main thread alone tears down, in a fixed
order: executor, node, context (``test/ros/test_signals.py`` stops two of them mid-traffic).
"""

from __future__ import annotations

import signal
import threading

__all__ = ["init_without_signal_handlers"]


def init_without_signal_handlers(args: list[str] | None = None) -> threading.Event:
    """``rclpy.init(args=args)`` on the default context with rclpy's signal handlers left out, and
    SIGINT / SIGTERM handlers that only set the returned event (module doc).

    Call from the main thread (Python installs signal handlers only there). The caller spins
    ``while rclpy.ok() and not stop.is_set(): executor.spin_once(timeout_sec=...)`` and then
    shuts down the executor, destroys its nodes and calls ``rclpy.try_shutdown()``.

    Raises:
        ValueError: not called from the main thread (checked before rclpy is touched).
        RuntimeError: rclpy is already initialised on the default context (``rclpy.init``).
    """
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("signal handlers can only be installed from the main thread")
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.set())
    return stop
