"""Tests for oxygen_ros.ros.convert (images, joints, trajectory, stamps): pure message construction, no DDS."""

from __future__ import annotations

import os

os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')  # DESIGN §7

import math

import numpy as np
import pytest
from builtin_interfaces.msg import Time
from sensor_msgs.msg import CompressedImage, Image, JointState

from oxygen_ros.ros.convert import (
    SUPPORTED_ENCODINGS,
    ImageConversionError,
    JointStateError,
    chunk_to_joint_trajectory,
    compressed_to_rgb,
    image_to_rgb,
    joint_state_to_vector,
    rgb_to_compressed_msg,
    rgb_to_image_msg,
    sec_to_stamp,
    stamp_to_sec,
)

COLOUR_ENCODINGS = ('rgb8', 'bgr8', 'rgba8', 'bgra8')
# (channels, RGB->encoding channel order) for building messages by hand, independent of convert.py
LAYOUT = {'rgb8': (3, [0, 1, 2]), 'bgr8': (3, [2, 1, 0]), 'rgba8': (4, [0, 1, 2]),
          'bgra8': (4, [2, 1, 0])}


def _picture(h: int = 6, w: int = 5, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _raw_msg(rgb: np.ndarray, encoding: str, pad: int = 0, extra: int = 0) -> Image:
    """Build an Image by hand (numpy only), rows padded with ``pad`` junk bytes."""
    h, w, _ = rgb.shape
    if encoding == 'mono8':
        pixels = rgb[:, :, :1]
    else:
        channels, order = LAYOUT[encoding]
        pixels = np.full((h, w, channels), 255, np.uint8)  # alpha = 255
        pixels[:, :, :3] = rgb[:, :, order]
    row = pixels.reshape(h, -1)
    junk = np.full((h, pad), 0xAB, np.uint8)
    data = np.concatenate([row, junk], axis=1).tobytes() + b'\x7f' * extra
    msg = Image(height=h, width=w, encoding=encoding, step=row.shape[1] + pad)
    msg.data = data
    return msg


@pytest.mark.parametrize('encoding', COLOUR_ENCODINGS)
def test_pure_red_stays_red(encoding):
    red = np.zeros((4, 7, 3), np.uint8)
    red[..., 0] = 255
    out = image_to_rgb(_raw_msg(red, encoding))
    assert out.dtype == np.uint8 and out.shape == (4, 7, 3)
    assert (out[..., 0] == 255).all() and (out[..., 1:] == 0).all()


def test_every_encoding_gives_the_same_rgb():
    rgb = _picture()
    for encoding in COLOUR_ENCODINGS:
        np.testing.assert_array_equal(image_to_rgb(_raw_msg(rgb, encoding)), rgb, err_msg=encoding)
    grey = np.repeat(_picture()[:, :, :1], 3, axis=2)  # grey pictures survive mono8 too
    for encoding in SUPPORTED_ENCODINGS:
        np.testing.assert_array_equal(image_to_rgb(_raw_msg(grey, encoding)), grey, encoding)


@pytest.mark.parametrize('encoding', SUPPORTED_ENCODINGS)
def test_padded_rows_and_trailing_bytes(encoding):
    rgb = _picture(5, 3, seed=1)
    if encoding == 'mono8':
        rgb = np.repeat(rgb[:, :, :1], 3, axis=2)
    for pad, extra in ((1, 0), (7, 0), (13, 5)):
        out = image_to_rgb(_raw_msg(rgb, encoding, pad=pad, extra=extra))
        np.testing.assert_array_equal(out, rgb)
        assert out.flags.c_contiguous


def test_mono8_replicated_to_three_channels():
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    msg = Image(height=3, width=4, encoding='mono8', step=4)
    msg.data = grey.tobytes()
    out = image_to_rgb(msg)
    assert out.shape == (3, 4, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], grey)


def test_result_does_not_alias_message_data():
    rgb = _picture()
    msg = _raw_msg(rgb, 'rgb8')
    out = image_to_rgb(msg)
    out[:] = 0
    np.testing.assert_array_equal(image_to_rgb(msg), rgb)


