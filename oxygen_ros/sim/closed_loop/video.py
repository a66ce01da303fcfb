"""The closed loop's episode video: the top camera with overlays, written frame by frame (ROS-free).

``closed_loop --video PATH.mp4`` feeds every top-camera frame the loop monitor receives
(``cam_high/image_raw/compressed``) to :class:`EpisodeVideo`, which draws the overlays and writes
the frame at once (OpenCV ``VideoWriter``, ``mp4v``): memory stays one frame whatever the episode
length; at most ``max_frames`` frames are written, later ones are counted as ``dropped``.

Overlays (:func:`draw_overlay`, on a copy scaled up to at least :data:`MIN_WIDTH` pixels wide):

- top line: sim time since the video's first frame (from the image stamps; the monitor sees its
  first frame only once its subscription matched, so this starts later than the sim), the sim's
  episode time (its latest ``episode_time_s`` status, ``-`` before the episode starts) and the
  chunks seen so far;
- a red disc and ``NEW CHUNK`` on the frames where a chunk arrived since the previous frame (held
  for :data:`MARKER_FRAMES` frames so it can be seen);
- bottom lines: the latest streamed answer (header stripped; in progress while it streams), cut to
  fit, non-ASCII characters shown as ``?`` (OpenCV's Hershey fonts are ASCII-only).

The video plays at ``fps`` frames per second, the camera's rate in sim time (a renderer's skipped
frame makes it play slightly fast).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MARKER_FRAMES", "MIN_WIDTH", "EpisodeVideo", "FrameInfo", "draw_overlay", "overlay_lines"]

MIN_WIDTH = 480
"""Frames narrower than this are scaled up (by a whole factor) so the overlay text is readable."""
MARKER_FRAMES = 3
"""Frames the new-chunk marker stays on after a chunk arrived."""
SUFFIXES = (".mp4",)


@dataclass(frozen=True)
class FrameInfo:
    """What the overlay of one frame shows.

    Attributes:
        sim_time_s: sim seconds since the video's first frame.
        episode_time_s: the sim's episode time (``None``: not reported yet).
        chunks: chunks seen so far.
        new_chunk: a chunk arrived recently (draw the marker).
        answer: the latest streamed answer ("" = none yet).
    """

    sim_time_s: float
    episode_time_s: float | None
    chunks: int
    new_chunk: bool
    answer: str = ""


def _ascii(text: str) -> str:
    return "".join(c if 32 <= ord(c) < 127 else "?" for c in " ".join(text.split()))


def overlay_lines(info: FrameInfo, width_chars: int = 48, answer_lines: int = 2) -> tuple[str, list[str]]:
    """The overlay's top line and its answer lines (at most ``answer_lines``, the last cut with
    ``...`` when the answer is longer)."""
    ep = "-" if info.episode_time_s is None or not math.isfinite(info.episode_time_s) else f"{info.episode_time_s:.2f}"
    top = f"video {info.sim_time_s:5.2f} s  episode {ep} s  chunks {info.chunks}"
    answer = _ascii(info.answer)
    if not answer:
        return top, []
    lines = textwrap.wrap("A: " + answer, max(8, width_chars)) or []
    if len(lines) > answer_lines:
        lines = lines[:answer_lines]
        lines[-1] = lines[-1][: max(0, width_chars - 3)] + "..."
    return top, lines


def draw_overlay(rgb: np.ndarray, info: FrameInfo) -> np.ndarray:
    """``rgb`` ``[H, W, 3]`` uint8 scaled up to at least :data:`MIN_WIDTH` wide, with the
    overlays; returned as BGR (OpenCV's order), a new array.

    Raises:
        ValueError: not an ``[H, W, 3]`` uint8 image.
    """
    import cv2

    img = np.asarray(rgb)
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8 or min(img.shape[:2]) < 1:
        raise ValueError(f"expected an [H, W, 3] uint8 image, got shape {img.shape} dtype {img.dtype}")
    k = max(1, math.ceil(MIN_WIDTH / img.shape[1]))
    if k > 1:
        img = cv2.resize(img, (img.shape[1] * k, img.shape[0] * k), interpolation=cv2.INTER_LINEAR)
    out = np.ascontiguousarray(img[:, :, ::-1])
    h, w = out.shape[:2]
    font, scale, thick = cv2.FONT_HERSHEY_SIMPLEX, 0.45, 1
    line_h = 18
    top, answer = overlay_lines(info, width_chars=max(8, w // 9))

    def text(s: str, y: int, color: tuple[int, int, int]) -> None:
        cv2.putText(out, s, (6, y), font, scale, (0, 0, 0), thick + 2, cv2.LINE_AA)
        cv2.putText(out, s, (6, y), font, scale, color, thick, cv2.LINE_AA)

    text(top, line_h, (255, 255, 255))
    if info.new_chunk:
        cv2.circle(out, (w - 16, 16), 9, (0, 0, 255), -1, cv2.LINE_AA)
        cv2.putText(out, "NEW CHUNK", (w - 112, 21), font, scale, (0, 0, 255), thick + 1, cv2.LINE_AA)
    for i, s in enumerate(answer):
        text(s, h - 8 - (len(answer) - 1 - i) * line_h, (120, 255, 255))
    return out


class EpisodeVideo:
    """Writes the episode video frame by frame (see the module doc).

    Args:
        path: the ``.mp4`` file (its folder is created).
        fps: frames per second of the video (the camera rate in sim time).
        max_frames: frames written at most; later ones are dropped and counted.

    Raises:
        ValueError: another suffix than ``.mp4``, or ``fps`` / ``max_frames`` not positive.
    """

    def __init__(self, path: str | Path, fps: float, max_frames: int = 20_000) -> None:
        self.path = Path(path)
        if self.path.suffix.lower() not in SUFFIXES:
            raise ValueError(f"--video must name an .mp4 file, got {str(path)!r}")
        if not (fps > 0 and math.isfinite(fps)) or max_frames < 1:
            raise ValueError(f"video fps and max_frames must be positive, got {fps}, {max_frames}")
        self.fps, self.max_frames = float(fps), int(max_frames)
        self.frames = 0
        self.dropped = 0  # over max_frames, another size than the first frame, or unusable
        self.size: tuple[int, int] | None = None  # (width, height) of the written frames
        self._writer: Any = None
        self._t0: float | None = None
        self._chunks_seen = 0
        self._marker_left = 0
        self.error = ""

    def frame_info(self, stamp: float, episode_time_s: float | None, chunks: int, answer: str) -> FrameInfo:
        """The overlay values of the frame stamped ``stamp`` (sim seconds) given the loop's state
        now; keeps the new-chunk marker on for :data:`MARKER_FRAMES` frames after a chunk."""
        if self._t0 is None:
            self._t0 = stamp
        if chunks > self._chunks_seen:
            self._chunks_seen = chunks
            self._marker_left = MARKER_FRAMES
        new = self._marker_left > 0
        self._marker_left = max(0, self._marker_left - 1)
        return FrameInfo(stamp - self._t0, episode_time_s, chunks, new, answer)

    def add(self, rgb: np.ndarray, info: FrameInfo) -> bool:
        """Draw the overlays on ``rgb`` and write it; returns whether it was written (else it is
        counted in ``dropped``)."""
        import cv2

        if self.frames >= self.max_frames or self.error:
            self.dropped += 1
            return False
        try:
            bgr = draw_overlay(rgb, info)
        except ValueError:
            self.dropped += 1
            return False
        size = (bgr.shape[1], bgr.shape[0])
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = cv2.VideoWriter(str(self.path), cv2.VideoWriter.fourcc(*"mp4v"), self.fps, size)
            if not self._writer.isOpened():
                self.error = f"OpenCV cannot write {self.path} (mp4v)"
                self._writer = None
                self.dropped += 1
                return False
            self.size = size
        elif size != self.size:
            self.dropped += 1
            return False
        try:
            self._writer.write(bgr)
        except cv2.error as exc:  # a full disk, a codec failure: stop writing, say why
            self.error = f"writing {self.path} failed: {exc}"
            self.dropped += 1
            return False
        self.frames += 1
        return True

    def close(self) -> dict[str, Any]:
        """Finish the file; returns ``{"path", "frames", "dropped", "fps", "size", "error"}``
        (``path`` ``None`` when no frame was written)."""
        if self._writer is not None:
            self._writer.release()
            self._writer = None
        return {
            "path": str(self.path) if self.frames else None,
            "frames": self.frames,
            "dropped": self.dropped,
            "fps": self.fps,
            "size": list(self.size) if self.size else None,
            "error": self.error or ("" if self.frames else "no camera frame received"),
        }
