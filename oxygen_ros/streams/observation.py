"""Observation assembly: newest image per camera + the matching joint state -> one Observation.

ROS-free (unit-testable): times are float seconds from message header stamps; image payloads are
opaque objects turned into uint8 ``[H, W, 3]`` RGB by the ``decode`` callable given at construction,
lazily — only the image a frame actually uses is decoded, so a flooded camera costs no decoding.

Rules (a frame takes the newest complete observation; issue #4):

- reference time ``t_ref`` = newest stamp received on any input (cameras or joint states);
- a camera whose newest good image is older than ``t_ref - camera_max_age_s`` is *stale*: its
  slot is masked (``None``) and reported; a camera that never delivered is reported the same way;
- the state is the buffered joint state nearest to the newest image used, if within
  ``state_tolerance_s``; otherwise no frame (``waiting``);
- no usable image or no joint state -> no frame and a ``waiting for ...`` reason;
- per input stream, a stamp older than that stream's newest by more than ``time_jump_s`` is a
  backwards time jump (bag loop, sim reset): every buffer is cleared and the message accepted;
  an older-but-close (or equal) stamp is an out-of-order message: dropped and counted.

Thread-safety: every public method may be called from any thread (one internal lock; decoding
runs outside it).
"""

from __future__ import annotations

import collections
import enum
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oxygen_ros.core.types import Observation

__all__ = ["AssemblerConfig", "Assembly", "ObservationAssembler", "Verdict"]

_STATE = "<joint_state>"


class Verdict(enum.Enum):
    """What :class:`ObservationAssembler` did with an input message."""

    ACCEPTED = "accepted"
    OUT_OF_ORDER = "out_of_order"  # dropped and counted
    TIME_JUMP = "time_jump"  # buffers cleared, message accepted


@dataclass(frozen=True)
class AssemblerConfig:
    """Assembly settings.

    Attributes:
        slots: model image slots in order (e.g. ``base_0_rgb, left_wrist_0_rgb, right_wrist_0_rgb``).
        cameras: the slots that have a camera (a subset of ``slots``); the others are always masked.
        state_tolerance_s: largest absolute difference of image and state stamps accepted, seconds (>= 0).
        camera_max_age_s: a camera older than this behind ``t_ref`` is stale, seconds (> 0).
        time_jump_s: a stamp this much older than its stream's newest is a time jump, seconds (> 0).
        state_history: joint states kept for matching (newest first out).
        labels: optional slot -> display name (e.g. the topic) used in messages.
    """

    slots: tuple[str, ...]
    cameras: tuple[str, ...]
    state_tolerance_s: float = 0.1
    camera_max_age_s: float = 0.5
    time_jump_s: float = 1.0
    state_history: int = 256
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [c for c in self.cameras if c not in self.slots]
        if unknown:
            raise ValueError(f"camera slots {unknown} are not model slots {list(self.slots)}")
        if not self.state_tolerance_s >= 0 or not self.camera_max_age_s > 0 or not self.time_jump_s > 0:
            raise ValueError("state_tolerance_s must be >= 0, camera_max_age_s and time_jump_s > 0")


@dataclass
class Assembly:
    """Result of :meth:`ObservationAssembler.assemble`.

    Attributes:
        observation: the frame's input, or None when there is nothing (new) to run.
        waiting: why there is no observation (``waiting for ...``), None otherwise.
        stale: human-readable notes on masked cameras (stale / never received).
        errors: decode errors of images dropped in this call (counted in ``decode_errors``).
    """

    observation: Observation | None = None
    waiting: str | None = None
    stale: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class _Camera:
    __slots__ = ("raw", "raw_stamp", "rgb", "rgb_stamp", "newest", "received", "since_frame")

    def __init__(self) -> None:
        self.raw: Any = None  # newest undecoded payload
        self.raw_stamp = 0.0
        self.rgb: np.ndarray | None = None  # newest successfully decoded image
        self.rgb_stamp = 0.0
        self.newest: float | None = None  # newest accepted stamp (ordering)
        self.received = 0
        self.since_frame = False  # delivered an image since the last assembled observation


