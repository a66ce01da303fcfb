"""The batcher loop: the language half of the engine in its own thread, on the decode lane.

The action loop hands it one :class:`~.frame_work.Grant` per control frame (in frame order): the requests and
cancels submitted before that frame, and — when requests may start on it — the frame's prefix,
whose frame reference moves to the batcher together with the prefix-ready event. For each grant
the batcher does exactly what the serial ``Engine.step`` does after the chunk (DESIGN §5 steps
4–5): queue, cancel, periodic tasks, admission onto the prefix (after its ready event, on the
decode stream), the first token, then the frame's decode budget — ≤ k steps per request in
``unified`` with the ``frame`` policy, to completion in ``shared_kv`` / ``isolated``. The frame's
prefix reference is released through a fence of every lane. Because grants carry the frame's
inputs and budget, token streams are the serial schedule's, whatever the timing.

The ``continuous`` policy keeps stepping the running batch while no grant is waiting (cancels are
then also taken between steps): more tokens per second, token timing no longer tied to frames.

Threading: the scheduler and the request book are touched by this thread only (requests are
created by ``Engine.submit_request`` on any thread, as in the serial schedule); the block pool is
shared with the action loop under its lock; outputs go to an outbox the action loop drains.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

import torch

from ..engine.faults import FaultLog
from ..engine.requests import RequestStatus
from .frame_work import BatchStats, FrameWork, Grant


class BatcherLoop:
    """The language loop over one engine's scheduler, request book, runner and lanes.

    Args:
        engine: the :class:`~oxygen_ros.core.engine.engine.Engine` whose parts it drives.
        policy: ``frame`` or ``continuous`` (see module doc).
        intra_op_threads: torch intra-op threads of this thread on the CPU (0: unchanged).
    """

    def __init__(self, engine: Any, policy: str = "frame", intra_op_threads: int = 1) -> None:
        self.e = engine
        self.policy = policy
        self.threads = intra_op_threads
        self.faults = FaultLog(engine.streams.device)  # this thread's; moved to the engine's by take()
        self.work = FrameWork(engine, policy, self.faults)
        self._cv = threading.Condition()
        self._grants: deque[Grant] = deque()
        self._out = BatchStats()
        self._busy = False
        self._in_grant = False
        self._paused = 0
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control (action thread)
    def start(self) -> None:
        """Start the thread (no-op if running)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="oxygen-batcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish the granted work, then end the thread."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._thread = None

    def submit(self, grant: Grant) -> None:
        """Queue a frame's grant (frame order)."""
        with self._cv:
            self._grants.append(grant)
            self._cv.notify_all()

    @property
    def pending(self) -> int:
        """Grants not yet processed (the one in progress included)."""
        with self._cv:
            return len(self._grants) + int(self._in_grant)

    def granted_requests(self) -> list:
        """The new requests of grants not yet taken up by the thread."""
        with self._cv:
            return [r for g in self._grants if isinstance(g, Grant) for r in g.new]

    @property
    def alive(self) -> bool:
        """Whether the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def has_output(self) -> bool:
        """Whether deltas, ended requests or an error wait for :meth:`take`."""
        with self._cv:
            return bool(self._out.deltas or self._out.ended or self._error is not None)

    def take(self) -> BatchStats:
        """Outputs and stats since the last call; re-raises an error of the batcher thread.

        Raises:
            RuntimeError: the batcher thread failed (the original error is its cause).
        """
        with self._cv:
            out, self._out = self._out, BatchStats()
            err, self._error = self._error, None
        if err is not None:
            raise RuntimeError(f"language batcher failed: {err}") from err
        return out

    def wait_progress(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds for the batcher to finish a unit of work."""
        with self._cv:
            self._cv.wait(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` in the batcher thread after the granted work, wait, return its result (e.g.
        warming the decode stage where it will run: CUDA graph trees are per thread).

        Raises:
            Exception: whatever ``fn`` raised.
        """
        box: dict[str, Any] = {}
        with self._cv:
            self._grants.append(_Call(fn, box))
            self._cv.notify_all()
            while "done" not in box:
                self._cv.wait(0.05)
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def paused(self) -> "_Pause":
        """Context: wait until every grant is processed and no step runs; none starts inside."""
        return _Pause(self)

    # ------------------------------------------------------------------ the loop (own thread)
    def _has_work(self) -> bool:
        if self._paused:
            return False
        if self._grants or self._stop:
            return True
        return self.policy == "continuous" and any(
            r.status == RequestStatus.RUNNING for r in self.e.scheduler.running)

    def _run(self) -> None:
        if not self.e.streams.cuda and self.threads > 0:
            torch.set_num_threads(self.threads)
        while True:
            with self._cv:
                while not self._has_work():
                    self._cv.wait()
                if self._stop and not self._grants:
                    return
                grant = self._grants.popleft() if self._grants else None
                self._busy, self._in_grant = True, grant is not None
            if isinstance(grant, _Call):
                grant.run()
                with self._cv:
                    self._busy = self._in_grant = False
                    self._cv.notify_all()
                continue
            t0 = time.perf_counter()
            out = BatchStats()
            self.faults.begin_frame(grant.frame_id if grant is not None else self.faults.frame_id)
            try:
                with torch.inference_mode():
                    if grant is not None:
                        self.work.process(grant, out)
                    else:
                        self.work.continuous_step(out)
            except Exception as e:  # outside any guarded stage (a bug): fail what is running, go on
                self.work.contain(e, out)
            except BaseException as e:  # not contained: surfaced to the action loop by take()
                self._error = e
            out.busy = time.perf_counter() - t0
            out.faults, out.fault_counts = self.faults.frame, self.faults.counts
            self.faults.counts = {}
            with self._cv:
                self._merge(out)
                self._busy = self._in_grant = False
                self._cv.notify_all()

    def _merge(self, out: BatchStats) -> None:
        o = self._out
        o.tokens += out.tokens
        o.decode += out.decode
        o.decode_steps += out.decode_steps
        o.decode_batch = max(o.decode_batch, out.decode_batch)
        o.busy += out.busy
        o.grants += out.grants
        o.deltas.extend(out.deltas)
        o.ended.extend(out.ended)
        o.plans.extend(out.plans)
        o.faults.extend(out.faults)
        for kind, n in out.fault_counts.items():
            o.fault_counts[kind] = o.fault_counts.get(kind, 0) + n


class _Call:
    """A function to run in the batcher thread (see :meth:`BatcherLoop.call`)."""

    def __init__(self, fn: Callable[[], Any], box: dict[str, Any]) -> None:
        self.fn, self.box = fn, box

    def run(self) -> None:
        try:
            self.box["result"] = self.fn()
        except Exception as e:
            self.box["error"] = e
        self.box["done"] = True


class _Pause:
    """See :meth:`BatcherLoop.paused`."""

    def __init__(self, loop: BatcherLoop) -> None:
        self.loop = loop

    def __enter__(self) -> None:
        lp = self.loop
        with lp._cv:
            while lp._grants or lp._busy:
                if lp._thread is None or not lp._thread.is_alive():
                    break
                lp._cv.wait(0.05)
            lp._paused += 1

    def __exit__(self, *exc: object) -> None:
        lp = self.loop
        with lp._cv:
            lp._paused -= 1
            lp._cv.notify_all()


__all__ = ["BatcherLoop"]