@pytest.mark.parametrize('encoding', SUPPORTED_ENCODINGS)
def test_round_trip_through_rgb_to_image_msg(encoding):
    rgb = _picture(seed=2)
    if encoding == 'mono8':
        rgb = np.repeat(rgb[:, :, :1], 3, axis=2)
    msg = rgb_to_image_msg(rgb, encoding, stamp=12.5, frame_id='cam')
    assert msg.encoding == encoding and msg.header.frame_id == 'cam'
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (12, 500_000_000)
    assert msg.step * msg.height == len(msg.data)
    np.testing.assert_array_equal(image_to_rgb(msg), rgb)


@pytest.mark.parametrize('encoding', SUPPORTED_ENCODINGS)
def test_matches_rosbags_image(encoding):
    """The no-cv_bridge reference of DESIGN §6 (rosbags-image) agrees on unpadded images."""
    image = pytest.importorskip('rosbags.image')
    rgb = _picture(8, 9, seed=3)
    msg = _raw_msg(rgb, encoding)
    np.testing.assert_array_equal(image_to_rgb(msg), image.message_to_cvimage(msg, 'rgb8'))


def test_unsupported_encoding_names_it_and_the_supported_list():
    msg = Image(height=2, width=2, encoding='16UC1', step=4)
    msg.data = bytes(8)
    with pytest.raises(ImageConversionError, match=r"'16UC1'.*rgb8.*bgr8.*mono8"):
        image_to_rgb(msg)


@pytest.mark.parametrize(
    'height, width, step, size, pattern',
    [
        (4, 4, 12, 47, 'too short'),  # one byte short
        (4, 4, 12, 0, 'too short'),
        (4, 4, 11, 48, 'step'),  # step smaller than a row
        (0, 4, 12, 0, 'no pixels'),
        (4, 0, 0, 0, 'no pixels'),
    ],
)
def test_bad_geometry_raises(height, width, step, size, pattern):
    msg = Image(height=height, width=width, encoding='rgb8', step=step)
    msg.data = bytes(size)
    with pytest.raises(ImageConversionError, match=pattern):
        image_to_rgb(msg)


def test_image_conversion_error_is_a_value_error():
    assert issubclass(ImageConversionError, ValueError)
    assert issubclass(JointStateError, ValueError)


def test_png_round_trip_is_exact():
    rgb = _picture(16, 24, seed=4)
    msg = rgb_to_compressed_msg(rgb, 'png', stamp=Time(sec=3, nanosec=4), frame_id='wrist')
    assert msg.format == 'rgb8; png compressed bgr8'
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id) == (3, 4, 'wrist')
    np.testing.assert_array_equal(compressed_to_rgb(msg), rgb)


def test_jpeg_round_trip_is_close_and_keeps_colours():
    smooth = np.zeros((32, 48, 3), np.uint8)
    smooth[:16, :, 0] = 255  # red top half
    smooth[16:, :, 2] = 255  # blue bottom half
    msg = rgb_to_compressed_msg(smooth, 'jpeg', quality=95)
    assert msg.format == 'rgb8; jpeg compressed bgr8'
    out = compressed_to_rgb(msg)
    assert out.shape == smooth.shape and out.dtype == np.uint8
    assert np.abs(out.astype(int) - smooth).mean() < 4.0
    assert out[4, 4, 0] > 240 and out[4, 4, 2] < 15  # still red, not swapped to blue
    assert out[28, 4, 2] > 240 and out[28, 4, 0] < 15


@pytest.mark.parametrize(
    'fmt',
    ['jpeg', 'png', 'rgb8; jpeg compressed bgr8', 'rgb8; compressed bgr8', 'JPEG', '',
     'bayer_rggb8; png compressed bgr8'],
)
def test_compressed_format_strings(fmt):
    rgb = _picture(8, 8, seed=5)
    src = rgb_to_compressed_msg(rgb, 'png')
    msg = CompressedImage(format=fmt)
    msg.data = bytes(src.data)
    np.testing.assert_array_equal(compressed_to_rgb(msg), rgb)  # payload sniffed, PNG exact


