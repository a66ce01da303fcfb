"""Plain data types exchanged between the core, the engine, the ROS node and the tools.

No torch tensors cross this boundary: images, states and actions are numpy arrays in robot units.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Observation:
    """One robot observation (one control frame's input).

    Attributes:
        images: camera slot name (e.g. ``"base_0_rgb"``) -> uint8 HWC RGB array ``[H, W, 3]`` (any
            size; resized with padding to the model size), or float ``[H, W, 3]`` in [0, 1]. A slot
            that is missing or ``None`` is a masked slot (blank image, image-mask false).
        state: ``[state_dim]`` float joint state in robot units (radians / metres / gripper units).
        instruction: free-text task instruction, e.g. ``"pick up the cube"``.
        stamp: observation time in seconds (ROS time of the newest input; 0.0 when unknown).
    """

    images: dict[str, np.ndarray | None]
    state: np.ndarray
    instruction: str
    stamp: float = 0.0


@dataclass
class ActionChunk:
    """An action chunk produced for one observation.

    Attributes:
        actions: ``[H, robot_action_dim]`` float32 actions in robot units (unnormalised, finite).
        stamp: the observation stamp (seconds) the chunk was computed from.
        frame_id: engine frame counter.
    """

    actions: np.ndarray
    stamp: float = 0.0
    frame_id: int = -1


@dataclass
class TextDelta:
    """Newly decoded text of one language request in one frame.

    ``text`` is the new, complete UTF-8 text since the previous delta of the same request (never a
    broken multi-byte character); the concatenation of all deltas equals the final text.
    """

    request_id: int
    task: str
    text: str
    frame_id: int
    finished: bool = False


@dataclass
class NormStats:
    """Normalisation statistics of one quantity (openpi ``norm_stats.json`` entry).

    Each array is ``[dim]`` float32 where dim is the robot's own dimension.
    """

    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray
    q99: np.ndarray

    @classmethod
    def identity(cls, dim: int) -> NormStats:
        """Stats with q01 = -1, q99 = 1, mean 0, std 1 (random-weight checkpoints)."""
        return cls(
            mean=np.zeros(dim, np.float32),
            std=np.ones(dim, np.float32),
            q01=np.full(dim, -1.0, np.float32),
            q99=np.ones(dim, np.float32),
        )

    @property
    def dim(self) -> int:
        """Dimension of the quantity."""
        return int(self.q01.shape[0])

    def to_dict(self) -> dict[str, list[float]]:
        """JSON-serialisable form (openpi layout: mean, std, q01, q99)."""
        return {k: np.asarray(getattr(self, k), dtype=np.float64).tolist() for k in ("mean", "std", "q01", "q99")}

    @classmethod
    def from_dict(cls, d: dict[str, list[float]]) -> NormStats:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` on missing keys or mismatched lengths."""
        missing = [k for k in ("q01", "q99") if k not in d]
        if missing:
            raise ValueError(f"norm stats missing keys {missing}")
        q01 = np.asarray(d["q01"], dtype=np.float32)
        q99 = np.asarray(d["q99"], dtype=np.float32)
        mean = np.asarray(d.get("mean", (q01 + q99) / 2), dtype=np.float32)
        std = np.asarray(d.get("std", np.maximum(q99 - q01, 0) / 4), dtype=np.float32)
        dims = {a.shape for a in (mean, std, q01, q99)}
        if len(dims) != 1 or q01.ndim != 1:
            raise ValueError(f"norm stats arrays must be 1-D of one length, got shapes {sorted(dims)}")
        return cls(mean=mean, std=std, q01=q01, q99=q99)


@dataclass
class FrameMetrics:
    """Timing and load of one control frame (definitions: docs/architecture.md, 'Metrics'). Times in seconds."""

    frame_id: int
    frame_time: float = 0.0
    vision: float = 0.0
    prefill: float = 0.0
    denoise: float = 0.0
    decode: float = 0.0
    bookkeeping: float = 0.0
    decode_steps: int = 0
    decode_batch: int = 0
    tokens_emitted: int = 0
    blocks_in_use: int = 0
    blocks_total: int = 0
    deadline_met: bool = True
    extra: dict[str, float] = field(default_factory=dict)
