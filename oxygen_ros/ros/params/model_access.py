"""Who may choose the checkpoint the ``oxygen`` node loads: ``model_locked`` and ``model_folders``.

By ROS 2's default trust model any participant on the DDS domain may call the node's lifecycle and
parameter services, so without these two parameters it could run *deactivate, cleanup, set model,
configure, activate* and make the node drive the robot from a folder of its choice.

- ``model_locked`` (default true): decided once, at start-up, from the launch-time value (parameter
  file, ``-p``, launch argument). While true, ``model`` is declared with a read-only
  ``ParameterDescriptor``, so rclpy refuses every later change — remote (``ros2 param set``,
  ``oxygen params set``) and local alike — before any callback of the node runs.
- ``model_folders`` (default ``['/']``: anywhere): a checkpoint folder loads only when its real
  path (``~`` expanded, symlinks and ``..`` resolved) lies inside the real path of one of these
  folders; anything else fails *configure* naming both parameters. Preset names (random weights)
  are not paths and always pass; a folder of the same name wins over the preset, as in the loader,
  and is then checked like any folder.

Both are read-only themselves: a remote peer can neither unlock the model nor widen the folders.
Plain Python and rclpy; no torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rclpy.exceptions import ParameterUninitializedException
from rclpy.node import Node
from rclpy.parameter import Parameter

from oxygen_ros.core.config import PRESETS
from oxygen_ros.ros.params.specs import ParamSpec, declare

__all__ = [
    "ANYWHERE",
    "FOLDERS",
    "LOCK",
    "access_specs",
    "check_model_access",
    "confine_model",
    "declare_lock",
    "with_model_lock",
]

LOCK, FOLDERS = "model_locked", "model_folders"
#: Default of ``model_folders``: every folder (the launch-time value is the operator's choice).
ANYWHERE: tuple[str, ...] = ("/",)


def access_specs() -> list[ParamSpec]:
    """The two access parameters (read-only: set at start-up only)."""
    return [
        ParamSpec(
            LOCK,
            Parameter.Type.BOOL,
            True,
            "Read-only. True: model is read-only, fixed by its "
            "start-up value (parameter file, -p, launch argument); nothing can change it while the node "
            "runs. False: model may be set remotely (ros2 param set, oxygen params set) while "
            "unconfigured; model_folders still confines it.",
            read_only=True,
        ),
        ParamSpec(
            FOLDERS,
            Parameter.Type.STRING_ARRAY,
            list(ANYWHERE),
            "Read-only. Absolute folders a "
            "checkpoint may be loaded from: the real path of model (symlinks and .. resolved) must lie "
            "inside one of them, else configure fails. ['/'] = anywhere; preset names always pass.",
            read_only=True,
        ),
    ]


def declare_lock(node: Node) -> bool:
    """Declare the access parameters (their start-up values) and return whether ``model`` must be
    declared read-only: anything but an explicit ``false`` locks it (a mistyped value is reported
    at configure, and meanwhile the node fails safe)."""
    declare(node, access_specs())
    try:
        return node.get_parameter(LOCK).value is not False
    except ParameterUninitializedException:
        return True


def with_model_lock(node: Node, specs: list[ParamSpec]) -> list[ParamSpec]:
    """Declare the access parameters (:func:`declare_lock`) and return ``specs`` with ``model``
    read-only when it is locked, ready for :func:`~oxygen_ros.ros.params.specs.declare`."""
    locked = declare_lock(node)
    return [dataclasses.replace(s, read_only=True) if s.name == "model" and locked else s for s in specs]


def _real(path: str) -> Path:
    return Path(os.path.realpath(Path(path).expanduser()))


def confine_model(model: str, folders: Sequence[str]) -> str:
    """Check that checkpoint ``model`` lies inside ``folders`` (the ``model_folders`` parameter).

    Args:
        model: the ``model`` parameter: a checkpoint folder (absolute, relative to the working
            directory, or with ``~``) or a preset name.
        folders: absolute folders; ``['/']`` allows every path.

    Returns:
        ``model`` unchanged when allowed (a preset name, or a path whose real path is one of the
        folders or inside one).

    Raises:
        ValueError: a folder is empty or not absolute, or the real path of ``model`` (symlinks
            and ``..`` resolved) lies outside every folder; the message names ``model``,
            ``model_folders`` and the folders.
    """
    for folder in folders:
        if not folder or not Path(folder).expanduser().is_absolute():
            raise ValueError(f"{FOLDERS}={list(folders)!r}: {folder!r} is not an absolute folder")
    path = Path(model).expanduser()
    if model in PRESETS and not path.is_dir():
        return model
    real = _real(model)
    roots = [_real(f) for f in folders]
    if any(real.is_relative_to(root) for root in roots):  # a folder is inside itself
        return model
    via = "" if str(real) == str(path) else f" (real path {real})"
    moved = [str(r) for f, r in zip(folders, roots) if str(r) != f]
    shown = f" (real paths: {', '.join(str(r) for r in roots)})" if moved else ""
    raise ValueError(
        f"model={model!r}{via} is outside {FOLDERS} {list(folders)!r}{shown}: a checkpoint folder "
        f"must lie inside one of them ({FOLDERS} is read-only: set it at start-up)"
    )


def check_model_access(values: dict[str, Any], problems: list[str]) -> list[str]:
    """Check ``model`` against ``model_folders`` in checked parameter ``values`` (``model_folders``
    becomes a tuple) and append each problem, named, to ``problems``.

    Returns:
        Warnings to log at configure: one when any participant on the domain may make the node
        load any folder (``model_locked`` false and ``model_folders`` left at ``['/']``).
    """
    folders = values.get(FOLDERS)
    if folders is not None:
        values[FOLDERS] = tuple(folders)
        if not folders:
            problems.append(f"{FOLDERS} is empty: list the folders checkpoints may come from, or / for anywhere")
        elif values.get("model"):
            try:
                confine_model(values["model"], folders)
            except ValueError as exc:
                problems.append(str(exc))
    if values.get(LOCK) is False and tuple(values.get(FOLDERS, ANYWHERE)) == ANYWHERE:
        return [
            f"{LOCK} is false and {FOLDERS} is {list(ANYWHERE)}: any participant on this DDS domain can make "
            "the node load a checkpoint from any folder at its next configure (see the Security guide)"
        ]
    return []