class ObservationAssembler:
    """Keeps the newest input of every stream and assembles observations from them."""

    def __init__(self, cfg: AssemblerConfig, decode: Callable[[Any], np.ndarray], instruction: str = "") -> None:
        """Args:
        cfg: settings; decode: payload -> uint8 ``[H, W, 3]`` RGB, raising ``ValueError`` (or a
        subclass) for a bad payload; instruction: the instruction until one is set.
        """
        self.cfg = cfg
        self._decode = decode
        self._lock = threading.Lock()
        self._new = threading.Event()
        self._instruction = instruction
        self._cams = {slot: _Camera() for slot in cfg.cameras}
        self._states: collections.deque[tuple[float, np.ndarray]] = collections.deque(maxlen=cfg.state_history)
        self._state_newest: float | None = None
        self._t_ref: float | None = None
        self._last_key: tuple[tuple[tuple[str, float], ...], float] | None = None  # (fresh, state time)
        self._generation = 0
        self.dropped_out_of_order = 0
        self.time_jumps = 0
        self.decode_errors = 0
        self.state_offset_us = -1  # |newest image - matched state| of the last observation, µs

    # ------------------------------------------------------------------ inputs (any thread)
    def _order(self, newest: float | None, stamp: float) -> Verdict:
        if newest is None or stamp > newest:
            return Verdict.ACCEPTED
        if newest - stamp > self.cfg.time_jump_s:
            self._clear_locked()
            self.time_jumps += 1
            return Verdict.TIME_JUMP
        self.dropped_out_of_order += 1
        return Verdict.OUT_OF_ORDER

    def add_image(self, slot: str, stamp: float, payload: Any) -> Verdict:
        """Offer a camera image (undecoded ``payload``) with its header stamp in seconds.

        Raises:
            KeyError: ``slot`` has no camera in the configuration.
        """
        with self._lock:
            verdict = self._order(self._cams[slot].newest, stamp)
            if verdict is Verdict.OUT_OF_ORDER:
                return verdict
            cam = self._cams[slot]  # after a time jump: the cleared buffer
            cam.raw, cam.raw_stamp, cam.newest, cam.since_frame = payload, stamp, stamp, True
            cam.received += 1
            self._t_ref = stamp if self._t_ref is None else max(self._t_ref, stamp)
        self._new.set()
        return verdict

    def add_state(self, stamp: float, state: np.ndarray) -> Verdict:
        """Offer a joint-state vector (finite, in the configured joint order) stamped in seconds."""
        with self._lock:
            verdict = self._order(self._state_newest, stamp)
            if verdict is Verdict.OUT_OF_ORDER:
                return verdict
            self._states.append((stamp, np.asarray(state, dtype=np.float64)))
            self._state_newest = stamp
            self._t_ref = stamp if self._t_ref is None else max(self._t_ref, stamp)
        return verdict

    @property
    def instruction(self) -> str:
        """The instruction the next observation carries."""
        with self._lock:
            return self._instruction

    def set_instruction(self, text: str) -> None:
        """Set the task instruction used by the following observations."""
        with self._lock:
            self._instruction = text

    def reconfigure(self, cfg: AssemblerConfig, instruction: str | None = None) -> None:
        """Take new live settings (the timing tolerances) and, unless ``None``, a new instruction.

        Raises:
            ValueError: ``cfg`` changes what the assembler was built for (slots, cameras, history).
        """
        fixed = ("slots", "cameras", "labels", "state_history")
        changed = [f for f in fixed if getattr(cfg, f) != getattr(self.cfg, f)]
        if changed:
            raise ValueError(f"not changeable on a running assembler: {changed}")
        with self._lock:
            self.cfg = cfg
            if instruction is not None:
                self._instruction = instruction

    def clear(self) -> None:
        """Forget every buffered input (used on deactivate / clock jumps)."""
        with self._lock:
            self._clear_locked()

    def _clear_locked(self) -> None:
        for slot in self._cams:
            self._cams[slot] = _Camera()
        self._states.clear()
        self._state_newest = self._t_ref = self._last_key = None
        self._generation += 1

    def cameras_behind(self) -> int:
        """Live cameras (newest stamp within ``camera_max_age_s`` of ``t_ref``) that have not
        delivered an image since the last observation: worth a short wait to sync a frame."""
        with self._lock:
            return sum(
                1 for c in self._cams.values() if c.newest is not None and not c.since_frame and self._live(c.newest)
            )

    def wait_new(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a new camera image; True if one arrived (and reset)."""
        got = self._new.wait(timeout)
        self._new.clear()
        return got

    # ------------------------------------------------------------------ assembly (inference thread)
    def _label(self, slot: str) -> str:
        label = self.cfg.labels.get(slot)
        return f"{slot} ({label})" if label else slot

    def _decode_pending(self) -> list[str]:
        with self._lock:
            generation = self._generation  # a time jump meanwhile invalidates these payloads
            todo = [(s, c.raw, c.raw_stamp) for s, c in self._cams.items() if c.raw is not None]
            for cam in self._cams.values():
                cam.raw = None
        errors = []
        for slot, payload, stamp in todo:
            try:
                rgb = self._decode(payload)
            except ValueError as exc:
                errors.append(f"camera {self._label(slot)}: {exc}")
                with self._lock:
                    self.decode_errors += 1
                continue
            with self._lock:
                cam = self._cams[slot]
                if generation == self._generation and (cam.rgb is None or stamp > cam.rgb_stamp):
                    cam.rgb, cam.rgb_stamp = rgb, stamp
        return errors

    def _camera_notes(self, fresh: dict[str, float]) -> list[str]:
        notes = []
        for slot, cam in self._cams.items():
            if slot in fresh:
                continue
            if cam.received == 0:
                notes.append(f"camera {self._label(slot)}: no image received, slot masked")
            elif cam.rgb is None:
                notes.append(f"camera {self._label(slot)}: no decodable image, slot masked")
            else:
                age = (self._t_ref or cam.rgb_stamp) - cam.rgb_stamp
                behind = "behind the joint states" if self._states_ahead_locked() is not None else "old"
                notes.append(
                    f"camera {self._label(slot)}: stale ({age:.2f} s {behind} > "
                    f"{self.cfg.camera_max_age_s:g} s), slot masked"
                )
        return notes

    def _states_ahead_locked(self) -> float | None:
        """Seconds by which the newest joint state is stamped ahead of every camera's newest image,
        when that alone makes the cameras stale (a clock problem), else None."""
        cams = [c.newest for c in self._cams.values() if c.newest is not None]
        if not cams or self._state_newest is None:
            return None
        ahead = self._state_newest - max(cams)
        return ahead if ahead > self.cfg.camera_max_age_s else None

    def _live(self, stamp: float) -> bool:
        return self._t_ref is not None and self._t_ref - stamp <= self.cfg.camera_max_age_s

    def _fresh_locked(self) -> dict[str, float]:
        return {s: c.rgb_stamp for s, c in self._cams.items() if c.rgb is not None and self._live(c.rgb_stamp)}

    def _waiting_locked(self, fresh: dict[str, float]) -> tuple[str | None, tuple[float, np.ndarray] | None]:
        if not self._cams:
            return "waiting for camera images: no camera configured", None
        if not fresh:
            if all(c.received == 0 for c in self._cams.values()):
                names = ", ".join(self._label(s) for s in self._cams)
                return f"waiting for camera images on {names}", None
            ahead = self._states_ahead_locked()
            if ahead is not None:
                return (
                    f"waiting for camera images: the joint states are stamped {ahead:.1f} s ahead of the "
                    "newest camera image, so every camera counts as stale (do the publishers stamp "
                    "with the same clock?)"
                ), None
            return "waiting for camera images: every camera is stale or undecodable", None
        if not self._states:
            return "waiting for joint states", None
        t_img = max(fresh.values())
        nearest = min(self._states, key=lambda sv: abs(sv[0] - t_img))
        if abs(nearest[0] - t_img) > self.cfg.state_tolerance_s:
            return (
                f"waiting for a joint state within {self.cfg.state_tolerance_s:g} s of the newest "
                f"image (nearest is {abs(nearest[0] - t_img):.3f} s away)"
            ), None
        return None, nearest

    def status(self) -> tuple[str | None, list[str]]:
        """Current (waiting reason or None, notes on masked cameras) without decoding anything."""
        with self._lock:
            fresh = self._fresh_locked()
            for slot, cam in self._cams.items():  # undecoded newest images count as present
                if cam.raw is not None and self._live(cam.raw_stamp):
                    fresh.setdefault(slot, cam.raw_stamp)
            waiting, _ = self._waiting_locked(fresh)
            return waiting, self._camera_notes(fresh)

    def assemble(self, require_new: bool = True) -> Assembly:
        """Build the newest observation.

        Args:
            require_new: return no observation when no input used by the previous observation has
                been superseded (no new image and no new state) — the frame would be a repeat.

        Returns:
            An :class:`Assembly`; its ``observation`` has every model slot (masked ones None), the
            matched state (float64, robot units) and ``stamp`` = newest stamp among the inputs used.
        """
        errors = self._decode_pending()
        with self._lock:
            fresh = self._fresh_locked()
            waiting, nearest = self._waiting_locked(fresh)
            notes = self._camera_notes(fresh)
            if waiting is not None or nearest is None:
                return Assembly(waiting=waiting, stale=notes, errors=errors)
            key = (tuple(sorted(fresh.items())), nearest[0])
            if require_new and key == self._last_key:
                return Assembly(stale=notes, errors=errors)
            self._last_key = key
            self.state_offset_us = round(abs(nearest[0] - max(fresh.values())) * 1e6)
            for cam in self._cams.values():
                cam.since_frame = False
            images: dict[str, np.ndarray | None] = {s: None for s in self.cfg.slots}
            for slot in fresh:
                images[slot] = self._cams[slot].rgb
            stamp = max(max(fresh.values()), nearest[0])
            obs = Observation(images=images, state=nearest[1].copy(), instruction=self._instruction, stamp=stamp)
        return Assembly(observation=obs, stale=notes, errors=errors)

    def received_images(self) -> int:
        """Camera images taken since the last :meth:`clear` (activation), every camera together."""
        with self._lock:
            return sum(c.received for c in self._cams.values())

    def counts(self) -> dict[str, int]:
        """Counters: out-of-order drops, time jumps, image decode errors, images per camera, and
        ``state_offset_us``: absolute difference of the newest image's and the matched joint state's stamps in the
        last observation
        (µs; -1 before the first)."""
        with self._lock:
            out = {
                "dropped_out_of_order": self.dropped_out_of_order,
                "time_jumps": self.time_jumps,
                "image_decode_errors": self.decode_errors,
                "state_offset_us": self.state_offset_us,
            }
            out.update({f"images_{s}": c.received for s, c in self._cams.items()})
            return out
