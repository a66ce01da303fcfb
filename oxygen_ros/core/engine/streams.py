"""CUDA streams, events and cross-stream lifetime rules for the engine; host equivalents on the CPU.

Two *lanes* share the device: the **action** lane (prefill + denoise, a high-priority CUDA stream)
and the **decode** lane (the language batcher, a low-priority stream). The rules
(docs/architecture.md, "Schedules"), each implemented here once and used by the serial and the concurrent schedule
alike:

- **Start-up**: both streams ``wait_stream`` the default stream, which zero-filled the KV pool and
  loaded the weights (:meth:`DeviceStreams.wait_default`); otherwise the first prefill on the
  action stream could race the pool's ``zeros``.
- **Ordering**: decode work of a frame waits for that frame's prefix-ready event only
  (``decode(after=event)``), never for the whole action stream, so the next frame's denoise and
  this frame's decode overlap on the device.
- **Ownership**: a tensor allocated on one stream and read on the other is handed over with
  ``record_stream`` (:meth:`DeviceStreams.hand_over`) so the caching allocator does not recycle
  its memory while the reading stream still uses it.
- **Block reuse**: a released KV block is fenced with an event on EVERY lane
  (:meth:`DeviceStreams.fence`) and reused only once all of them have passed
  (:meth:`DeviceStreams.is_done`, polled by ``BlockPool.reclaim``).

On the CPU, ops run synchronously in the calling thread, so a lane's work is complete when its
``with`` block exits. A fence there is a :class:`HostFence` over the lanes that are inside a unit
of work in ANOTHER thread at the moment of the release (the concurrent schedule's two loops): it is
done once each of those units has ended — the host-side equivalent of a stream event, and the path
the CPU tests exercise. With one thread (the serial schedule) every CPU fence is ``None``
(immediately reusable), as before. Stage times come from CUDA events on the GPU and from
``perf_counter`` on the CPU (:class:`StageClock`), so timing itself never forces a host sync.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import cast

import torch


def _cuda_stream(device: torch.device, priority: int) -> torch.cuda.Stream:
    """A new CUDA stream on ``device`` with ``priority``."""
    return torch.cuda.Stream(device=device, priority=priority)  # type: ignore[no-untyped-call]  # torch: Stream.__new__ unannotated


def _cuda_event(enable_timing: bool = False) -> torch.cuda.Event:
    """A new CUDA event (``enable_timing`` for :class:`StageClock`)."""
    return torch.cuda.Event(enable_timing=enable_timing)  # type: ignore[no-untyped-call]  # torch: Event.__new__ unannotated


class Lane:
    """One loop's stream plus host-side progress counters (units entered / units finished).

    ``started``/``finished`` count outermost ``with`` units; ``owner`` is the thread id running
    the current unit (``None`` when idle). Written by the lane's own thread only; read by others.
    """

    def __init__(self, name: str, stream: torch.cuda.Stream | None) -> None:
        self.name = name
        self.stream = stream
        self.started = 0
        self.finished = 0
        self.owner: int | None = None
        self._depth = 0

    def enter(self) -> None:
        """Begin a unit of work in the calling thread (nested units count once)."""
        if self._depth == 0:
            self.owner = threading.get_ident()
            self.started += 1
        self._depth += 1

    def exit(self) -> None:
        """End the unit begun by the matching :meth:`enter`."""
        self._depth -= 1
        if self._depth == 0:
            self.finished += 1
            self.owner = None


class HostFence:
    """CPU fence: done once every recorded lane finished the unit it was running at record time.

    Args:
        marks: ``(lane, unit number)`` pairs; done when ``lane.finished >= unit number``.
    """

    def __init__(self, marks: list[tuple[Lane, int]]) -> None:
        self.marks = marks

    def query(self) -> bool:
        """Whether every recorded unit has ended (never blocks)."""
        return all(lane.finished >= n for lane, n in self.marks)


class DeviceStreams:
    """Action/decode lanes: CUDA streams and events on a GPU, host counters on the CPU.

    Args:
        device: the model's device.
        host_sync: whether :meth:`sync` blocks the host (the serial schedule's stage timing). The
            concurrent schedule sets it ``False``: only results that must reach the host (the
            chunk, the sampled token ids) synchronise, and stage times come from events.
    """

    def __init__(self, device: torch.device, host_sync: bool = True) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.host_sync = host_sync
        self.action_stream: torch.cuda.Stream | None = None
        self.decode_stream: torch.cuda.Stream | None = None
        if self.cuda:
            low, high = torch.cuda.Stream.priority_range()  # type: ignore[call-arg]  # torch stub: a staticmethod typed as a method
            self.action_stream = _cuda_stream(self.device, high)
            self.decode_stream = _cuda_stream(self.device, low)
        self.action_lane = Lane("action", self.action_stream)
        self.decode_lane = Lane("decode", self.decode_stream)
        self.wait_default()

    def _streams(self) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
        """The ``(action, decode)`` CUDA streams; only on a GPU (``self.cuda``), where both exist."""
        assert self.action_stream is not None and self.decode_stream is not None
        return self.action_stream, self.decode_stream

    # ------------------------------------------------------------------ start-up / ordering
    def wait_default(self) -> None:
        """Order both lanes after everything enqueued so far on the default stream (the pool's
        zero-fill, weight loading, persistent buffers). Call again after allocating more device
        state on the default stream. No-op on the CPU."""
        if self.cuda:
            default = torch.cuda.default_stream(self.device)
            action_stream, decode_stream = self._streams()
            action_stream.wait_stream(default)
            decode_stream.wait_stream(default)

    @contextlib.contextmanager
    def _unit(self, lane: Lane) -> Iterator[None]:
        lane.enter()
        try:
            if lane.stream is None:
                yield
            else:
                with torch.cuda.stream(lane.stream):
                    yield
        finally:
            lane.exit()

    def action(self) -> contextlib.AbstractContextManager[None]:
        """Run the enclosed work on the high-priority action lane."""
        return self._unit(self.action_lane)

    def decode(self, after: object = "action") -> contextlib.AbstractContextManager[None]:
        """Run the enclosed work on the decode lane.

        Args:
            after: ``"action"`` (default, the serial schedule's ordering): the decode stream first
                waits for all action-stream work enqueued so far; an event from :meth:`event`
                (e.g. a frame's prefix-ready event): it waits for that event only, on the device,
                without blocking the host; ``None``: no extra wait (stream order suffices).
        """
        if self.cuda:
            action_stream, decode_stream = self._streams()
            if isinstance(after, str) and after == "action":
                decode_stream.wait_stream(action_stream)
            elif isinstance(after, torch.cuda.Event):
                decode_stream.wait_event(after)
        return self._unit(self.decode_lane)

    def event(self) -> torch.cuda.Event | None:
        """An event recorded on the current stream (the lane's inside its ``with``); ``None`` on
        the CPU, where work is complete when the call returns."""
        if not self.cuda:
            return None
        ev = _cuda_event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def hand_over(self, tensor: torch.Tensor | None, to: str) -> None:
        """Ownership rule for a tensor made on one lane and read on the other (``to``: ``"action"``
        or ``"decode"``): ``record_stream`` so the allocator keeps its memory until the reading
        stream's work queued so far is done. No-op on the CPU or for CPU tensors.

        Raises:
            ValueError: unknown lane name.
        """
        if to not in ("action", "decode"):
            raise ValueError(f"unknown lane {to!r}; expected 'action' or 'decode'")
        if self.cuda and tensor is not None and tensor.is_cuda:
            action_stream, decode_stream = self._streams()
            tensor.record_stream(action_stream if to == "action" else decode_stream)

    # ------------------------------------------------------------------ sync / fences
    def sync(self) -> None:
        """Block the host until the current stream is done — only when ``host_sync`` (serial stage
        timing); the concurrent schedule syncs only through results that reach the host."""
        if self.cuda and self.host_sync:
            torch.cuda.current_stream(self.device).synchronize()

    def fence(self) -> tuple[torch.cuda.Event, torch.cuda.Event] | HostFence | None:
        """A marker after which blocks released now may be reused.

        CUDA: one event recorded on each stream's current position (every lane that could have
        read the blocks). CPU: a :class:`HostFence` over the lanes busy in another thread, or
        ``None`` when there are none (the releasing thread's own work is already complete).
        """
        if self.cuda:
            action_stream, decode_stream = self._streams()
            ev_a, ev_d = _cuda_event(), _cuda_event()
            ev_a.record(action_stream)
            ev_d.record(decode_stream)
            return (ev_a, ev_d)
        me = threading.get_ident()
        marks = [
            (lane, lane.started)
            for lane in (self.action_lane, self.decode_lane)
            if lane.owner is not None and lane.owner != me and lane.finished < lane.started
        ]
        return HostFence(marks) if marks else None

    @staticmethod
    def is_done(fence: object | None) -> bool:
        """Whether every part of ``fence`` has passed (events queried, never waited on)."""
        if fence is None:
            return True
        if isinstance(fence, HostFence):
            return fence.query()
        # The pool keeps fences opaque (``object``); any other fence is :meth:`fence`'s CUDA pair.
        events = cast("tuple[torch.cuda.Event, torch.cuda.Event]", fence)
        return all(ev.query() for ev in events)  # type: ignore[no-untyped-call]  # torch: Event.query unannotated


class StageClock:
    """Stage timestamps without a host sync: CUDA timing events on a GPU, ``perf_counter`` on the
    CPU. Read :meth:`seconds` only after the stream of the later mark has synced for a result
    (the chunk's or the tokens' transfer to the host) — it then never blocks."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def mark(self) -> object:
        """A timestamp on the current stream (an event) or of the host (seconds)."""
        if not self.cuda:
            return time.perf_counter()
        ev = _cuda_event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, a: object, b: object) -> float:
        """Seconds from mark ``a`` to mark ``b`` (both on the same stream)."""
        # Marks are opaque (``object``): :meth:`mark` made both, a float on the CPU, an event on a GPU.
        if not self.cuda:
            return float(cast(float, b)) - float(cast(float, a))
        start, end = cast(torch.cuda.Event, a), cast(torch.cuda.Event, b)
        end.synchronize()  # already complete where the docstring is followed
        ms: float = start.elapsed_time(end)
        return ms / 1000.0


__all__ = ["DeviceStreams", "HostFence", "Lane", "StageClock"]
