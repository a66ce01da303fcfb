"""``oxygen params list|get|set|describe``: the node's parameters through its rcl_interfaces services.

Values are written and read in one syntax, YAML as ``ros2 param set`` takes it: ``2.0`` is a
double, ``4`` an integer, ``true`` a bool, ``[a, b]`` a string array, anything else a string. ``set``
describes the parameter first and sends what its declared type needs: an integer for a double
parameter goes as a double, any text for a string parameter as that string. A value the parameter
cannot take — another type, an integer beyond 64 bits, a name the node does not declare (``unknown
parameter 'x'; did you mean 'y'?``) — is refused here, in one line with type names, and not sent.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import yaml
from rcl_interfaces.msg import Parameter, ParameterDescriptor, ParameterType, ParameterValue, SetParametersResult
from rcl_interfaces.srv import ListParameters, SetParameters

from oxygen_ros.ros.cli.peer import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, Peer, from_parameter_value
from oxygen_ros.ros.params.names import suggest

__all__ = [
    "INT64_RANGE",
    "TYPE_NAMES",
    "describe",
    "format_value",
    "get",
    "list_names",
    "parse_value",
    "set_values",
    "type_problem",
]

P = ParameterType
#: Parameter type names by ``rcl_interfaces/ParameterType`` number.
TYPE_NAMES = {
    P.PARAMETER_NOT_SET: "not set",
    P.PARAMETER_BOOL: "bool",
    P.PARAMETER_INTEGER: "integer",
    P.PARAMETER_DOUBLE: "double",
    P.PARAMETER_STRING: "string",
    P.PARAMETER_BYTE_ARRAY: "byte array",
    P.PARAMETER_BOOL_ARRAY: "bool array",
    P.PARAMETER_INTEGER_ARRAY: "integer array",
    P.PARAMETER_DOUBLE_ARRAY: "double array",
    P.PARAMETER_STRING_ARRAY: "string array",
}
_ARRAY_ITEM = {
    P.PARAMETER_BOOL_ARRAY: P.PARAMETER_BOOL,
    P.PARAMETER_INTEGER_ARRAY: P.PARAMETER_INTEGER,
    P.PARAMETER_DOUBLE_ARRAY: P.PARAMETER_DOUBLE,
    P.PARAMETER_STRING_ARRAY: P.PARAMETER_STRING,
}
#: What a ROS integer parameter holds (int64), inclusive.
INT64_RANGE = (-(2**63), 2**63 - 1)
#: rclpy's own refusal of a mistyped value names the types by number (``expected '3' got '4'``).
_RCLPY_TYPE_REASON = re.compile(r"[Ww]rong parameter type, expected '(\d+)' got '(\d+)'")


def _a(ptype: int) -> str:
    """``a double``, ``an integer``: a type name with its article."""
    name = TYPE_NAMES.get(ptype, f"type {ptype}")
    return ("an " if name[0] in "aeiou" else "a ") + name


def type_problem(name: str, value: ParameterValue, descriptor: ParameterDescriptor | None) -> str | None:
    """Why the node would refuse ``value`` for parameter ``name`` by its type, in type names
    (``x is a double; got a string 'abc'``), or None (also when the parameter has dynamic typing
    or no declared type)."""
    want = descriptor.type if descriptor is not None and not descriptor.dynamic_typing else P.PARAMETER_NOT_SET
    if want in (P.PARAMETER_NOT_SET, value.type):
        return None
    got = from_parameter_value(value)
    shown = repr(got) if isinstance(got, str) else format_value(got)
    return f"{name} is {_a(want)}; got {_a(value.type)} {shown}"


def format_value(value: Any, _in_list: bool = False) -> str:
    """A value in the syntax :func:`parse_value` reads back (strings quoted only where YAML
    would read them as something else)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v, True) for v in value) + "]"
    text = str(value)
    try:
        plain = (
            yaml.safe_load(f"[{text}]") == [text] if _in_list else yaml.safe_load(text) == text
        ) and text == text.strip()
    except yaml.YAMLError:
        plain = False
    return text if plain and text else json.dumps(text, ensure_ascii=False)


