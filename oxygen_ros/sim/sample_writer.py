"""The sample-bag recorder's writer: an mcap rosbag2 folder written with the ``rosbags`` library."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np

if TYPE_CHECKING:
    from rosbags.typesys.store import MsgType

__all__ = ["SampleBagWriter", "check_replaceable"]

_BAG_FILE_SUFFIXES = (".yaml", ".mcap", ".db3", ".zstd")


def check_replaceable(path: Path) -> None:
    """Raise ``FileExistsError`` unless ``path`` is a bag folder (only bag files) that may be replaced."""
    if path.is_dir() and not path.is_symlink():
        foreign = [p.name for p in path.iterdir() if p.is_dir() or not p.name.endswith(_BAG_FILE_SUFFIXES)]
        if not foreign:
            return
        raise FileExistsError(f"{path} holds non-bag entries {sorted(foreign)[:5]}; not replacing it")
    raise FileExistsError(f"{path} exists and is not a bag folder; not replacing it")


class SampleBagWriter:
    """An open rosbags mcap writer (metadata v9, Kilted type hashes) with the recording's
    connections (``topic_types``: topic -> ROS type name) and message builders for ``joint_names``."""

    def __init__(self, path: Path, topic_types: dict[str, str], joint_names: Sequence[str]) -> None:
        from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
        from rosbags.rosbag2 import StoragePlugin, Writer
        from rosbags.typesys import Stores, get_typestore

        self.ts = get_typestore(Stores.ROS2_KILTED)
        self.writer = Writer(path, version=9, storage_plugin=StoragePlugin.MCAP)
        self.counts: dict[str, int] = {}
        zero = QosTime(0, 0)  # rmw "unspecified": default (infinite) deadline/lifespan/lease
        qos = Qos(
            history=QosHistory.KEEP_LAST,
            depth=10,
            reliability=QosReliability.RELIABLE,
            durability=QosDurability.VOLATILE,
            deadline=zero,
            lifespan=zero,
            liveliness=QosLiveliness.AUTOMATIC,
            liveliness_lease_duration=zero,
            avoid_ros_namespace_conventions=False,
        )
        self.writer.open()
        self._conns = {
            topic: self.writer.add_connection(topic, msgtype, typestore=self.ts, offered_qos_profiles=[qos])
            for topic, msgtype in topic_types.items()
        }
        self._names = list(joint_names)
        self._empty = np.zeros(0, dtype=np.float64)

    def _header(self, stamp_ns: int, frame_id: str = "") -> MsgType:
        t = self.ts.types["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9)
        return self.ts.types["std_msgs/msg/Header"](stamp=t, frame_id=frame_id)

    def _put(self, topic: str, msg: MsgType, stamp_ns: int) -> None:
        self.writer.write(self._conns[topic], stamp_ns, self.ts.serialize_cdr(msg, msg.__msgtype__))
        self.counts[topic] = self.counts.get(topic, 0) + 1

    def text(self, topic: str, text: str, stamp_ns: int) -> None:
        """Write a ``std_msgs/String``."""
        self._put(topic, self.ts.types["std_msgs/msg/String"](data=text), stamp_ns)

    def joints(self, topic: str, position: np.ndarray, velocity: np.ndarray | None, stamp_ns: int) -> None:
        """Write a ``sensor_msgs/JointState`` of the joints (``[n]`` positions, optional velocities)."""
        msg = self.ts.types["sensor_msgs/msg/JointState"](
            header=self._header(stamp_ns),
            name=self._names,
            position=np.asarray(position, dtype=np.float64),
            velocity=self._empty if velocity is None else np.asarray(velocity, dtype=np.float64),
            effort=self._empty,
        )
        self._put(topic, msg, stamp_ns)

    def jpeg(self, topic: str, rgb: np.ndarray, frame_id: str, quality: int, stamp_ns: int) -> None:
        """Write a uint8 ``[H, W, 3]`` RGB image as a JPEG ``sensor_msgs/CompressedImage``."""
        bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
        ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
        if not ok:
            raise RuntimeError(f"JPEG encoding for {topic} failed")
        msg = self.ts.types["sensor_msgs/msg/CompressedImage"](
            header=self._header(stamp_ns, frame_id), format="rgb8; jpeg compressed bgr8", data=buf.reshape(-1)
        )
        self._put(topic, msg, stamp_ns)

    def abort(self) -> None:
        """Stop writing without finishing the bag (the caller deletes the folder)."""
        if self.writer.storage is not None:
            self.writer.abort()
