"""CUDA streams and events for the engine; no-ops on the CPU.

The action path (prefill + denoise) runs on a high-priority stream, batched decode on its own
stream that waits for the prefill event of its frame. Blocks released while a stream may still
read them are fenced with an event and only reused once it has passed (DESIGN §4–5).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class DeviceStreams:
    """Action/decode streams on CUDA; on other devices every method is a cheap no-op."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            low, high = torch.cuda.Stream.priority_range()
            self.action_stream = torch.cuda.Stream(device=device, priority=high)
            self.decode_stream = torch.cuda.Stream(device=device, priority=low)
        else:
            self.action_stream = self.decode_stream = None

    @contextlib.contextmanager
    def action(self) -> Iterator[None]:
        """Run the enclosed work on the high-priority action stream."""
        if not self.cuda:
            yield
            return
        with torch.cuda.stream(self.action_stream):
            yield

    @contextlib.contextmanager
    def decode(self) -> Iterator[None]:
        """Run the enclosed work on the decode stream, ordered after the action stream's work so far."""
        if not self.cuda:
            yield
            return
        self.decode_stream.wait_stream(self.action_stream)
        with torch.cuda.stream(self.decode_stream):
            yield

    def sync(self) -> None:
        """Wait for the current stream (stage timing is wall time after device sync)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()

    def fence(self) -> object | None:
        """An event recorded on both streams' current positions (``None`` on CPU)."""
        if not self.cuda:
            return None
        ev_a = torch.cuda.Event()
        ev_d = torch.cuda.Event()
        ev_a.record(self.action_stream)
        ev_d.record(self.decode_stream)
        return (ev_a, ev_d)

    @staticmethod
    def is_done(fence: object) -> bool:
        """Whether every event of ``fence`` has completed."""
        return fence is None or all(ev.query() for ev in fence)  # type: ignore[union-attr]
