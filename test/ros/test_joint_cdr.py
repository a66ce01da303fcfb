"""JointStateDecoder: serialized JointState -> stamp + joint vector, identical to the standard
decode (``deserialize_message`` + ``joint_state_to_vector``) for every message, fast path or not."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rclpy.serialization import serialize_message
from sensor_msgs.msg import JointState

from oxygen_ros.ros.convert import JointStateDecoder, JointStateError, joint_state_to_vector

NAMES = ("shoulder", "elbow", "wrist", "gripper")


def joint_state(names, positions, sec=1_700_000_000, nanosec=123_456_789, frame_id="") -> JointState:
    msg = JointState(name=list(names), position=[float(p) for p in positions])
    msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id = sec, nanosec, frame_id
    return msg


@pytest.mark.parametrize("frame_id", ["", "a", "ab", "abc", "base_link", "x" * 13])
def test_every_alignment_matches_the_standard_decode_and_takes_the_fast_path(frame_id):
    rng = np.random.default_rng(len(frame_id))
    dec = JointStateDecoder(NAMES)
    names = ["extra_joint_1", "wrist", "gripper", "j", "elbow", "shoulder"]  # any order, extras
    for k in range(20):
        msg = joint_state(names, rng.normal(size=len(names)), sec=100 + k, nanosec=k * 7, frame_id=frame_id)
        sec, nanosec, vec = dec.decode(serialize_message(msg))
        assert (sec, nanosec) == (100 + k, k * 7)
        np.testing.assert_array_equal(vec, joint_state_to_vector(msg, NAMES))
        assert vec.dtype == np.float64 and vec.shape == (len(NAMES),)
    assert dec.standard == 1 and dec.fast == 19


def test_a_new_layout_is_decoded_the_standard_way_and_then_learnt():
    dec = JointStateDecoder(NAMES)
    dec.decode(serialize_message(joint_state(NAMES, [1, 2, 3, 4])))
    reordered = joint_state(NAMES[::-1], [1, 2, 3, 4])
    _, _, vec = dec.decode(serialize_message(reordered))
    np.testing.assert_array_equal(vec, [4, 3, 2, 1])
    _, _, vec = dec.decode(serialize_message(reordered))
    np.testing.assert_array_equal(vec, [4, 3, 2, 1])
    assert dec.standard == 2 and dec.fast == 1


def test_non_finite_configured_joint_is_an_error_naming_it_even_on_the_fast_path():
    dec = JointStateDecoder(NAMES)
    names = list(NAMES) + ["spare"]
    dec.decode(serialize_message(joint_state(names, [0, 0, 0, 0, 0])))
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(JointStateError, match="non-finite positions for joints: wrist"):
            dec.decode(serialize_message(joint_state(names, [0, 0, bad, 0, 0])))
    # a non-finite value of a joint that is not configured is fine
    _, _, vec = dec.decode(serialize_message(joint_state(names, [1, 2, 3, 4, math.nan])))
    np.testing.assert_array_equal(vec, [1, 2, 3, 4])
    _, _, vec = dec.decode(serialize_message(joint_state(names, [5, 6, 7, 8, 0])))
    np.testing.assert_array_equal(vec, [5, 6, 7, 8])
    assert dec.fast >= 1


def test_missing_joints_short_positions_and_garbage_are_errors():
    dec = JointStateDecoder(NAMES)
    dec.decode(serialize_message(joint_state(NAMES, [1, 2, 3, 4])))
    with pytest.raises(JointStateError, match="lacks configured joints: gripper"):
        dec.decode(serialize_message(joint_state(NAMES[:3], [1, 2, 3])))
    short = JointState(name=list(NAMES), position=[1.0, 2.0])
    with pytest.raises(JointStateError, match="4 names but only 2 positions"):
        dec.decode(serialize_message(short))
    good = serialize_message(joint_state(NAMES, [1, 2, 3, 4]))
    with pytest.raises(JointStateError, match="undecodable JointState"):
        dec.decode(good[: len(good) // 2])
    with pytest.raises(JointStateError):
        dec.decode(b"\x00\x01\x00\x00" + b"\xff" * 40)
    # the learnt layout still works after all of that
    _, _, vec = dec.decode(good)
    np.testing.assert_array_equal(vec, [1, 2, 3, 4])


def test_a_single_configured_joint():
    dec = JointStateDecoder(["elbow"])
    for _ in range(3):
        _, _, vec = dec.decode(serialize_message(joint_state(NAMES, [1, 2, 3, 4])))
        np.testing.assert_array_equal(vec, [2.0])
    assert dec.fast == 2


def test_garbage_in_alignment_padding_keeps_the_fast_path():
    """A serializer may leave CDR padding bytes uninitialised: they are not part of the layout."""
    dec = JointStateDecoder(NAMES)
    dec.decode(serialize_message(joint_state(NAMES, [1, 2, 3, 4], frame_id="")))
    data = bytearray(serialize_message(joint_state(NAMES, [5, 6, 7, 8], frame_id="")))
    data[17:20] = b"\xaa\xbb\xcc"  # frame_id '' = length 1 + NUL at 12..16, then 3 padding bytes
    _, _, vec = dec.decode(bytes(data))
    np.testing.assert_array_equal(vec, [5, 6, 7, 8])
    assert dec.standard == 1 and dec.fast == 1
