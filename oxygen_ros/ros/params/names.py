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

__all__ = ['IGNORED_PREFIXES', 'suggest', 'unknown_names', 'unknown_parameters']

#: Override prefixes rclpy reads itself, outside the declared parameters (publisher/subscription
#: QoS overrides, read when an entity with ``qos_overriding_options`` is created).
IGNORED_PREFIXES = ('qos_overrides.',)


def suggest(name: str, declared: Iterable[str]) -> str | None:
    """The declared name closest to ``name`` (difflib ratio ≥ 0.6, a missing or extra unit suffix
    such as ``_s`` included), or None."""
    declared = sorted(declared)
    got = difflib.get_close_matches(name, declared, n=1, cutoff=0.6)
    return got[0] if got else None


def unknown_names(given: Iterable[str], declared: Iterable[str], tasks: Iterable[str] = ()) -> list[str]:
    """One message per name in ``given`` that is not ``declared``, sorted, each with a suggestion
    (``tasks``: the node's ``task_names``, for ``tasks.<name>.*`` of a task that is not listed).

    Example: ``unknown parameter engine.tokens_per_fram (did you mean engine.tokens_per_frame?)``.
    """
    declared = set(declared)
    tasks = list(tasks)
    problems = []
    for name in sorted(set(given) - declared):
        if name.startswith(IGNORED_PREFIXES):
            continue
        parts = name.split('.')
        if len(parts) >= 3 and parts[0] == 'tasks' and parts[1] not in tasks:
            close = suggest(parts[1], tasks)
            why = f'task {parts[1]!r} is not in task_names {tasks}: add it there to configure it'
            problems.append(f'unknown parameter {name} ({why}' + (f', or did you mean {close}?)' if close else ')'))
            continue
        hint = suggest(name, declared)
        problems.append(f'unknown parameter {name}' + (f' (did you mean {hint}?)' if hint else ''))
    return problems


def unknown_parameters(node: Node, tasks: Iterable[str] = ()) -> list[str]:
    """:func:`unknown_names` of ``node``'s overrides (the parameter files and ``-p`` values
    addressed to it) against the names it has declared so far — call it after every declaration."""
    overrides = getattr(node, '_parameter_overrides', None) or {}  # rclpy has no public accessor
    declared = node.list_parameters([], 0).names
    return unknown_names(overrides, declared, tasks)
