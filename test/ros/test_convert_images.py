"""Tests for oxygen_ros.ros.convert.images: images (raw and compressed sensor_msgs/Image → RGB and back); pure
message construction, no DDS."""

from __future__ import annotations

import os

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")  # DDS stays on this host


import cv2
import numpy as np
import pytest
from builtin_interfaces.msg import Time
from sensor_msgs.msg import CompressedImage, Image

from oxygen_ros.ros.convert import (
    SUPPORTED_ENCODINGS,
    ImageConversionError,
    JointStateError,
    compressed_to_rgb,
    image_size,
    image_to_rgb,
    rgb_to_compressed_msg,
    rgb_to_image_msg,
)

COLOUR_ENCODINGS = ("rgb8", "bgr8", "rgba8", "bgra8")
# (channels, RGB->encoding channel order) for building messages by hand, independent of convert.py
LAYOUT = {"rgb8": (3, [0, 1, 2]), "bgr8": (3, [2, 1, 0]), "rgba8": (4, [0, 1, 2]), "bgra8": (4, [2, 1, 0])}


def _picture(h: int = 6, w: int = 5, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _raw_msg(rgb: np.ndarray, encoding: str, pad: int = 0, extra: int = 0) -> Image:
    """Build an Image by hand (numpy only), rows padded with ``pad`` junk bytes."""
    h, w, _ = rgb.shape
    if encoding == "mono8":
        pixels = rgb[:, :, :1]
    else:
        channels, order = LAYOUT[encoding]
        pixels = np.full((h, w, channels), 255, np.uint8)  # alpha = 255
        pixels[:, :, :3] = rgb[:, :, order]
    row = pixels.reshape(h, -1)
    junk = np.full((h, pad), 0xAB, np.uint8)
    data = np.concatenate([row, junk], axis=1).tobytes() + b"\x7f" * extra
    msg = Image(height=h, width=w, encoding=encoding, step=row.shape[1] + pad)
    msg.data = data
    return msg


@pytest.mark.parametrize("encoding", COLOUR_ENCODINGS)
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


@pytest.mark.parametrize("encoding", SUPPORTED_ENCODINGS)
def test_padded_rows_and_trailing_bytes(encoding):
    rgb = _picture(5, 3, seed=1)
    if encoding == "mono8":
        rgb = np.repeat(rgb[:, :, :1], 3, axis=2)
    for pad, extra in ((1, 0), (7, 0), (13, 5)):
        out = image_to_rgb(_raw_msg(rgb, encoding, pad=pad, extra=extra))
        np.testing.assert_array_equal(out, rgb)
        assert out.flags.c_contiguous


def test_mono8_replicated_to_three_channels():
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    msg = Image(height=3, width=4, encoding="mono8", step=4)
    msg.data = grey.tobytes()
    out = image_to_rgb(msg)
    assert out.shape == (3, 4, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], grey)


def test_result_does_not_alias_message_data():
    rgb = _picture()
    msg = _raw_msg(rgb, "rgb8")
    out = image_to_rgb(msg)
    out[:] = 0
    np.testing.assert_array_equal(image_to_rgb(msg), rgb)


@pytest.mark.parametrize("encoding", SUPPORTED_ENCODINGS)
def test_round_trip_through_rgb_to_image_msg(encoding):
    rgb = _picture(seed=2)
    if encoding == "mono8":
        rgb = np.repeat(rgb[:, :, :1], 3, axis=2)
    msg = rgb_to_image_msg(rgb, encoding, stamp=12.5, frame_id="cam")
    assert msg.encoding == encoding and msg.header.frame_id == "cam"
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (12, 500_000_000)
    assert msg.step * msg.height == len(msg.data)
    np.testing.assert_array_equal(image_to_rgb(msg), rgb)


@pytest.mark.parametrize("encoding", SUPPORTED_ENCODINGS)
def test_matches_rosbags_image(encoding):
    """The path used where cv_bridge is absent (rosbags-image) agrees on unpadded images."""
    image = pytest.importorskip("rosbags.image")
    rgb = _picture(8, 9, seed=3)
    msg = _raw_msg(rgb, encoding)
    np.testing.assert_array_equal(image_to_rgb(msg), image.message_to_cvimage(msg, "rgb8"))


