"""ROS image messages <-> uint8 RGB arrays (``sensor_msgs/Image`` and ``CompressedImage``).

Thin glue with no node logic: it imports message types only, never creates a node or touches DDS.
Images come out as uint8 ``[H, W, 3]`` RGB arrays (the layout ``oxygen_ros.core.types.Observation``
expects).

Image decoding is our own numpy/OpenCV path on every machine, also where ``cv_bridge`` exists: for
the supported encodings it gives the same RGB array as ``CvBridge().imgmsg_to_cv2(msg, 'rgb8')``
(padded rows honoured, alpha dropped, mono replicated), whichever way ROS 2 was installed.

Hostile payloads: :func:`image_size` reads an image's width and height without decoding it (the
raw message's fields, the PNG ``IHDR`` chunk, the JPEG ``SOF`` segment), so a small compressed
payload that would decode to a huge picture (a "decompression bomb": 389 KB of PNG for 20000 x
20000 pixels) is refused before any pixel is allocated; only PNG and JPEG payloads ever reach a
decoder, and a JPEG with an absurd number of progressive scans is refused as well. OpenCV's own
log lines are silenced when this module is imported: a corrupt payload is reported by the caller
(the node counts it and logs the first of its kind), not by a stderr line per message.
"""

from __future__ import annotations

import cv2
import numpy as np
from builtin_interfaces.msg import Time
from sensor_msgs.msg import CompressedImage, Image

from oxygen_ros.ros.convert.stamps import make_header

__all__ = [
    "MAX_JPEG_SCANS",
    "SUPPORTED_COMPRESSED_FORMATS",
    "SUPPORTED_ENCODINGS",
    "ImageConversionError",
    "compressed_to_rgb",
    "image_size",
    "image_to_rgb",
    "rgb_to_compressed_msg",
    "rgb_to_image_msg",
]

if hasattr(cv2.utils, "logging"):  # see the module doc; OpenCV 5 moved it here from cv2.setLogLevel (4.x)
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
else:
    cv2.setLogLevel(0)  # type: ignore[attr-defined]  # 0 = LOG_LEVEL_SILENT in OpenCV 4.x (the stubs are 5.x)

#: Most scans (SOS segments) a JPEG may hold: baseline has 1 per component, progressive ~10.
MAX_JPEG_SCANS = 100
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (SOF0-SOF15 except DHT C4, JPG C8, DAC CC): hold height and width
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class ImageConversionError(ValueError):
    """An image message cannot be turned into an RGB array (bad encoding, size or payload)."""


# encoding -> (channels, cv2 code to RGB or None when the pixels already are RGB)
_ENCODINGS: dict[str, tuple[int, int | None]] = {
    "rgb8": (3, None),
    "bgr8": (3, cv2.COLOR_BGR2RGB),
    "rgba8": (4, cv2.COLOR_RGBA2RGB),
    "bgra8": (4, cv2.COLOR_BGRA2RGB),
    "mono8": (1, cv2.COLOR_GRAY2RGB),
}
# encoding -> cv2 code from RGB to that encoding (for building messages)
_FROM_RGB: dict[str, int | None] = {
    "rgb8": None,
    "bgr8": cv2.COLOR_RGB2BGR,
    "rgba8": cv2.COLOR_RGB2RGBA,
    "bgra8": cv2.COLOR_RGB2BGRA,
    "mono8": cv2.COLOR_RGB2GRAY,
}
SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(_ENCODINGS)
SUPPORTED_COMPRESSED_FORMATS: tuple[str, ...] = ("jpeg", "png")
_COMPRESSED_TOKENS = {"jpeg", "jpg", "png", "compressed", "rgb16", "bgr16", "mono16", *_ENCODINGS}


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
            f"unsupported image encoding {encoding!r}; supported: {', '.join(SUPPORTED_ENCODINGS)}"
        )
    channels, code = _ENCODINGS[encoding]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height <= 0 or width <= 0:
        raise ImageConversionError(f"image has no pixels: height={height}, width={width}")
    row_bytes = width * channels
    if step < row_bytes:
        raise ImageConversionError(f"image step {step} < one {encoding} row of {width} px ({row_bytes} bytes)")
    flat = np.frombuffer(msg.data, dtype=np.uint8)
    if flat.size < step * height:
        raise ImageConversionError(
            f"image data too short: {flat.size} bytes < step*height = {step}*{height} = "
            f"{step * height} ({encoding}, {width}x{height})"
        )
    pixels = flat[: step * height].reshape(height, step)[:, :row_bytes]
    pixels = pixels.reshape(height, width, channels)
    if code is None:
        owned: np.ndarray = pixels.copy()  # own the memory: msg.data may be reused by the caller
        return owned
    rgb: np.ndarray = cv2.cvtColor(np.ascontiguousarray(pixels), code)
    return rgb