def test_grey_jpeg_decodes_to_three_channels():
    import cv2

    grey = np.full((8, 8), 128, np.uint8)
    ok, buf = cv2.imencode('.jpg', grey)
    assert ok
    msg = CompressedImage(format='mono8; jpeg compressed mono8')
    msg.data = buf.tobytes()
    out = compressed_to_rgb(msg)
    assert out.shape == (8, 8, 3)
    assert np.abs(out.astype(int) - 128).max() <= 2


@pytest.mark.parametrize(
    'fmt, payload',
    [
        ('jpeg', b''),
        ('jpeg', bytes(range(256)) * 4),
        ('png', b'\x89PNG\r\n\x1a\n' + b'\x00' * 40),
        ('jpeg', b'\xff\xd8\xff\xe0garbage'),
    ],
)
def test_corrupt_compressed_raises(fmt, payload):
    msg = CompressedImage(format=fmt)
    msg.data = payload
    with pytest.raises(ImageConversionError):
        compressed_to_rgb(msg)


def test_truncated_png_raises():
    msg = rgb_to_compressed_msg(_picture(16, 16, seed=6), 'png')
    data = bytes(msg.data)
    msg.data = data[: len(data) // 2]
    with pytest.raises(ImageConversionError):
        compressed_to_rgb(msg)


@pytest.mark.parametrize(
    'fmt', ['16UC1; compressedDepth png', '16UC1; compressedDepth', 'h264', 'theora', 'webp']
)
def test_unsupported_compressed_format_raises(fmt):
    msg = rgb_to_compressed_msg(_picture(), 'png')
    msg.format = fmt
    with pytest.raises(ImageConversionError, match='unsupported'):
        compressed_to_rgb(msg)


def test_rgb_builders_reject_bad_input():
    with pytest.raises(ValueError):
        rgb_to_image_msg(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError):
        rgb_to_image_msg(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match='encoding'):
        rgb_to_image_msg(np.zeros((4, 4, 3), np.uint8), encoding='yuv422')
    with pytest.raises(ValueError, match='format'):
        rgb_to_compressed_msg(np.zeros((4, 4, 3), np.uint8), fmt='webp')
    with pytest.raises(ValueError, match='quality'):
        rgb_to_compressed_msg(np.zeros((4, 4, 3), np.uint8), quality=0)


def test_large_image_msg_round_trip():
    """A 480x640 frame goes through rgb_to_image_msg (bytes assignment) and back unchanged."""
    rgb = _picture(480, 640, seed=7)
    out = image_to_rgb(rgb_to_image_msg(rgb, 'bgr8'))
    np.testing.assert_array_equal(out, rgb)


# ----------------------------------------------------------------------------- joint states
NAMES = ['shoulder', 'elbow', 'wrist', 'gripper']


def _joint_state(names, positions) -> JointState:
    return JointState(name=list(names), position=[float(p) for p in positions])


def test_joint_mapping_by_name_with_shuffled_order_and_extra_joints():
    msg = _joint_state(['camera_tilt', 'gripper', 'wrist', 'shoulder', 'head', 'elbow'],
                       [9.0, 0.04, -1.5, 0.25, 8.0, 1.0])
    vec = joint_state_to_vector(msg, NAMES)
    assert vec.dtype == np.float64 and vec.shape == (4,)
    np.testing.assert_array_equal(vec, [0.25, 1.0, -1.5, 0.04])


def test_missing_joints_are_all_named():
    msg = _joint_state(['shoulder', 'wrist'], [0.0, 0.0])
    with pytest.raises(JointStateError, match='elbow, gripper'):
        joint_state_to_vector(msg, NAMES)


@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf])
def test_non_finite_position_names_the_joint(bad):
    msg = _joint_state(NAMES, [0.0, 1.0, bad, 0.0])
    with pytest.raises(JointStateError, match='wrist'):
        joint_state_to_vector(msg, NAMES)