def test_unsupported_encoding_names_it_and_the_supported_list():
    msg = Image(height=2, width=2, encoding="16UC1", step=4)
    msg.data = bytes(8)
    with pytest.raises(ImageConversionError, match=r"'16UC1'.*rgb8.*bgr8.*mono8"):
        image_to_rgb(msg)


@pytest.mark.parametrize(
    "height, width, step, size, pattern",
    [
        (4, 4, 12, 47, "too short"),  # one byte short
        (4, 4, 12, 0, "too short"),
        (4, 4, 11, 48, "step"),  # step smaller than a row
        (0, 4, 12, 0, "no pixels"),
        (4, 0, 0, 0, "no pixels"),
    ],
)
def test_bad_geometry_raises(height, width, step, size, pattern):
    msg = Image(height=height, width=width, encoding="rgb8", step=step)
    msg.data = bytes(size)
    with pytest.raises(ImageConversionError, match=pattern):
        image_to_rgb(msg)


def test_image_conversion_error_is_a_value_error():
    assert issubclass(ImageConversionError, ValueError)
    assert issubclass(JointStateError, ValueError)


def test_png_round_trip_is_exact():
    rgb = _picture(16, 24, seed=4)
    msg = rgb_to_compressed_msg(rgb, "png", stamp=Time(sec=3, nanosec=4), frame_id="wrist")
    assert msg.format == "rgb8; png compressed bgr8"
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id) == (3, 4, "wrist")
    np.testing.assert_array_equal(compressed_to_rgb(msg), rgb)


def test_jpeg_round_trip_is_close_and_keeps_colours():
    smooth = np.zeros((32, 48, 3), np.uint8)
    smooth[:16, :, 0] = 255  # red top half
    smooth[16:, :, 2] = 255  # blue bottom half
    msg = rgb_to_compressed_msg(smooth, "jpeg", quality=95)
    assert msg.format == "rgb8; jpeg compressed bgr8"
    out = compressed_to_rgb(msg)
    assert out.shape == smooth.shape and out.dtype == np.uint8
    assert np.abs(out.astype(int) - smooth).mean() < 4.0
    assert out[4, 4, 0] > 240 and out[4, 4, 2] < 15  # still red, not swapped to blue
    assert out[28, 4, 2] > 240 and out[28, 4, 0] < 15


@pytest.mark.parametrize(
    "fmt",
    [
        "jpeg",
        "png",
        "rgb8; jpeg compressed bgr8",
        "rgb8; compressed bgr8",
        "JPEG",
        "",
        "bayer_rggb8; png compressed bgr8",
    ],
)
def test_compressed_format_strings(fmt):
    rgb = _picture(8, 8, seed=5)
    src = rgb_to_compressed_msg(rgb, "png")
    msg = CompressedImage(format=fmt)
    msg.data = bytes(src.data)
    np.testing.assert_array_equal(compressed_to_rgb(msg), rgb)  # payload sniffed, PNG exact


def test_grey_jpeg_decodes_to_three_channels():
    import cv2

    grey = np.full((8, 8), 128, np.uint8)
    ok, buf = cv2.imencode(".jpg", grey)
    assert ok
    msg = CompressedImage(format="mono8; jpeg compressed mono8")
    msg.data = buf.tobytes()
    out = compressed_to_rgb(msg)
    assert out.shape == (8, 8, 3)
    assert np.abs(out.astype(int) - 128).max() <= 2


