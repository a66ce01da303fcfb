"""Reading rosbag2 folders for the replay tools, with the ``rosbags`` library.

Input: :class:`BagInput` opens a rosbag2 folder (mcap or sqlite3, metadata v4–v9) or a bare
``.mcap`` file, lists its topics, and yields raw CDR messages in log-time order. Nothing is read
silently short: a read error mid-file stops the iteration and is kept in ``read_error``, and
:meth:`BagInput.lost` compares the messages actually read with the counts the bag's index claims
(rosbags skips unreadable chunks without an error, so this comparison is what catches them).

Raw bytes are rmw's serialized form (CDR with its 4-byte encapsulation header), exactly what
``ros2 bag play`` publishes and what ``rclpy.serialization.deserialize_message`` reads.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BagError", "BagInput", "TopicInfo", "msg_class", "typestore"]


class BagError(RuntimeError):
    """A bag cannot be used: missing, unreadable, truncated, corrupt, or the wrong kind."""


def typestore() -> Any:
    """The ROS 2 Kilted rosbags typestore (these message types hash identically in Jazzy)."""
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_KILTED)


@dataclass(frozen=True)
class TopicInfo:
    """One topic of a bag: message type (``pkg/msg/Name``), message count the bag's index claims,
    and the recorded publishers' QoS profiles (rosbags ``Qos`` tuples, possibly empty)."""

    topic: str
    msgtype: str
    count: int
    qos: tuple[Any, ...] = ()


@dataclass
class _ReadState:
    counts: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    finished: bool = False


class BagInput:
    """An open input bag (use as a context manager).

    Args:
        path: rosbag2 folder (with ``metadata.yaml``) or a single ``.mcap`` file.

    Raises:
        BagError: the path does not exist, is empty, truncated or corrupt (the message says which
            and how to recover), is a ROS 1 bag, or uses a serialization other than CDR.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from rosbags.highlevel import AnyReader

        self.path = Path(path)
        if not self.path.exists():
            raise BagError(f"bag {self.path} does not exist")
        if self.path.is_dir() and not any(self.path.iterdir()):
            raise BagError(f"bag folder {self.path} is empty")
        try:
            self._reader = AnyReader([self.path], default_typestore=typestore())
            self._reader.open()
        except Exception as exc:  # rosbags raises several unrelated types for bad files
            raise BagError(_explain_open_error(self.path, exc)) from exc
        if not self._reader.is2:
            self._reader.close()
            raise BagError(
                f"{self.path} is a ROS 1 bag; convert it first with `rosbags-convert --src {self.path} --dst <folder>`"
            )
        self.topics: dict[str, TopicInfo] = {}
        for conn in self._reader.connections:
            fmt = getattr(conn.ext, "serialization_format", "cdr")
            if fmt != "cdr":
                self._reader.close()
                raise BagError(f"{self.path}: topic {conn.topic} uses serialization {fmt!r}; only cdr is supported")
            old = self.topics.get(conn.topic)
            if old is not None and old.msgtype != conn.msgtype:
                self._reader.close()
                raise BagError(
                    f"{self.path}: topic {conn.topic} is recorded with two types ({old.msgtype}, {conn.msgtype})"
                )
            qos = tuple(getattr(conn.ext, "offered_qos_profiles", ()) or ())
            count = conn.msgcount + (old.count if old else 0)
            self.topics[conn.topic] = TopicInfo(conn.topic, conn.msgtype, count, (old.qos if old else ()) + qos)
        self.start_ns = int(self._reader.start_time) if self._reader.message_count else 0
        self.end_ns = int(self._reader.end_time) if self._reader.message_count else 0
        self._state = _ReadState()

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> BagInput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying files (idempotent)."""
        try:
            self._reader.close()
        except Exception:  # noqa: BLE001 - closing a broken reader must not mask the real error
            pass

    # ------------------------------------------------------------------ info
    @property
    def duration_s(self) -> float:
        """Time between the first and the last message, seconds (0 for an empty bag)."""
        return max(0, self.end_ns - self.start_ns - 1) / 1e9 if self.end_ns else 0.0

    def count(self, topics: Iterable[str]) -> int:
        """Messages the index claims for ``topics`` (unknown topics count 0)."""
        return sum(self.topics[t].count for t in topics if t in self.topics)

    # ------------------------------------------------------------------ reading
    def messages(self, topics: Iterable[str]) -> Iterator[tuple[str, int, bytes]]:
        """Yield ``(topic, log time ns, raw CDR bytes)`` of ``topics`` in log-time order.

        A read error stops the iteration (no exception): it is kept in :attr:`read_error`, and
        the messages not read show up in :meth:`lost`. Restarting the iteration resets both.
        """
        wanted = set(topics)
        conns = [c for c in self._reader.connections if c.topic in wanted]
        state = self._state = _ReadState()
        if not conns:
            state.finished = True
            return
        try:
            for conn, stamp, raw in self._reader.messages(connections=conns):
                state.counts[conn.topic] = state.counts.get(conn.topic, 0) + 1
                yield conn.topic, int(stamp), bytes(raw)
        except Exception as exc:  # noqa: BLE001 - any storage/decompression failure
            n = sum(state.counts.values())
            state.error = f"reading {self.path} failed after {n} messages: {type(exc).__name__}: {exc}"
        state.finished = True

    @property
    def read_to_end(self) -> bool:
        """Whether the last :meth:`messages` iteration ended (normally or by a read error)."""
        return self._state.finished

    @property
    def read_error(self) -> str | None:
        """The error that stopped the last :meth:`messages` iteration, or None."""
        return self._state.error

    def lost(self, topics: Iterable[str]) -> dict[str, int]:
        """Per topic, messages the index claims but the last full iteration did not yield.

        Empty unless the last :meth:`messages` iteration ran to its end (a caller that stops
        early has not lost anything); topics with no loss are omitted.
        """
        if not self._state.finished:
            return {}
        got = self._state.counts
        out = {}
        for t in topics:
            if t in self.topics and self.topics[t].count > got.get(t, 0):
                out[t] = self.topics[t].count - got.get(t, 0)
        return out


def _explain_open_error(path: Path, exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}"
    low = str(exc).lower()
    if "end magic" in low or "footer" in low or "summary" in low:
        hint = (
            "the file is truncated (recording interrupted?); recover the readable part with "
            "`mcap recover`, then `ros2 bag reindex`"
        )
    elif "magic" in low or "malformed" in low or "not a database" in low:
        hint = "the file is corrupt or not a rosbag2 storage file"
    elif "metadata" in low or "yaml" in low:
        hint = "metadata.yaml is missing or invalid; `ros2 bag reindex` can rebuild it"
    else:
        hint = "the bag cannot be read"
    return f"cannot open bag {path}: {hint} ({text})"


# ---------------------------------------------------------------------- message classes
def msg_class(msgtype: str) -> type:
    """The rclpy message class of ``pkg/msg/Name``.

    Raises:
        BagError: malformed name, or the message package is not installed.
    """
    parts = msgtype.split("/")
    if len(parts) != 3 or parts[1] != "msg":
        raise BagError(f"unsupported message type name {msgtype!r}")
    try:
        cls: type = getattr(importlib.import_module(f"{parts[0]}.msg"), parts[2])
        return cls
    except (ImportError, AttributeError) as exc:
        raise BagError(f"message type {msgtype} is not available in this ROS 2 installation ({exc})") from exc
