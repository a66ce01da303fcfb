"""Sphinx directive ``oxygen-params``: tables of the ``oxygen`` node's parameters, read from the code.

The node declares its parameters from :func:`oxygen_ros.ros.params.node_config.node_specs` (node level and
``engine.*``, the latter generated from ``EngineConfig``), :func:`oxygen_ros.ros.params.specs.task_specs`
(``tasks.<name>.*``, from ``TaskConfig``) and ``ACTION_SPACE_LISTS``; the tables are built from the
same lists, so they cannot drift from what ``ros2 param describe`` says. One argument picks the group:

- ``node``: the node-level parameters (names without a dot);
- ``cameras``, ``engine``, ``action_space``, ``shadow``: the parameters under that prefix;
- ``tasks``: the per-task parameters, as ``tasks.<name>.*``.

The ``live`` column says whether a configured node applies a new value at once (``yes``) or
refuses it until the next configure (``configure``), from :func:`oxygen_ros.ros.params.live.is_live`;
``start-up`` marks a read-only parameter, whose start-up value is the only one it ever takes.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

GROUPS = ("node", "cameras", "engine", "rtc", "action_space", "shadow", "tasks")


def _rows(group: str) -> list[tuple[str, str, str, str, str]]:
    from oxygen_ros.ros.params.live import is_live
    from oxygen_ros.ros.params.node_config import ACTION_SPACE_LISTS, node_specs
    from oxygen_ros.ros.params.specs import task_specs

    if group == "tasks":
        specs = [(s, s.name.replace("tasks._name_.", "tasks.<name>.", 1)) for s in task_specs("_name_")]
    elif group == "node":
        specs = [(s, s.name) for s in node_specs() if "." not in s.name]
    else:
        specs = [(s, s.name) for s in node_specs() if s.name.startswith(group + ".")]
    rows = []
    for spec, name in specs:
        text = spec.description
        if spec.choices:
            text += " One of: " + ", ".join(repr(c) for c in spec.choices) + "."
        if spec.lo is not None or spec.hi is not None:
            lo = "" if spec.lo is None else f"{spec.lo:g} ≤ "
            hi = "" if spec.hi is None else f" ≤ {spec.hi:g}"
            text += f" Range: {lo}value{hi}."
        default = "required" if spec.default is None else repr(spec.default)
        if group == "tasks":
            default = default.replace("_name_", "<name>")
        live = (
            "start-up"
            if spec.read_only
            else "yes"
            if is_live(spec.name.replace("_name_", "conversation"))
            else "configure"
        )
        rows.append((name, spec.ptype.name.lower(), default, live, text))
    if group == "action_space":
        rows += [(f"action_space.{k}", "string_array", "unset", "configure", v) for k, v in ACTION_SPACE_LISTS.items()]
    return rows


class OxygenParams(SphinxDirective):
    """``oxygen-params GROUP``: a table of one parameter group (see the module docstring)."""

    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        group = self.arguments[0]
        if group not in GROUPS:
            raise self.error(f"oxygen-params: unknown group {group!r}; one of {', '.join(GROUPS)}")
        table = nodes.table(classes=["oxygen-params"])
        tgroup = nodes.tgroup(cols=5)
        table += tgroup
        for width in (22, 9, 13, 8, 48):
            tgroup += nodes.colspec(colwidth=width)
        head = nodes.thead()
        tgroup += head
        head += self._row(("parameter", "type", "default", "live", "description"), literal=False)
        body = nodes.tbody()
        tgroup += body
        for row in _rows(group):
            body += self._row(row, literal=True)
        return [table]

    @staticmethod
    def _row(cells: tuple[str, ...], literal: bool) -> nodes.row:
        row = nodes.row()
        for i, text in enumerate(cells):
            entry = nodes.entry()
            para = nodes.paragraph()
            para += nodes.literal(text=text) if literal and i in (0, 2) else nodes.Text(text)
            entry += para
            row += entry
        return row


def setup(app):
    app.add_directive("oxygen-params", OxygenParams)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