@pytest.mark.parametrize(
    "fmt, payload",
    [
        ("jpeg", b""),
        ("jpeg", bytes(range(256)) * 4),
        ("png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40),
        ("jpeg", b"\xff\xd8\xff\xe0garbage"),
    ],
)
def test_corrupt_compressed_raises(fmt, payload):
    msg = CompressedImage(format=fmt)
    msg.data = payload
    with pytest.raises(ImageConversionError):
        compressed_to_rgb(msg)


def test_truncated_png_raises():
    msg = rgb_to_compressed_msg(_picture(16, 16, seed=6), "png")
    data = bytes(msg.data)
    msg.data = data[: len(data) // 2]
    with pytest.raises(ImageConversionError):
        compressed_to_rgb(msg)


@pytest.mark.parametrize("fmt", ["16UC1; compressedDepth png", "16UC1; compressedDepth", "h264", "theora", "webp"])
def test_unsupported_compressed_format_raises(fmt):
    msg = rgb_to_compressed_msg(_picture(), "png")
    msg.format = fmt
    with pytest.raises(ImageConversionError, match="unsupported"):
        compressed_to_rgb(msg)


def test_rgb_builders_reject_bad_input():
    with pytest.raises(ValueError):
        rgb_to_image_msg(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError):
        rgb_to_image_msg(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="encoding"):
        rgb_to_image_msg(np.zeros((4, 4, 3), np.uint8), encoding="yuv422")
    with pytest.raises(ValueError, match="format"):
        rgb_to_compressed_msg(np.zeros((4, 4, 3), np.uint8), fmt="webp")
    with pytest.raises(ValueError, match="quality"):
        rgb_to_compressed_msg(np.zeros((4, 4, 3), np.uint8), quality=0)


def test_large_image_msg_round_trip():
    """A 480x640 frame goes through rgb_to_image_msg (bytes assignment) and back unchanged."""
    rgb = _picture(480, 640, seed=7)
    out = image_to_rgb(rgb_to_image_msg(rgb, "bgr8"))
    np.testing.assert_array_equal(out, rgb)


# ------------------------------------------------------------------ sizes read before decoding
def _payload(data: bytes, fmt: str = "png") -> CompressedImage:
    msg = CompressedImage(format=fmt)
    msg.data = data
    return msg


@pytest.mark.parametrize(
    "fmt, params",
    [(".png", []), (".jpg", []), (".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])],
    ids=["png", "jpeg", "progressive jpeg"],
)
def test_image_size_is_read_from_the_header(fmt, params):
    ok, buf = cv2.imencode(fmt, _picture(37, 53), params)
    assert ok
    assert image_size(_payload(buf.tobytes())) == (53, 37)
    assert image_size(rgb_to_image_msg(_picture(37, 53))) == (53, 37)


def test_a_decompression_bomb_is_sized_without_decoding_it():
    """389 KB of PNG that would decode to 20000 x 20000 x 3 bytes (1.2 GB): read in microseconds."""
    from oxygen_ros.ros.ingress.hostile import png_bomb

    bomb = png_bomb(2000)  # (a 20000 one takes seconds to build; the header is the same form)
    assert image_size(_payload(bomb)) == (2000, 2000)
    msg = _payload(bomb[:33] + bytes(100))  # the IHDR only: nothing past it is read
    assert image_size(msg) == (2000, 2000)


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "neither PNG nor JPEG"),
        (b"GIF89a" + bytes(64), "neither PNG nor JPEG"),
        (b"BM" + bytes(64), "neither PNG nor JPEG"),
        (b"\x89PNG\r\n\x1a\n" + bytes(8), "IHDR"),
        (b"\xff\xd8\xff", "frame header"),
        (b"\xff\xd8\xff\xe0\x00\x01", "segment length"),
        (b"\xff\xd8" + b"\xff\xda\x00\x02" * 101, "scans"),
    ],
    ids=["empty", "gif", "bmp", "png without IHDR", "truncated jpeg", "bad segment", "jpeg with 101 scans"],
)
def test_payloads_that_are_not_well_formed_png_or_jpeg_are_refused_before_any_decoder(data, match):
    with pytest.raises(ImageConversionError, match=match):
        image_size(_payload(data))
    if data:
        with pytest.raises(ImageConversionError):
            compressed_to_rgb(_payload(data, ""))  # the sniffing path never reaches another decoder


def test_opencv_prints_nothing_for_a_corrupt_payload(capfd):
    """A truncated PNG is an ImageConversionError for the caller to count, not a stderr line."""
    ok, buf = cv2.imencode(".png", _picture(32, 32))
    for _ in range(3):
        with pytest.raises(ImageConversionError):
            compressed_to_rgb(_payload(buf.tobytes()[:60]))
    out, err = capfd.readouterr()
    assert "WARN" not in err and "ERROR" not in err and "libpng" not in err, err
