"""ROS time <-> float seconds, message headers, and exact-stamp lookup for outputs."""

from __future__ import annotations

import math
from collections import OrderedDict

from builtin_interfaces.msg import Time
from std_msgs.msg import Header

__all__ = ["StampBook", "make_header", "sec_to_stamp", "stamp_to_sec"]

_INT32_MAX = 2**31 - 1
_NS = 1_000_000_000


def stamp_to_sec(stamp: Time) -> float:
    """Return the seconds (float) of a ``builtin_interfaces/Time`` (any ``sec``/``nanosec``)."""
    t: float = stamp.sec + stamp.nanosec * 1e-9
    return t


def sec_to_stamp(t: float) -> Time:
    """Return a ``builtin_interfaces/Time`` for ``t`` seconds, rounded to the nearest ns.

    Raises:
        ValueError: ``t`` is not finite or outside the int32 seconds range of the message.
    """
    t = float(t)
    if not math.isfinite(t):
        raise ValueError(f"cannot convert non-finite time {t} to a stamp")
    sec = math.floor(t)
    nanosec = round((t - sec) * _NS)
    if nanosec >= _NS:
        sec, nanosec = sec + 1, nanosec - _NS
    if not -(2**31) <= sec <= _INT32_MAX:
        raise ValueError(f"time {t} s is outside the builtin_interfaces/Time range")
    return Time(sec=sec, nanosec=nanosec)


class StampBook:
    """Remembers the exact header stamps of recent inputs by their float-seconds value.

    The observation pipeline works in float seconds, which cannot hold a ROS stamp exactly
    (float64 resolution at 1.7e9 s is ~0.24 us). Outputs stamped "with the observation stamp" look
    the original message stamp up here, so ``header.stamp`` matches the input bit for bit.
    """

    def __init__(self, capacity: int = 512) -> None:
        self._capacity = capacity
        self._stamps: OrderedDict[float, tuple[int, int]] = OrderedDict()

    def remember(self, stamp: Time) -> float:
        """Record ``stamp``; returns its float-seconds value (the key)."""
        return self.remember_parts(stamp.sec, stamp.nanosec)

    def remember_parts(self, sec: int, nanosec: int) -> float:
        """Record the stamp ``sec`` s + ``nanosec`` ns (e.g. read from serialized bytes); returns
        its float-seconds value (the key)."""
        t = sec + nanosec * 1e-9
        self._stamps[t] = (sec, nanosec)
        self._stamps.move_to_end(t)
        while len(self._stamps) > self._capacity:
            self._stamps.popitem(last=False)
        return t

    def exact(self, t: float) -> Time:
        """The remembered stamp for ``t`` seconds, else :func:`sec_to_stamp` of ``t``."""
        found = self._stamps.get(t)
        return Time(sec=found[0], nanosec=found[1]) if found is not None else sec_to_stamp(t)


def make_header(stamp: Time | float | None, frame_id: str) -> Header:
    """A Header with ``stamp`` (Time, seconds, or None for zero) and ``frame_id``."""
    if stamp is None:
        stamp = Time()
    elif not isinstance(stamp, Time):
        stamp = sec_to_stamp(float(stamp))
    return Header(stamp=stamp, frame_id=frame_id)
