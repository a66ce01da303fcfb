"""Serialized ``sensor_msgs/JointState`` -> stamp + joint vector, without building a message.

The node takes ``/joint_states`` as raw CDR bytes (``create_subscription(..., raw=True)``): at the
controller rate (500 Hz – 1 kHz from ros2_control) building a Python ``JointState`` for every
message (≈45 µs of interpreter time, rclpy's C conversion runs the generated Python setters) plus
picking the joints (≈20 µs) takes the GIL from the inference thread. A controller publishes the
same joint names in the same order every time, so :class:`JointStateDecoder` learns the byte
layout from one message decoded the standard way (``rclpy.serialization.deserialize_message`` +
:func:`~oxygen_ros.ros.convert.joints.joint_state_to_vector`) and, while the bytes of
``frame_id`` + ``name`` + the position count are identical, reads the positions straight out of
the buffer (``numpy.frombuffer``) — a few µs. The learnt offsets are checked against the
standard decode before use; any other message (new names, other length, big-endian, a
non-finite value) takes the standard path, so errors and their messages are the same.

CDR layout (OMG DDS-XTypes 1.3 §7.4.3.5 "XCDR1", as Fast DDS writes ROS 2 messages): a 4-byte
encapsulation header, then fields aligned to their size relative to the end of that header:
``stamp.sec`` int32, ``stamp.nanosec`` uint32, ``frame_id`` (uint32 length incl. NUL + bytes),
``name`` (uint32 count, each a string as above), ``position`` (uint32 count, float64s).
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import JointState

from oxygen_ros.ros.convert.joints import JointStateError, joint_state_to_vector

__all__ = ["JointStateDecoder"]

_ORIGIN = 4  # CDR alignment counts from the end of the encapsulation header
_CDR_LE = b"\x00\x01"
_STAMP = struct.Struct("<iI")


def _align(offset: int, size: int) -> int:
    rel = offset - _ORIGIN
    return offset + (-rel % size)


def _position_layout(data: bytes) -> tuple[list[tuple[int, int]], int, int]:
    """(the byte ranges of ``frame_id`` + ``name`` + position count WITHOUT the alignment padding,
    offset of the position count, offset of the first float64). Padding bytes are not compared:
    a serializer may leave them uninitialised."""
    off = _ORIGIN + 8  # after stamp
    (n,) = struct.unpack_from("<I", data, off)
    segments = [(off, off + 4 + n)]
    off = _align(off + 4 + n, 4)
    (count,) = struct.unpack_from("<I", data, off)
    segments.append((off, off + 4))
    off += 4
    for _ in range(count):
        off = _align(off, 4)
        (n,) = struct.unpack_from("<I", data, off)
        segments.append((off, off + 4 + n))
        off += 4 + n
    count_at = _align(off, 4)
    segments.append((count_at, count_at + 4))
    return segments, count_at, _align(count_at + 4, 8)


def _pick_one(i: int) -> Callable[[tuple[Any, ...]], tuple[float, ...]]:
    """``v -> (v[i],)``: a one-joint pick, a tuple like ``operator.itemgetter(i, j, ...)`` gives."""
    return lambda v: (v[i],)


class JointStateDecoder:
    """Decodes serialized JointState messages into the positions of ``joint_names``.

    Args:
        joint_names: the configured joints, in the order of the returned vector.

    Attributes:
        fast, standard: messages decoded by the learnt layout / the standard path.
    """

    def __init__(self, joint_names: Sequence[str]) -> None:
        self.joint_names = tuple(joint_names)
        self._key: list[bytes] | None = None  # the learnt layout's bytes over self._segments
        self._segments: list[tuple[int, int]] = []
        self._key_end = self._pos_at = self._end = 0
        self._positions: struct.Struct | None = None  # '<{n}d' of the learnt layout
        # the configured joints' values of the unpacked positions (learnt with the layout)
        self._pick: Callable[[tuple[Any, ...]], tuple[float, ...]] = operator.itemgetter(0)
        self.fast = self.standard = 0

    def decode(self, data: bytes) -> tuple[int, int, np.ndarray]:
        """One serialized message -> ``(stamp.sec, stamp.nanosec, positions)``.

        Returns:
            ``(sec, nanosec, positions)``: the header stamp, and float64 positions
            ``[len(joint_names)]`` in ``joint_names`` order (robot units).

        Raises:
            JointStateError: configured joints missing, fewer positions than names, a non-finite
                position (named), or bytes that are not a JointState.
        """
        key, positions = self._key, self._positions  # learnt together (_learn)
        if key is not None and positions is not None and len(data) >= self._end and self._same_layout(data, key):
            picked = self._pick(positions.unpack_from(data, self._pos_at))
            if math.isfinite(sum(picked)):  # NaN/inf propagate (an overflow only costs the slow path)
                sec, nsec = _STAMP.unpack_from(data, _ORIGIN)
                self.fast += 1
                return sec, nsec, np.array(picked, dtype=np.float64)
        return self._standard(data)

    def _standard(self, data: bytes) -> tuple[int, int, np.ndarray]:
        try:
            msg = deserialize_message(data, JointState)
        except Exception as exc:  # rclpy raises plain exceptions for truncated/corrupt CDR
            raise JointStateError(f"undecodable JointState ({len(data)} bytes): {exc}") from exc
        out = joint_state_to_vector(msg, self.joint_names)  # raises JointStateError
        self.standard += 1
        self._learn(data, msg)
        return msg.header.stamp.sec, msg.header.stamp.nanosec, out

    def _learn(self, data: bytes, msg: JointState) -> None:
        """Adopt this message's layout if the offsets reproduce the standard decode exactly."""
        key = self._key
        if key is not None and len(data) >= self._end and self._same_layout(data, key):
            return  # same layout, only a non-finite value sent it here
        self._key = None
        if bytes(data[:2]) != _CDR_LE:
            return
        try:
            segments, count_at, pos_at = _position_layout(data)
            (n_pos,) = struct.unpack_from("<I", data, count_at)
            positions = np.frombuffer(data, "<f8", n_pos, pos_at)
        except (struct.error, ValueError):
            return
        reference = np.asarray(msg.position, dtype=np.float64)
        if positions.shape != reference.shape or not np.array_equal(positions, reference, equal_nan=True):
            return
        index: dict[str, int] = {}
        for i, name in enumerate(msg.name):
            index.setdefault(name, i)
        picks = [index[n] for n in self.joint_names]
        self._pick = operator.itemgetter(*picks) if len(picks) > 1 else _pick_one(picks[0])
        self._positions = struct.Struct(f"<{n_pos}d")
        self._key_end, self._pos_at, self._end = count_at + 4, pos_at, pos_at + 8 * n_pos
        self._segments = segments
        self._key = [bytes(data[a:b]) for a, b in segments]

    def _same_layout(self, data: bytes, key: list[bytes]) -> bool:
        """Whether ``data`` has the learnt ``frame_id`` / names / count bytes (``key``, padding
        ignored)."""
        return all(data[a:b] == k for (a, b), k in zip(self._segments, key))
