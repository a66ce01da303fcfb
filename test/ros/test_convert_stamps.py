"""Tests for oxygen_ros.ros.convert.stamps: stamps (builtin_interfaces/Time ↔ seconds); pure message construction, no
DDS."""

from __future__ import annotations

import os

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")  # DDS stays on this host

import math

import pytest
from builtin_interfaces.msg import Time

from oxygen_ros.ros.convert import (
    sec_to_stamp,
    stamp_to_sec,
)


@pytest.mark.parametrize("t", [0.0, 1.5, 1_700_000_000.123456789, 0.9999999999, 42.000000001])
def test_stamp_round_trip(t):
    stamp = sec_to_stamp(t)
    assert 0 <= stamp.nanosec < 1_000_000_000
    assert stamp_to_sec(stamp) == pytest.approx(t, abs=1e-6)


def test_stamp_exact_values():
    assert (sec_to_stamp(1.5).sec, sec_to_stamp(1.5).nanosec) == (1, 500_000_000)
    assert (sec_to_stamp(0.9999999999).sec, sec_to_stamp(0.9999999999).nanosec) == (1, 0)
    assert (sec_to_stamp(-0.25).sec, sec_to_stamp(-0.25).nanosec) == (-1, 750_000_000)
    assert stamp_to_sec(Time(sec=3, nanosec=250_000_000)) == 3.25


@pytest.mark.parametrize("t", [math.nan, math.inf, 2.0**31, -(2.0**31) - 1])
def test_sec_to_stamp_rejects_bad_times(t):
    with pytest.raises(ValueError):
        sec_to_stamp(t)


def test_stamp_book_gives_back_the_exact_input_stamp():
    from builtin_interfaces.msg import Time

    from oxygen_ros.ros.convert import StampBook, sec_to_stamp

    book = StampBook(capacity=2)
    original = Time(sec=1_700_000_000, nanosec=100_000_000)
    t = book.remember(original)
    assert sec_to_stamp(t).nanosec != original.nanosec  # float seconds alone lose the nanoseconds
    assert book.exact(t) == original
    book.remember(Time(sec=1, nanosec=1))
    book.remember(Time(sec=2, nanosec=2))
    assert book.exact(t) == sec_to_stamp(t)  # evicted: falls back to the float conversion
