"""Test helper: copy a rosbag2 with edits (drop, retime or rewrite messages) using rosbags."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from rosbags.highlevel import AnyReader
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

REPO = Path(__file__).resolve().parents[1]
SAMPLE_BAG = REPO / "data" / "aloha_sim_sample"
TS = get_typestore(Stores.ROS2_KILTED)

Edit = Callable[[str, int, bytes], Iterable[tuple[str, int, bytes]]]


def edit_bag(src: Path, dst: Path, edit: Edit | None = None, extra_topics: dict[str, str] | None = None) -> Path:
    """Write ``dst`` (mcap) from ``src``; ``edit(topic, log_ns, raw)`` returns the messages to write
    instead (none = drop). ``extra_topics`` (topic -> type) declares topics the edit may add."""
    with AnyReader([src], default_typestore=TS) as reader:
        writer = Writer(dst, version=9, storage_plugin=StoragePlugin.MCAP)
        writer.open()
        conns = {}
        for c in reader.connections:
            conns[c.topic] = writer.add_connection(
                c.topic, c.msgtype, typestore=TS, offered_qos_profiles=list(getattr(c.ext, "offered_qos_profiles", []))
            )
        for topic, msgtype in (extra_topics or {}).items():
            conns[topic] = writer.add_connection(topic, msgtype, typestore=TS)
        for conn, stamp, raw in reader.messages():
            out = [(conn.topic, stamp, raw)] if edit is None else edit(conn.topic, stamp, raw)
            for topic, t, data in out:
                writer.write(conns[topic], t, data)
        writer.close()
    return dst


def start_ns(src: Path = SAMPLE_BAG) -> int:
    """Log time of the first message of ``src``."""
    with AnyReader([src], default_typestore=TS) as reader:
        return reader.start_time


def window(src: Path, dst: Path, seconds: float) -> Path:
    """The first ``seconds`` of ``src``."""
    t0 = start_ns(src)
    return edit_bag(src, dst, lambda t, s, r: [(t, s, r)] if s < t0 + seconds * 1e9 else [])


def corrupt_a_chunk(bag: Path) -> None:
    """Flip the bytes just before the first ``/joint_states`` message past the middle of ``bag``'s
    uncompressed mcap: that record's framing breaks, so ``rosbags`` cannot read its chunk (a corrupt
    chunk, whatever the middle of the file happens to hold)."""
    mcap = next(Path(bag).glob("*.mcap"))
    data = bytearray(mcap.read_bytes())
    at = data.index(b"left_waist", len(data) // 2) - 200
    data[at : at + 256] = bytes(b ^ 0x5A for b in data[at : at + 256])
    mcap.write_bytes(bytes(data))
