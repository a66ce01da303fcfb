"""Parameter files named on the command line, checked before any node starts.

A node started with ``--params-file`` naming a missing file only logs a warning and then fails
*configure* for whatever parameter the file would have given (``joint_names is not set``); the
launch files call :func:`check_params_file` first, so a misspelled path stops ``ros2 launch`` at
once with the path and the files the package ships. Plain Python (the launch process imports it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ['check_params_file']


def check_params_file(argument: str, path: str, shipped: Callable[[], Path]) -> str:
    """Return ``path`` if it is a file; else raise naming the launch ``argument``, the path (and the
    folder a relative one was resolved in) and the ``*.yaml`` files in the folder ``shipped()``
    returns (asked only then).

    Raises:
        FileNotFoundError: ``path`` does not exist or is a folder.
    """
    if os.path.isfile(path):
        return path
    why = 'is a folder, not a parameter file' if os.path.isdir(path) else 'does not exist'
    where = '' if os.path.isabs(path) else f' (relative to {os.getcwd()})'
    folder = shipped()
    names = ', '.join(sorted(p.name for p in folder.glob('*.yaml')))
    raise FileNotFoundError(f"{argument}:={path}: {why}{where}; the package's own are in {folder}: {names}")
