"""The frame plan: what the scheduler decided for one control frame, in request ids (plain Python)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FramePlan:
    """What one control frame does with language requests — the scheduler's decision, in ids.

    Attributes:
        frame_id: the control frame.
        admitted: requests starting on this frame's prefix (first token this frame).
        rejected: requests rejected at admission (could never fit).
        decoding: requests in the decode phase, in batch order (running ones with a pending token).
        decode_steps: decode steps granted (fixed k, adaptive, or unbounded for ``shared_kv``).
        finished: requests that ended during the frame (any terminal status), in order.
    """

    frame_id: int
    admitted: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    decoding: list[int] = field(default_factory=list)
    decode_steps: int = 0
    finished: list[int] = field(default_factory=list)