def _scalar(value: Any, ptype: int, text: str | None) -> Any:
    if ptype == P.PARAMETER_STRING and not isinstance(value, str):
        return text if text is not None else format_value(value)
    if ptype == P.PARAMETER_DOUBLE and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def parse_value(text: str, ptype: int = P.PARAMETER_NOT_SET) -> ParameterValue:
    """``text`` (YAML) as a ParameterValue, shaped for a parameter of type ``ptype``
    (``ParameterType``; NOT_SET: as YAML reads it).

    Raises:
        CliError: (code 2) a value no parameter can hold (null, a mapping, a mixed list, ``[]``
            for a parameter of unknown type); (code 1) an integer beyond int64 (:data:`INT64_RANGE`).
    """
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    if ptype == P.PARAMETER_DOUBLE and isinstance(value, str):  # YAML 1.1 reads 1e-3 as text
        try:
            value = float(value)
        except ValueError:
            pass
    value = _scalar(value, ptype, text)
    if isinstance(value, list):
        item = _ARRAY_ITEM.get(ptype, P.PARAMETER_NOT_SET)
        value = [_scalar(v, item, None) for v in value]
    if value is None or isinstance(value, dict):
        raise CliError(f"{text!r}: not a parameter value (give a number, true/false, text or a [list])", EXIT_USAGE)
    big = [
        v
        for v in (value if isinstance(value, list) else [value])
        if isinstance(v, int) and not isinstance(v, bool) and not INT64_RANGE[0] <= v <= INT64_RANGE[1]
    ]
    if big:
        raise CliError(
            f"{big[0]} is beyond the range of a ROS integer parameter (64-bit: {INT64_RANGE[0]} .. {INT64_RANGE[1]})"
        )
    out = ParameterValue()
    kinds = [
        (bool, P.PARAMETER_BOOL, "bool_value"),
        (int, P.PARAMETER_INTEGER, "integer_value"),
        (float, P.PARAMETER_DOUBLE, "double_value"),
        (str, P.PARAMETER_STRING, "string_value"),
    ]
    if not isinstance(value, list):
        for py, t, attr in kinds:
            if isinstance(value, py):
                out.type = t
                setattr(out, attr, value)
                return out
        raise CliError(f"{text!r}: not a parameter value", EXIT_USAGE)
    if not value and ptype not in _ARRAY_ITEM:
        raise CliError(f"{text!r}: the type of an empty list is unknown for this parameter", EXIT_USAGE)
    if (
        value
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        and any(isinstance(v, float) for v in value)
    ):
        value = [float(v) for v in value]
    for py, t, attr in kinds:
        if all(isinstance(v, py) and (py is bool or not isinstance(v, bool)) for v in value) and (
            value or _ARRAY_ITEM.get(ptype) == t
        ):
            out.type = t + 5  # BOOL -> BOOL_ARRAY, ..., STRING -> STRING_ARRAY
            setattr(out, attr.replace("_value", "_array_value"), value)
            return out
    raise CliError(f"{text!r}: list items must all be bools, numbers or strings", EXIT_USAGE)


def list_names(peer: Peer, prefix: str, with_values: bool, write: Callable[[str], None]) -> int:
    """Write the node's parameter names (starting with ``prefix``), sorted, one a line; with
    ``with_values`` as ``name = value`` (``name: not set`` for one without value).

    Returns:
        0, or 1 when no name starts with ``prefix``.
    """
    peer.find_node()
    req = ListParameters.Request(prefixes=[], depth=ListParameters.Request.DEPTH_RECURSIVE)
    names = sorted(n for n in peer.call(ListParameters, "list_parameters", req).result.names if n.startswith(prefix))
    if not names:
        write(f"no parameter of {peer.fqn} starts with {prefix!r}\n")
        return EXIT_FAILED
    if with_values:
        _write_values(names, peer.parameters(names), write)
    else:
        for n in names:
            write(n + "\n")
    return EXIT_OK


def _write_values(names: Sequence[str], values: dict[str, Any], write: Callable[[str], None]) -> None:
    for n in names:
        write(f"{n}: not set\n" if values[n] is None else f"{n} = {format_value(values[n])}\n")


def get(peer: Peer, names: Sequence[str], write: Callable[[str], None]) -> int:
    """Write ``name = value`` per name (``name: not set`` for one undeclared or without value).

    Returns:
        0, or 1 when any name is not set.
    """
    peer.find_node()
    values = peer.parameters(names)
    _write_values(names, values, write)
    return EXIT_FAILED if any(values[n] is None for n in names) else EXIT_OK


