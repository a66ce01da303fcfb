"""ROS image messages <-> uint8 RGB arrays (``sensor_msgs/Image`` and ``CompressedImage``).

Thin glue with no node logic: it imports message types only, never creates a node or touches DDS.
Images come out as uint8 ``[H, W, 3]`` RGB arrays (the layout ``oxygen_ros.core.types.Observation``
expects).

Image decoding is our own numpy/OpenCV path on every machine, also where ``cv_bridge`` exists: for
the supported encodings it gives the same RGB array as ``CvBridge().imgmsg_to_cv2(msg, 'rgb8')``
(padded rows honoured, alpha dropped, mono replicated), whichever way ROS 2 was installed.
"""

from __future__ import annotations

import cv2
import numpy as np
from builtin_interfaces.msg import Time
from sensor_msgs.msg import CompressedImage, Image

from oxygen_ros.ros.convert.stamps import make_header

__all__ = [
    'SUPPORTED_COMPRESSED_FORMATS', 'SUPPORTED_ENCODINGS', 'ImageConversionError',
    'compressed_to_rgb', 'image_to_rgb', 'rgb_to_compressed_msg', 'rgb_to_image_msg',
]


class ImageConversionError(ValueError):
    """An image message cannot be turned into an RGB array (bad encoding, size or payload)."""


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
        header=make_header(stamp, frame_id),
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
    msg = CompressedImage(header=make_header(stamp, frame_id), format=f'rgb8; {codec} compressed bgr8')
    msg.data = encoded.tobytes()
    return msg
