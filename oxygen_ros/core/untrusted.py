"""Reading files a user hands us (a checkpoint folder) as untrusted input.

A checkpoint may come from anywhere, so its side files are parsed defensively: JSON is size- and
depth-limited and type-checked field by field, a file name read from a file must stay inside the
folder, and safetensors files are opened header first. Every malformed file raises
:class:`CheckpointError` naming the file (and the key). Nothing here unpickles or runs code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from safetensors import safe_open


class CheckpointError(ValueError):
    """A checkpoint folder is malformed or does not match the model: the message names the
    offending file and, where there is one, its key(s) or config field(s) (with shapes / dtypes /
    values where relevant). A ``ValueError``: the folder's content is bad, not the program."""


#: Largest JSON side file read (configs, norm stats, processor pipelines, the shard index). Real
#: ones are a few KiB; the index of a sharded full-size checkpoint about 100 KiB.
JSON_MAX_BYTES = 16 * 2**20
#: Deepest nesting of objects / arrays accepted in a JSON side file (real ones: at most 5).
JSON_MAX_DEPTH = 32
_KINDS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "number": (int, float),
    "str": (str,),
    "bool": (bool,),
    "list": (list,),
    "object": (dict,),
}
_ARTICLE = {
    "int": "an int",
    "number": "a finite number",
    "str": "a string",
    "bool": "true or false",
    "list": "a list",
    "object": "an object",
}


def short(value: Any, limit: int = 60) -> str:
    """``value`` for a message, cut to about ``limit`` characters: a string as ``repr``, anything else
    as compact JSON (``repr`` if not JSON)."""
    if isinstance(value, str):
        return repr(value[:limit]) + (f"… ({len(value)} characters)" if len(value) > limit else "")
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        try:
            text = repr(value)
        except (ValueError, RecursionError):  # an int over Python's digit limit, a cycle
            text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


def _json_type(value: Any) -> str:
    names = {
        type(None): "null",
        bool: "a boolean",
        int: "an int",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return names.get(type(value), type(value).__name__)


def _depth(value: Any) -> int:
    """Nesting depth of objects / arrays (a scalar: 0), stopping once past ``JSON_MAX_DEPTH``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d > JSON_MAX_DEPTH:
                break
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def read_json(path: Path, max_bytes: int = JSON_MAX_BYTES) -> dict[str, Any]:
    """Parse a checkpoint JSON file that must hold an object.

    Args:
        path: the file; max_bytes: the largest size accepted (bytes).

    Raises:
        CheckpointError: naming the file: not a regular file (a FIFO or device would block or
            never end), unreadable, larger than ``max_bytes``, not UTF-8 JSON, nested deeper than
            ``JSON_MAX_DEPTH``, or not an object at the top.
    """
    if not path.is_file():
        raise CheckpointError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise CheckpointError(f"{path}: larger than the {max_bytes // 2**20} MiB a checkpoint JSON file may have")
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        if isinstance(e, CheckpointError):
            raise
        what = "nested too deeply" if isinstance(e, RecursionError) else f"{type(e).__name__}: {short(str(e), 200)}"
        raise CheckpointError(f"{path}: not a readable JSON file ({what})") from e
    if _depth(data) > JSON_MAX_DEPTH:
        raise CheckpointError(f"{path}: JSON nested more than {JSON_MAX_DEPTH} levels deep")
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {_json_type(data)}")
    return data


def json_field(
    d: dict[str, Any], key: str, kind: str, where: str, default: Any = None, *, nullable: bool = False
) -> Any:
    """``d[key]`` checked to be of ``kind``, or ``default`` when ``key`` is absent.

    Args:
        d: a parsed JSON object; key: its key; kind: ``int`` (not a boolean), ``number`` (finite
            int or float), ``str``, ``bool``, ``list`` or ``object``; where: the file (and path to
            ``d`` in it) for the message; default: returned when absent; nullable: accept ``null``
            (returned as ``None``).

    Raises:
        CheckpointError: ``{where}: '<key>' must be <kind>, got <type> <value>``.
    """
    if key not in d:
        return default
    v = d[key]
    if v is None and nullable:
        return None
    ok = isinstance(v, _KINDS[kind]) and (kind == "bool" or not isinstance(v, bool))
    if ok and kind == "number":
        try:
            ok = math.isfinite(v)
        except OverflowError:  # an int beyond float range
            ok = False
    if not ok:
        raise CheckpointError(
            f"{where}: {key!r} must be {_ARTICLE[kind]}{' or null' if nullable else ''}, "
            f"got {'null' if v is None else _json_type(v) + ' ' + short(v)}"
        )
    return v


def inside(folder: Path, name: Any, where: str) -> Path:
    """The file ``name`` that ``where`` names, refused unless it lies inside ``folder``.

    Args:
        folder: the checkpoint folder; name: the file name as read from a file (relative to
            ``folder``); where: the file and entry naming it (for the message).

    Returns:
        ``folder / name`` (it resolves, following symlinks, inside ``folder``).

    Raises:
        CheckpointError: ``name`` is not a non-empty relative path string, or it resolves (``..``,
            an absolute path, a symlink) outside ``folder``.
    """
    if not isinstance(name, str) or not name or "\0" in name:
        raise CheckpointError(f"{where}: {short(name)} is not a file name")
    if Path(name).is_absolute():
        raise CheckpointError(
            f"{where}: {name!r} is an absolute path; a checkpoint names only files inside its own folder {folder}"
        )
    try:
        root, target = folder.resolve(), (folder / name).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise CheckpointError(f"{where}: {name!r} cannot be resolved ({e})") from e
    if not target.is_relative_to(root):
        raise CheckpointError(
            f"{where}: {name!r} resolves to {target}, outside the checkpoint folder {root} "
            f"(refused: a checkpoint names only files inside its own folder)"
        )
    return folder / name


@contextmanager
def open_safetensors(path: Path) -> Iterator[Any]:
    """``safetensors.safe_open(path, framework="pt")`` (the header is read and checked, tensors are
    read on demand), with every open error naming the file.

    Raises:
        CheckpointError: the file is missing, truncated, or its header is not a safetensors header.
    """
    try:
        handle = safe_open(str(path), framework="pt")
    except Exception as e:  # SafetensorError, OSError, …: whatever the parser says, name the file
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({type(e).__name__}: {short(str(e), 200)})"
        ) from e
    with handle as f:
        yield f


__all__ = [
    "CheckpointError",
    "JSON_MAX_BYTES",
    "JSON_MAX_DEPTH",
    "short",
    "read_json",
    "json_field",
    "inside",
    "open_safetensors",
]