def _checked(peer: Peer, name: str, text: str, d: ParameterDescriptor | None) -> ParameterValue | str:
    """The value to send for ``name``, or why it is refused without sending it (one line)."""
    if d is None:  # the closest declared name, as configure names a parameter file's typo
        req = ListParameters.Request(prefixes=[], depth=ListParameters.Request.DEPTH_RECURSIVE)
        close = suggest(name, peer.call(ListParameters, "list_parameters", req).result.names)
        return f"unknown parameter {name!r}" + (
            f"; did you mean {close!r}?" if close else f"; oxygen params list shows the names {peer.fqn} has"
        )
    try:
        value = parse_value(text, d.type)
    except CliError as exc:
        if exc.code == EXIT_USAGE:
            raise CliError(f"{name}: {exc}", exc.code) from None
        return f"{exc}; {name} is {_a(d.type)}" + (f" in {_range(d)}" if _range(d) else "")
    try:
        (name + json.dumps(from_parameter_value(value), ensure_ascii=False)).encode("utf-8")
    except UnicodeEncodeError:
        return f"{name}: the name or value is not valid UTF-8 text"
    return type_problem(name, value, d) or value


def _node_reason(name: str, reason: str) -> str:
    """The node's refusal, with rclpy's type numbers turned into type names."""
    m = _RCLPY_TYPE_REASON.search(reason)
    return f"{name} is {_a(int(m[1]))}; got {_a(int(m[2]))}" if m else reason or "(no reason given)"


def set_values(peer: Peer, pairs: Sequence[tuple[str, str]], write: Callable[[str], None]) -> int:
    """Set each ``(name, YAML text)``; write ``set NAME = VALUE`` for each accepted and
    ``refused NAME: <reason>`` for each refused, in the order given: by the node (its
    SetParametersResult reason), or here, unsent (an undeclared name, another type than the declared
    one, an integer beyond int64; the reason names the types).

    Returns:
        0 when every value was set, 1 when any was refused.

    Raises:
        CliError: (code 2) a value that cannot be a parameter value (null, a mapping, a mixed list).
    """
    peer.find_node()
    names = [n for n, _ in pairs]
    described = peer.descriptors(names)
    checked = [_checked(peer, n, text, described[n]) for n, text in pairs]
    send = [(n, v) for n, v in zip(names, checked) if isinstance(v, ParameterValue)]
    results: Iterator[SetParametersResult] = iter([])
    if send:
        req = SetParameters.Request(parameters=[Parameter(name=n, value=v) for n, v in send])
        results = iter(peer.call(SetParameters, "set_parameters", req).results)
    code = EXIT_OK
    for n, v in zip(names, checked):
        r = next(results, None) if isinstance(v, ParameterValue) else None
        if isinstance(v, ParameterValue) and r is not None and r.successful:
            write(f"set {n} = {format_value(from_parameter_value(v))}\n")
        else:
            reason = v if isinstance(v, str) else _node_reason(n, r.reason if r is not None else "")
            write(f"refused {n}: {reason}\n")
            code = EXIT_FAILED
    return code


def _range(d: ParameterDescriptor) -> str | None:
    for r, plain_step in [(r, 1) for r in d.integer_range] + [(r, 0.0) for r in d.floating_point_range]:
        step = f" (step {format_value(r.step)})" if r.step not in (0, plain_step) else ""
        return f"{format_value(r.from_value)} .. {format_value(r.to_value)}{step}"
    return None


def describe(peer: Peer, names: Sequence[str], write: Callable[[str], None]) -> int:
    """Write, per name, its type, description, range and constraints, and whether it is read-only.

    Returns:
        0, or 1 when any name is not declared.
    """
    peer.find_node()
    got = peer.descriptors(names)
    for n in names:
        d = got[n]
        if d is None:
            write(f"{n}: not declared by {peer.fqn}\n")
            continue
        lines = [n, f"  type: {TYPE_NAMES.get(d.type, str(d.type))}"]
        if d.description:
            lines.append(f"  description: {d.description}")
        if _range(d):
            lines.append(f"  range: {_range(d)}")
        if d.additional_constraints:
            lines.append(f"  constraints: {d.additional_constraints}")
        lines.append(f"  read_only: {format_value(bool(d.read_only))}")
        if d.dynamic_typing:
            lines.append("  dynamic_typing: true")
        write("\n".join(lines) + "\n")
    return EXIT_FAILED if any(got[n] is None for n in names) else EXIT_OK
