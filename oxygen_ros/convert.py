"""ROS message <-> numpy conversion (images, joint states, trajectories, stamps).

Thin glue with no node logic: it imports message types only, never creates a node or touches DDS.
Images come out as uint8 ``[H, W, 3]`` RGB arrays (the layout ``oxygen_ros.core.types.Observation``
expects); joint vectors and trajectories are in robot units (radians / metres / gripper units).

Image decoding is our own numpy/OpenCV path on every machine, also where ``cv_bridge`` exists: for
the supported encodings it gives the same RGB array as ``CvBridge().imgmsg_to_cv2(msg, 'rgb8')``
(padded rows honoured, alpha dropped, mono replicated), whichever way ROS 2 was installed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np
from builtin_interfaces.msg import Duration, Time
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Header
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

__all__ = [
    'SUPPORTED_COMPRESSED_FORMATS', 'SUPPORTED_ENCODINGS', 'ImageConversionError',
    'JointStateError', 'chunk_to_joint_trajectory', 'compressed_to_rgb', 'image_to_rgb',
    'joint_state_to_vector', 'rgb_to_compressed_msg', 'rgb_to_image_msg', 'sec_to_stamp',
    'stamp_to_sec',
]


class ImageConversionError(ValueError):
    """An image message cannot be turned into an RGB array (bad encoding, size or payload)."""


class JointStateError(ValueError):
    """A JointState message does not provide finite positions for the configured joints."""


# encoding -> (channels, cv2 code to RGB or None when the pixels already are RGB)
_ENCODINGS: dict[str, tuple[int, int | None]] = {
    'rgb8': (3, None),
    'bgr8': (3, cv2.COLOR_BGR2RGB),
    'rgba8': (4, cv2.COLOR_RGBA2RGB),
    'bgra8': (4, cv2.COLOR_BGRA2RGB),
    'mono8': (1, cv2.COLOR_GRAY2RGB),
}
# encoding -> cv2 code from RGB to that encoding (for building messages)
_FROM_RGB: dict[str, int | None] = {
    'rgb8': None,
    'bgr8': cv2.COLOR_RGB2BGR,
    'rgba8': cv2.COLOR_RGB2RGBA,
    'bgra8': cv2.COLOR_RGB2BGRA,
    'mono8': cv2.COLOR_RGB2GRAY,
}
SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(_ENCODINGS)
SUPPORTED_COMPRESSED_FORMATS: tuple[str, ...] = ('jpeg', 'png')
_COMPRESSED_TOKENS = {'jpeg', 'jpg', 'png', 'compressed', 'rgb16', 'bgr16', 'mono16', *_ENCODINGS}
_INT32_MAX = 2**31 - 1
_NS = 1_000_000_000


def image_to_rgb(msg: Image) -> np.ndarray:
    """Convert a ``sensor_msgs/Image`` to an RGB array.

    Supports ``rgb8``, ``bgr8``, ``rgba8``, ``bgra8`` (alpha dropped) and ``mono8`` (grey value
    replicated to R, G and B). Rows may be padded (``step > width * channels``);
    ``is_bigendian`` is irrelevant for 8-bit data. Same result as cv_bridge's
    ``imgmsg_to_cv2(msg, 'rgb8')``.

    Returns:
        A new, C-contiguous uint8 array ``[height, width, 3]`` (never a view of ``msg.data``).

    Raises:
        ImageConversionError: unsupported encoding, zero height/width, ``step`` smaller than one
            row, or ``len(msg.data) < step * height``.
    """
    encoding = msg.encoding
    if encoding not in _ENCODINGS:
        raise ImageConversionError(
            f'unsupported image encoding {encoding!r}; supported: {", ".join(SUPPORTED_ENCODINGS)}'
        )
    channels, code = _ENCODINGS[encoding]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height <= 0 or width <= 0:
        raise ImageConversionError(f'image has no pixels: height={height}, width={width}')
    row_bytes = width * channels
    if step < row_bytes:
        raise ImageConversionError(
            f'image step {step} < one {encoding} row of {width} px ({row_bytes} bytes)'
        )
    flat = np.frombuffer(msg.data, dtype=np.uint8)
    if flat.size < step * height:
        raise ImageConversionError(
            f'image data too short: {flat.size} bytes < step*height = {step}*{height} = '
            f'{step * height} ({encoding}, {width}x{height})'
        )
    pixels = flat[: step * height].reshape(height, step)[:, :row_bytes]
    pixels = pixels.reshape(height, width, channels)
    if code is None:
        return pixels.copy()  # own the memory: msg.data may be reused by the caller
    return cv2.cvtColor(np.ascontiguousarray(pixels), code)


def _check_compressed_format(fmt: str) -> None:
    """Raise ImageConversionError unless ``fmt`` describes a JPEG/PNG colour payload.

    Accepts ``"jpeg"``, ``"png"``, ``""`` and compressed_image_transport's
    ``"<orig>; <codec> compressed <enc>"`` / older ``"<orig>; compressed <enc>"`` (no codec: the
    payload is sniffed). ``<orig>`` is the publisher's raw encoding and does not matter here.
    """
    descriptor = fmt.lower().split(';')[-1].split()
    if 'compresseddepth' in fmt.lower() or not set(descriptor) <= _COMPRESSED_TOKENS:
        raise ImageConversionError(
            f'unsupported compressed format {fmt!r}; supported: '
            f'{", ".join(SUPPORTED_COMPRESSED_FORMATS)}'
        )


def compressed_to_rgb(msg: CompressedImage) -> np.ndarray:
    """Decode a JPEG or PNG ``sensor_msgs/CompressedImage`` to an RGB array.

    ``msg.format`` may be ``"jpeg"``, ``"png"``, ``"rgb8; jpeg compressed bgr8"``,
    ``"rgb8; compressed bgr8"`` or empty (the payload is sniffed). The payload is decoded as
    colour (as compressed_image_transport writes it: bgr8 or mono8 order), 16-bit PNGs are scaled
    to 8 bit, EXIF orientation is ignored.

    Returns:
        A uint8 array ``[H, W, 3]`` RGB.

    Raises:
        ImageConversionError: unsupported format string, empty or corrupt payload.
    """
    _check_compressed_format(msg.format)
    buf = np.frombuffer(msg.data, dtype=np.uint8)
    if buf.size == 0:
        raise ImageConversionError(f'compressed image ({msg.format!r}) has no data')
    try:
        bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error as exc:
        raise ImageConversionError(
            f'cannot decode compressed image ({msg.format!r}, {buf.size} bytes): {exc}'
        ) from exc
    if bgr is None or bgr.size == 0:
        raise ImageConversionError(
            f'cannot decode compressed image ({msg.format!r}, {buf.size} bytes): corrupt or '
            'not JPEG/PNG'
        )
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _check_rgb(rgb: np.ndarray) -> np.ndarray:
    arr = np.asarray(rgb)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3 or arr.size == 0:
        raise ValueError(
            f'expected a non-empty uint8 [H, W, 3] RGB array, got {arr.dtype} {arr.shape}'
        )
    return np.ascontiguousarray(arr)


def _header(stamp: Time | float | None, frame_id: str) -> Header:
    if stamp is None:
        stamp = Time()
    elif not isinstance(stamp, Time):
        stamp = sec_to_stamp(float(stamp))
    return Header(stamp=stamp, frame_id=frame_id)


def rgb_to_image_msg(
    rgb: np.ndarray,
    encoding: str = 'rgb8',
    stamp: Time | float | None = None,
    frame_id: str = '',
) -> Image:
    """Build a ``sensor_msgs/Image`` from an RGB array (tests, the sim and tools).

    Args:
        rgb: uint8 ``[H, W, 3]`` RGB.
        encoding: one of ``SUPPORTED_ENCODINGS``; the pixels are converted to it (``mono8`` uses
            OpenCV's luma weights, rgba8/bgra8 get alpha 255). Rows are unpadded.
        stamp: header stamp as a ``builtin_interfaces/Time`` or seconds; None gives zero.
        frame_id: header frame id.

    Raises:
        ValueError: wrong dtype/shape, or unsupported encoding.
    """
    arr = _check_rgb(rgb)
    if encoding not in _FROM_RGB:
        raise ValueError(
            f'unsupported image encoding {encoding!r}; supported: {", ".join(SUPPORTED_ENCODINGS)}'
        )
    code = _FROM_RGB[encoding]
    pixels = arr if code is None else cv2.cvtColor(arr, code)
    height, width = arr.shape[:2]
    channels = _ENCODINGS[encoding][0]
    msg = Image(
        header=_header(stamp, frame_id),
        height=height,
        width=width,
        encoding=encoding,
        is_bigendian=0,
        step=width * channels,
    )
    msg.data = pixels.tobytes()  # bytes, not an ndarray: assigning arrays is very slow
    return msg


def rgb_to_compressed_msg(
    rgb: np.ndarray,
    fmt: str = 'jpeg',
    quality: int = 90,
    stamp: Time | float | None = None,
    frame_id: str = '',
) -> CompressedImage:
    """Encode an RGB array as a JPEG or PNG ``sensor_msgs/CompressedImage``.

    The ``format`` field follows compressed_image_transport: ``"rgb8; jpeg compressed bgr8"`` or
    ``"rgb8; png compressed bgr8"``, so ``image_transport republish`` decodes it back to rgb8.

    Args:
        rgb: uint8 ``[H, W, 3]`` RGB.
        fmt: ``"jpeg"`` (or ``"jpg"``) or ``"png"``.
        quality: JPEG quality 1..100 (ignored for PNG, which is lossless).
        stamp: header stamp as a ``builtin_interfaces/Time`` or seconds; None gives zero.
        frame_id: header frame id.

    Raises:
        ValueError: wrong dtype/shape, unknown format, quality out of range, encoder failure.
    """
    arr = _check_rgb(rgb)
    codec = fmt.strip().lower()
    if codec in ('jpeg', 'jpg'):
        if not 1 <= int(quality) <= 100:
            raise ValueError(f'JPEG quality must be in 1..100, got {quality}')
        codec, ext, params = 'jpeg', '.jpg', [cv2.IMWRITE_JPEG_QUALITY, int(quality)]
    elif codec == 'png':
        ext, params = '.png', []
    else:
        raise ValueError(f'unsupported compressed format {fmt!r}; supported: jpeg, png')
    ok, encoded = cv2.imencode(ext, cv2.cvtColor(arr, cv2.COLOR_RGB2BGR), params)
    if not ok:
        raise ValueError(f'OpenCV failed to encode a {arr.shape} image as {codec}')
    msg = CompressedImage(header=_header(stamp, frame_id), format=f'rgb8; {codec} compressed bgr8')
    msg.data = encoded.tobytes()
    return msg


def joint_state_to_vector(msg: JointState, joint_names: Sequence[str]) -> np.ndarray:
    """Pick the positions of ``joint_names`` out of a JointState, by name.

    The message may list joints in any order and carry extra joints; if a name appears twice the
    first occurrence wins.

    Returns:
        float64 ``[len(joint_names)]`` positions in ``joint_names`` order (robot units).

    Raises:
        JointStateError: ``msg.position`` shorter than ``msg.name``, configured joints missing
            (all listed), or a non-finite position for a configured joint (named).
    """
    names = list(msg.name)
    positions = np.asarray(msg.position, dtype=np.float64)
    if positions.shape[0] < len(names):
        raise JointStateError(
            f'JointState has {len(names)} names but only {positions.shape[0]} positions'
        )
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        index.setdefault(name, i)
    missing = [name for name in joint_names if name not in index]
    if missing:
        raise JointStateError(f'JointState lacks configured joints: {", ".join(missing)}')
    out = positions[[index[name] for name in joint_names]]
    bad = [name for name, value in zip(joint_names, out, strict=True) if not math.isfinite(value)]
    if bad:
        raise JointStateError(f'JointState has non-finite positions for joints: {", ".join(bad)}')
    return out


def chunk_to_joint_trajectory(
    actions: np.ndarray,
    joint_names: Sequence[str],
    stamp: Time | float,
    control_period_s: float,
    frame_id: str = '',
) -> JointTrajectory:
    """Build a JointTrajectory from an action chunk.

    Point ``i`` (0-based) gets ``time_from_start = (i + 1) * control_period_s``: the first action
    is the next command, one control period after the header stamp (the observation stamp). Only
    ``positions`` are filled (velocities/accelerations/effort stay empty). Times are rounded to
    whole nanoseconds per point, so they do not accumulate float error.

    Args:
        actions: ``[H, n]`` finite positions in robot units, ``n == len(joint_names)``, ``H >= 1``.
        joint_names: the ``n`` joint names, in the column order of ``actions``.
        stamp: header stamp (``builtin_interfaces/Time`` or seconds).
        control_period_s: seconds between consecutive points (> 0, finite).
        frame_id: header frame id.

    Raises:
        ValueError: wrong shape, empty chunk, non-finite values (never published), bad period.
    """
    arr = np.asarray(actions, dtype=np.float64)
    names = list(joint_names)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] != len(names):
        raise ValueError(
            f'action chunk must be [H>=1, {len(names)}] for joints {names}, got {arr.shape}'
        )
    if not np.isfinite(arr).all():
        rows, cols = np.nonzero(~np.isfinite(arr))
        raise ValueError(
            f'action chunk has {rows.size} non-finite values (first: step {rows[0]}, joint '
            f'{names[cols[0]]!r}); refusing to publish'
        )
    period = float(control_period_s)
    if not math.isfinite(period) or period <= 0.0:
        raise ValueError(f'control_period_s must be finite and > 0, got {control_period_s}')
    period_ns = period * _NS
    points = []
    for i, row in enumerate(arr):
        sec, nanosec = divmod(round((i + 1) * period_ns), _NS)
        points.append(
            JointTrajectoryPoint(
                positions=row.tolist(), time_from_start=Duration(sec=sec, nanosec=nanosec)
            )
        )
    return JointTrajectory(header=_header(stamp, frame_id), joint_names=names, points=points)


def stamp_to_sec(stamp: Time) -> float:
    """Return the seconds (float) of a ``builtin_interfaces/Time`` (any ``sec``/``nanosec``)."""
    return stamp.sec + stamp.nanosec * 1e-9


def sec_to_stamp(t: float) -> Time:
    """Return a ``builtin_interfaces/Time`` for ``t`` seconds, rounded to the nearest ns.

    Raises:
        ValueError: ``t`` is not finite or outside the int32 seconds range of the message.
    """
    t = float(t)
    if not math.isfinite(t):
        raise ValueError(f'cannot convert non-finite time {t} to a stamp')
    sec = math.floor(t)
    nanosec = round((t - sec) * _NS)
    if nanosec >= _NS:
        sec, nanosec = sec + 1, nanosec - _NS
    if not -(2**31) <= sec <= _INT32_MAX:
        raise ValueError(f'time {t} s is outside the builtin_interfaces/Time range')
    return Time(sec=sec, nanosec=nanosec)


class StampBook:
    """Remembers the exact header stamps of recent inputs by their float-seconds value.

    The observation pipeline works in float seconds, which cannot hold a ROS stamp exactly
    (float64 resolution at 1.7e9 s is ~0.24 us). Outputs stamped "with the observation stamp" look
    the original message stamp up here, so ``header.stamp`` matches the input bit for bit.
    """

    def __init__(self, capacity: int = 512) -> None:
        from collections import OrderedDict

        self._capacity = capacity
        self._stamps: "OrderedDict[float, Time]" = OrderedDict()

    def remember(self, stamp: Time) -> float:
        """Record ``stamp``; returns its float-seconds value (the key)."""
        t = stamp_to_sec(stamp)
        self._stamps[t] = stamp
        self._stamps.move_to_end(t)
        while len(self._stamps) > self._capacity:
            self._stamps.popitem(last=False)
        return t

    def exact(self, t: float) -> Time:
        """The remembered stamp for ``t`` seconds, else :func:`sec_to_stamp` of ``t``."""
        found = self._stamps.get(t)
        return Time(sec=found.sec, nanosec=found.nanosec) if found is not None else sec_to_stamp(t)
