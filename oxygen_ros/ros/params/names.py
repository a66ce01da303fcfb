"""Every parameter name given to the node must be one it declares: a typo fails configure.

rclpy keeps the values of a parameter file (and ``-p name:=value``) as *overrides* and applies one
only when the node declares that name; with ``allow_undeclared_parameters`` off (the default) an
override nobody declares is silently unused — ``engine.tokens_per_fram: 4`` would run on the
default. :func:`unknown_parameters` lists those names with the closest declared one, so
:func:`~oxygen_ros.ros.params.node_config.read_node_config` can fail the transition naming them.
Only overrides addressed to this node are seen: rcl matches each file section against the node's
name and namespace (``/**/oxygen``, ``/**``), so another node's section in the same file is not
an error. A ``/**`` section applies to every node, so it may only hold names this node declares
too (``use_sim_time``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from rclpy.node import Node

__all__ = ["IGNORED_PREFIXES", "suggest", "unknown_names", "unknown_parameters"]

#: Override prefixes rclpy reads itself, outside the declared parameters (publisher/subscription
#: QoS overrides, read when an entity with ``qos_overriding_options`` is created).
IGNORED_PREFIXES = ("qos_overrides.",)


def suggest(name: str, declared: Iterable[str]) -> str | None:
    """The declared name closest to ``name`` (difflib ratio ≥ 0.6, a missing or extra unit suffix
    such as ``_s`` included), or None."""
    declared = sorted(declared)
    got = difflib.get_close_matches(name, declared, n=1, cutoff=0.6)
    return got[0] if got else None


def unknown_names(
    given: Iterable[str], declared: Iterable[str], tasks: Iterable[str] = (), task_fields: Iterable[str] = ()
) -> tuple[list[str], list[str]]:
    """Names in ``given`` that are not ``declared``: (errors, notes), each sorted, one message per name.

    An error names a typo with the closest declared name: ``unknown parameter
    engine.tokens_per_fram (did you mean engine.tokens_per_frame?)``. A note is a real task
    field (``task_fields``) of a task that is not in ``tasks`` (``task_names``) — a task turned off
    by narrowing the list over a shared file (``task_names: [conversation]`` over config/oxygen.yaml's
    ``tasks.memory.*``) — unless the task's name is close to a listed one (``tasks.conversaton.*``:
    an error, a typo).
    """
    declared = set(declared)
    tasks, fields = list(tasks), set(task_fields)
    errors, notes = [], []
    for name in sorted(set(given) - declared):
        if name.startswith(IGNORED_PREFIXES):
            continue
        parts = name.split(".")
        if len(parts) == 3 and parts[0] == "tasks" and parts[1] not in tasks:
            close = difflib.get_close_matches(parts[1], tasks, n=1, cutoff=0.8)
            if close:
                errors.append(
                    f"unknown parameter {name} (task {parts[1]!r} is not in task_names {tasks}; "
                    f"did you mean tasks.{close[0]}.{parts[2]}?)"
                )
            elif parts[2] in fields:
                notes.append(f"{name} is not used: task {parts[1]!r} is not in task_names {tasks}")
            else:
                errors.append(
                    f"unknown parameter {name} (task {parts[1]!r} is not in task_names {tasks}, "
                    f"and {parts[2]!r} is not a task parameter)"
                )
            continue
        hint = suggest(name, declared)
        errors.append(f"unknown parameter {name}" + (f" (did you mean {hint}?)" if hint else ""))
    return errors, notes


def unknown_parameters(node: Node, tasks: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """:func:`unknown_names` of ``node``'s overrides (the parameter files and ``-p`` values
    addressed to it) against the names it has declared so far — call it after every declaration."""
    from oxygen_ros.ros.params.specs import task_specs

    overrides = getattr(node, "_parameter_overrides", None) or {}  # rclpy has no public accessor
    declared = node.list_parameters([], 0).names
    fields = [s.name.split(".")[-1] for s in task_specs("_")]
    return unknown_names(overrides, declared, tasks, fields)
