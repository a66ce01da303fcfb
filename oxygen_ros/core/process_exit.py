"""End an rclpy command-line process with its own exit status once its work is done.

After a command has shut its rclpy context down and destroyed its node, all that is left for the
interpreter's own teardown is the middleware's native threads and handles; that teardown can hang
or die with SIGSEGV (the rclpy shutdown races reported in ros2/rclpy issues 178 and 937), which
turns a command that printed its result into one that never exits or exits -11 with its buffered
stdout lost. :func:`run_then_exit` runs a console script's ``main``, flushes stdout/stderr and ends
the process with ``main``'s status without that teardown (``os._exit``). Only for processes whose
``main`` closes everything it opened itself (files, bags, the rclpy context) before it returns.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["flush_std_streams", "exit_now", "run_then_exit"]


def flush_std_streams() -> None:
    """Flush ``sys.stdout`` and ``sys.stderr``; a closed pipe or stream is skipped (nothing more can
    be written to it anyway)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def exit_now(code: int) -> NoReturn:
    """End the process at once with exit status ``code``, its output flushed first; no atexit
    handler, finalizer or interpreter teardown runs."""
    flush_std_streams()
    os._exit(code)


def run_then_exit(main: Callable[[], int]) -> NoReturn:
    """Run ``main()`` (a console script's body, returning its exit status) and end the process with
    that status via :func:`exit_now`. An exception or ``SystemExit`` from ``main`` propagates as
    usual (argparse's ``--help`` and bad flags raise before any rclpy state exists)."""
    exit_now(main())