def image_size(msg: Image | CompressedImage) -> tuple[int, int]:
    """``(width, height)`` in pixels of an image message, read without decoding its pixels.

    Raw images: the message fields. Compressed images: the PNG ``IHDR`` chunk or the JPEG ``SOF``
    segment (any JPEG process: baseline, progressive, lossless, arithmetic); the cost is a header
    walk plus, for JPEG, one vectorised count of its scans.

    Raises:
        ImageConversionError: a compressed payload that is not PNG or JPEG, a truncated or
            malformed header, or a JPEG with more than :data:`MAX_JPEG_SCANS` scans.
    """
    if isinstance(msg, Image):
        return int(msg.width), int(msg.height)
    head = bytes(msg.data[:24])
    if head[:8] == _PNG_MAGIC:
        if len(head) < 24 or head[12:16] != b"IHDR":
            raise ImageConversionError("PNG without an IHDR chunk first (truncated or malformed)")
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(np.frombuffer(msg.data, dtype=np.uint8))
    raise ImageConversionError(f"compressed payload is neither PNG nor JPEG (starts with {head[:4]!r})")


def _jpeg_size(buf: np.ndarray) -> tuple[int, int]:
    """``(width, height)`` of a JPEG from its first SOF segment (see :func:`image_size`)."""
    scans = int(np.count_nonzero((buf[:-1] == 0xFF) & (buf[1:] == 0xDA)))  # FF DA never occurs in entropy data
    if scans > MAX_JPEG_SCANS:
        raise ImageConversionError(f"JPEG with {scans} scans (more than {MAX_JPEG_SCANS}): refused undecoded")
    i, n = 2, buf.size
    while i + 4 <= n:
        if buf[i] != 0xFF:
            raise ImageConversionError(f"malformed JPEG header (no marker at byte {i})")
        marker = int(buf[i + 1])
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # standalone markers: no length
            i += 2
            continue
        if marker in (0xD9, 0xDA):
            break  # end of image / start of scan before any frame header
        length = (int(buf[i + 2]) << 8) | int(buf[i + 3])
        if length < 2:
            raise ImageConversionError(f"malformed JPEG segment length {length} at byte {i}")
        if marker in _JPEG_SOF:
            if i + 9 > n:
                break
            height = (int(buf[i + 5]) << 8) | int(buf[i + 6])
            width = (int(buf[i + 7]) << 8) | int(buf[i + 8])
            return width, height
        i += 2 + length
    raise ImageConversionError("JPEG without a frame header (truncated or malformed)")


def _check_compressed_format(fmt: str) -> None:
    """Raise ImageConversionError unless ``fmt`` describes a JPEG/PNG colour payload.

    Accepts ``"jpeg"``, ``"png"``, ``""`` and compressed_image_transport's
    ``"<orig>; <codec> compressed <enc>"`` / older ``"<orig>; compressed <enc>"`` (no codec: the
    payload is sniffed). ``<orig>`` is the publisher's raw encoding and does not matter here.
    """
    descriptor = fmt.lower().split(";")[-1].split()
    if "compresseddepth" in fmt.lower() or not set(descriptor) <= _COMPRESSED_TOKENS:
        raise ImageConversionError(
            f"unsupported compressed format {fmt!r}; supported: {', '.join(SUPPORTED_COMPRESSED_FORMATS)}"
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
        ImageConversionError: unsupported format string, empty or corrupt payload, a payload that
            is not PNG or JPEG (whatever ``format`` says), or one :func:`image_size` refuses.
    """
    _check_compressed_format(msg.format)
    buf = np.frombuffer(msg.data, dtype=np.uint8)
    if buf.size == 0:
        raise ImageConversionError(f"compressed image ({msg.format!r}) has no data")
    image_size(msg)  # PNG or JPEG only (no other decoder is ever reached), header well-formed
    try:
        bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error as exc:
        raise ImageConversionError(f"cannot decode compressed image ({msg.format!r}, {buf.size} bytes): {exc}") from exc
    if bgr is None or bgr.size == 0:
        raise ImageConversionError(
            f"cannot decode compressed image ({msg.format!r}, {buf.size} bytes): corrupt or not JPEG/PNG"
        )
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _check_rgb(rgb: np.ndarray) -> np.ndarray:
    arr = np.asarray(rgb)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3 or arr.size == 0:
        raise ValueError(f"expected a non-empty uint8 [H, W, 3] RGB array, got {arr.dtype} {arr.shape}")
    return np.ascontiguousarray(arr)


def rgb_to_image_msg(
    rgb: np.ndarray,
    encoding: str = "rgb8",
    stamp: Time | float | None = None,
    frame_id: str = "",
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
        raise ValueError(f"unsupported image encoding {encoding!r}; supported: {', '.join(SUPPORTED_ENCODINGS)}")
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
    fmt: str = "jpeg",
    quality: int = 90,
    stamp: Time | float | None = None,
    frame_id: str = "",
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
    if codec in ("jpeg", "jpg"):
        if not 1 <= int(quality) <= 100:
            raise ValueError(f"JPEG quality must be in 1..100, got {quality}")
        codec, ext, params = "jpeg", ".jpg", [cv2.IMWRITE_JPEG_QUALITY, int(quality)]
    elif codec == "png":
        ext, params = ".png", []
    else:
        raise ValueError(f"unsupported compressed format {fmt!r}; supported: jpeg, png")
    ok, encoded = cv2.imencode(ext, cv2.cvtColor(arr, cv2.COLOR_RGB2BGR), params)
    if not ok:
        raise ValueError(f"OpenCV failed to encode a {arr.shape} image as {codec}")
    msg = CompressedImage(header=make_header(stamp, frame_id), format=f"rgb8; {codec} compressed bgr8")
    msg.data = encoded.tobytes()
    return msg
