"""Writing rosbag2 (mcap) folders from rclpy messages with ``rosbags``' own CDR serializer.

:class:`BagOutput` takes rclpy message objects (as the node's converters build them) and
translates them field by field into rosbags messages (:func:`to_rosbags`), then serializes them
with rosbags: byte-compatible with rclpy, and unlike ``rclpy.serialization`` it never emits the
bytes rosbags rejects for a JointState with empty fields. The folder appears only when complete.
"""

from __future__ import annotations

import array
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from oxygen_ros.bags.reader import BagError, typestore

__all__ = ["BagOutput", "msgtype_of", "to_rosbags"]

_ARRAY_DTYPES = {
    "d": np.float64,
    "f": np.float32,
    "b": np.int8,
    "B": np.uint8,
    "h": np.int16,
    "H": np.uint16,
    "i": np.int32,
    "I": np.uint32,
    "l": np.int64,
    "L": np.uint64,
    "q": np.int64,
    "Q": np.uint64,
}


def msgtype_of(msg: Any) -> str:
    """``pkg/msg/Name`` of an rclpy message object."""
    pkg = type(msg).__module__.split(".")[0]
    return f"{pkg}/msg/{type(msg).__name__}"


def to_rosbags(msg: Any, typestore: Any) -> Any:
    """Translate an rclpy message into the equivalent rosbags message object (recursively).

    Primitive sequences (``array.array``/lists of numbers) become numpy arrays of the field's
    dtype, as rosbags' serializer expects; strings and nested messages are copied as they are.
    """
    cls = typestore.types[msgtype_of(msg)]
    fields = typestore.fielddefs[msgtype_of(msg)][1]
    kwargs = {}
    for name, (kind, detail) in fields:
        kwargs[name] = _convert(getattr(msg, name), kind, detail, typestore)
    return cls(**kwargs)


def _convert(value: Any, kind: int, detail: Any, ts: Any) -> Any:
    from rosbags.interfaces import Nodetype

    if kind == Nodetype.NAME:
        return to_rosbags(value, ts)
    if kind in (Nodetype.ARRAY, Nodetype.SEQUENCE):
        (sub_kind, sub_detail) = detail[0]
        if sub_kind == Nodetype.NAME:
            return [to_rosbags(v, ts) for v in value]
        if sub_kind == Nodetype.BASE and sub_detail[0] == "string":
            return [str(v) for v in value]
        if isinstance(value, array.array):
            return np.array(value, dtype=_ARRAY_DTYPES[value.typecode])
        if isinstance(value, np.ndarray):
            return value
        if isinstance(value, (bytes, bytearray)):
            return np.frombuffer(bytes(value), dtype=np.uint8).copy()
        return np.array(list(value), dtype=_base_dtype(sub_detail[0]))
    return value


def _base_dtype(name: str) -> Any:
    return {
        "float64": np.float64,
        "float32": np.float32,
        "int8": np.int8,
        "uint8": np.uint8,
        "byte": np.uint8,
        "char": np.uint8,
        "int16": np.int16,
        "uint16": np.uint16,
        "int32": np.int32,
        "uint32": np.uint32,
        "int64": np.int64,
        "uint64": np.uint64,
        "bool": np.bool_,
    }.get(name, np.float64)


# ---------------------------------------------------------------------- writing
class BagOutput:
    """An mcap rosbag2 folder being written; it appears at ``path`` only when :meth:`close` ends.

    Args:
        path: output bag folder.
        overwrite: replace an existing bag folder at ``path`` (never anything else).

    Raises:
        BagError: ``path`` exists and ``overwrite`` is false, or exists and is not a bag folder.
    """

    def __init__(self, path: str | os.PathLike[str], overwrite: bool = False) -> None:
        from rosbags.rosbag2 import StoragePlugin, Writer

        self.path = Path(path)
        if self.path.exists() or self.path.is_symlink():
            if not overwrite:
                raise BagError(f"output bag {self.path} exists; choose another path or overwrite")
            _check_bag_folder(self.path)
        self.ts = typestore()
        self._tmp = self.path.parent / f".{self.path.name}.partial-{os.getpid()}"
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp.mkdir(parents=True)
        self._writer = Writer(self._tmp / self.path.name, version=9, storage_plugin=StoragePlugin.MCAP)
        self._writer.open()
        self._conns: dict[str, Any] = {}
        self.counts: dict[str, int] = {}

    def add_topic(self, topic: str, msgtype: str, reliable: bool = True, depth: int = 10) -> None:
        """Declare ``topic`` of ``msgtype`` (``pkg/msg/Name``) with a keep-last volatile QoS."""
        from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

        if topic in self._conns:
            return
        zero = QosTime(0, 0)
        qos = Qos(
            QosHistory.KEEP_LAST,
            depth,
            QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT,
            QosDurability.VOLATILE,
            zero,
            zero,
            QosLiveliness.AUTOMATIC,
            zero,
            False,
        )
        self._conns[topic] = self._writer.add_connection(topic, msgtype, typestore=self.ts, offered_qos_profiles=[qos])
        self.counts.setdefault(topic, 0)

    def write(self, topic: str, log_ns: int, msg: Any) -> None:
        """Serialize the rclpy message ``msg`` with rosbags and write it at ``log_ns``."""
        if topic not in self._conns:
            self.add_topic(topic, msgtype_of(msg))
        data = self.ts.serialize_cdr(to_rosbags(msg, self.ts), msgtype_of(msg))
        self._writer.write(self._conns[topic], int(log_ns), data)
        self.counts[topic] += 1

    def write_raw(self, topic: str, msgtype: str, log_ns: int, data: bytes) -> None:
        """Write CDR bytes ``data`` of ``msgtype`` (``pkg/msg/Name``) as received (no re-encoding) at
        ``log_ns``."""
        if topic not in self._conns:
            self.add_topic(topic, msgtype)
        self._writer.write(self._conns[topic], int(log_ns), bytes(data))
        self.counts[topic] += 1

    def close(self) -> Path:
        """Finish the bag and move it into place; returns its path."""
        self._writer.close()
        if self.path.exists():
            shutil.rmtree(self.path)
        (self._tmp / self.path.name).rename(self.path)
        self._tmp.rmdir()
        return self.path

    def abort(self) -> None:
        """Discard the partial bag (after an error)."""
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - the partial bag is deleted anyway
            pass
        shutil.rmtree(self._tmp, ignore_errors=True)


def _check_bag_folder(path: Path) -> None:
    ok = (".yaml", ".mcap", ".db3", ".zstd")
    if path.is_dir() and not path.is_symlink():
        foreign = [p.name for p in path.iterdir() if p.is_dir() or not p.name.endswith(ok)]
        if not foreign:
            return
        raise BagError(f"{path} holds non-bag entries {sorted(foreign)[:5]}; not replacing it")
    raise BagError(f"{path} exists and is not a bag folder; not replacing it")