def test_non_finite_position_of_an_unused_joint_is_ignored():
    msg = _joint_state(NAMES + ['broken_sensor'], [0.0, 1.0, 2.0, 3.0, math.nan])
    np.testing.assert_array_equal(joint_state_to_vector(msg, NAMES), [0.0, 1.0, 2.0, 3.0])


def test_positions_shorter_than_names_raise():
    msg = _joint_state(NAMES, [0.0, 1.0])
    with pytest.raises(JointStateError, match='positions'):
        joint_state_to_vector(msg, NAMES)
    empty = JointState(name=list(NAMES))  # e.g. a velocity-only JointState
    with pytest.raises(JointStateError):
        joint_state_to_vector(empty, NAMES)


# ----------------------------------------------------------------------------- trajectories
def test_chunk_to_joint_trajectory():
    actions = np.arange(12, dtype=np.float32).reshape(3, 4) / 8
    stamp = Time(sec=100, nanosec=250)
    traj = chunk_to_joint_trajectory(actions, NAMES, stamp, control_period_s=0.02, frame_id='base')
    assert list(traj.joint_names) == NAMES
    assert traj.header.stamp == stamp and traj.header.frame_id == 'base'
    assert len(traj.points) == 3
    for i, point in enumerate(traj.points):
        assert list(point.positions) == actions[i].astype(float).tolist()
        assert point.time_from_start.sec == 0
        assert point.time_from_start.nanosec == (i + 1) * 20_000_000  # first point = next command
        assert len(point.velocities) == 0


def test_trajectory_times_do_not_drift():
    traj = chunk_to_joint_trajectory(np.zeros((150, 1)), ['j'], 0.0, control_period_s=1 / 30)
    last = traj.points[-1].time_from_start
    assert (last.sec, last.nanosec) == (5, 0)  # 150 * (1/30) s exactly, no accumulated error
    assert traj.header.stamp == Time()


@pytest.mark.parametrize('bad', [math.nan, math.inf])
def test_trajectory_refuses_non_finite(bad):
    actions = np.zeros((5, 4))
    actions[3, 1] = bad
    with pytest.raises(ValueError, match="non-finite.*step 3.*'elbow'"):
        chunk_to_joint_trajectory(actions, NAMES, Time(), 0.02)


@pytest.mark.parametrize('shape', [(5, 3), (5,), (0, 4), (2, 5, 4)])
def test_trajectory_refuses_shape_mismatch(shape):
    with pytest.raises(ValueError, match='action chunk'):
        chunk_to_joint_trajectory(np.zeros(shape), NAMES, Time(), 0.02)


@pytest.mark.parametrize('period', [0.0, -0.02, math.nan, math.inf])
def test_trajectory_refuses_bad_period(period):
    with pytest.raises(ValueError, match='control_period_s'):
        chunk_to_joint_trajectory(np.zeros((2, 4)), NAMES, Time(), period)


# ----------------------------------------------------------------------------- stamps
@pytest.mark.parametrize('t', [0.0, 1.5, 1_700_000_000.123456789, 0.9999999999, 42.000000001])
def test_stamp_round_trip(t):
    stamp = sec_to_stamp(t)
    assert 0 <= stamp.nanosec < 1_000_000_000
    assert stamp_to_sec(stamp) == pytest.approx(t, abs=1e-6)


def test_stamp_exact_values():
    assert (sec_to_stamp(1.5).sec, sec_to_stamp(1.5).nanosec) == (1, 500_000_000)
    assert (sec_to_stamp(0.9999999999).sec, sec_to_stamp(0.9999999999).nanosec) == (1, 0)
    assert (sec_to_stamp(-0.25).sec, sec_to_stamp(-0.25).nanosec) == (-1, 750_000_000)
    assert stamp_to_sec(Time(sec=3, nanosec=250_000_000)) == 3.25


@pytest.mark.parametrize('t', [math.nan, math.inf, 2.0**31, -(2.0**31) - 1])
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
