"""Parameter files named on the command line, checked before any node starts; and a node's own
command line (:func:`check_node_arguments`).

A node started with ``--params-file`` naming a missing file only logs a warning and then fails
*configure* for whatever parameter the file would have given (``joint_names is not set``); the
launch files call :func:`check_params_file` first, so a misspelled path stops ``ros2 launch`` at
once with the path and the files the package ships. Plain Python (the launch process imports it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["check_node_arguments", "check_params_file", "split_ros_arguments"]

_ROS_ARGS_HELP = """ROS arguments (after --ros-args, as for every ROS 2 node):
  --params-file FILE        parameters from a YAML file (ros__parameters)
  -p NAME:=VALUE            one parameter
  -r FROM:=TO               remap a name (-r __ns:=/robot, -r __node:=NAME)
  --log-level LEVEL         debug, info, warn, error, fatal"""


def check_params_file(argument: str, path: str, shipped: Callable[[], Path]) -> str:
    """Return ``path`` if it is a file; else raise naming the launch ``argument``, the path (and the
    folder a relative one was resolved in) and the ``*.yaml`` files in the folder ``shipped()``
    returns (asked only then).

    Raises:
        FileNotFoundError: ``path`` does not exist or is a folder.
    """
    if os.path.isfile(path):
        return path
    why = "is a folder, not a parameter file" if os.path.isdir(path) else "does not exist"
    where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
    folder = shipped()
    names = ", ".join(sorted(p.name for p in folder.glob("*.yaml")))
    raise FileNotFoundError(f"{argument}:={path}: {why}{where}; the package's own are in {folder}: {names}")


def split_ros_arguments(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """``args`` (without the program name) split as rcl splits them: (the ROS arguments — each
    ``--ros-args`` section up to its closing ``--`` or the end, markers included —, the others)."""
    ros: list[str] = []
    other: list[str] = []
    inside = False
    for a in args:
        if a == "--ros-args":
            inside = True
        if inside:
            ros.append(a)
            inside = a != "--"
        else:
            other.append(a)
    return ros, other


def check_node_arguments(prog: str, description: str, args: Sequence[str] | None = None) -> None:
    """Check a ROS node's command line before anything else runs: ``-h``/``--help`` prints the
    usage, ``description`` and the ROS arguments and exits 0; an argument outside ``--ros-args``
    (which rclpy would ignore silently) is refused, exit 2 naming it. ``args``: as ``rclpy.init``
    takes them, the program name first (default: ``sys.argv``). Plain Python: it answers before
    rclpy starts and before the model loads.

    Raises:
        SystemExit: 0 after the help, 2 for an argument that is not a ROS argument.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=_ROS_ARGS_HELP,
        usage=f"{prog} [-h] [--ros-args ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _, other = split_ros_arguments((sys.argv if args is None else args)[1:])
    parser.parse_args(other)
