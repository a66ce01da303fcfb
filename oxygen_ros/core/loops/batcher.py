"""The batcher loop: the language half of the engine in its own thread, on the decode lane.

The action loop hands it one :class:`~oxygen_ros.core.engine.language.LanguageFrame` per control
frame (in frame order): the requests and cancels submitted before that frame, and — when requests
may start on it — the frame's prefix, whose frame reference moves to the batcher together with the
prefix-ready event. For each frame the batcher runs
:meth:`~oxygen_ros.core.engine.language.LanguageStage.run` — the same code the serial schedule runs
in place — so token streams are the serial schedule's, whatever the timing.

The ``continuous`` policy keeps stepping the running batch while no frame is waiting (cancels are
then also taken between steps): more tokens per second, token timing no longer tied to frames.

Threading: the scheduler and the request book are touched by this thread only (requests are
created by ``Engine.submit_request`` on any thread, as in the serial schedule); the block pool is
shared with the action loop under its lock; outputs go to an outbox the action loop drains.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from ..engine.language import LanguageFrame, LanguageOutput, LanguageStage
from ..engine.requests import LanguageRequest, RequestStatus


class BatcherLoop:
    """The thread that runs one engine's :class:`LanguageStage`.

    Args:
        stage: the engine's language stage (its ``policy`` says ``frame`` or ``continuous``).
        intra_op_threads: torch intra-op threads of this thread on the CPU (0: unchanged).
    """

    def __init__(self, stage: LanguageStage, intra_op_threads: int = 1) -> None:
        self.stage = stage
        self.policy = stage.policy
        self.threads = intra_op_threads
        self._cv = threading.Condition()
        self._frames: deque[LanguageFrame | _Call] = deque()
        self._out = LanguageOutput()
        self._busy = False
        self._in_frame = False
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
        """Finish the frames handed out, then end the thread."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._thread = None

    def submit(self, frame: LanguageFrame) -> None:
        """Queue a frame's language work (frame order)."""
        with self._cv:
            self._frames.append(frame)
            self._cv.notify_all()

    @property
    def pending(self) -> int:
        """Frames not yet processed (the one in progress included)."""
        with self._cv:
            return len(self._frames) + int(self._in_frame)

    def handed_out_requests(self) -> list[LanguageRequest]:
        """The new requests of frames not yet taken up by the thread."""
        with self._cv:
            return [r for f in self._frames if isinstance(f, LanguageFrame) for r in f.new]

    @property
    def alive(self) -> bool:
        """Whether the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def has_output(self) -> bool:
        """Whether deltas, ended requests or an error wait for :meth:`take`."""
        with self._cv:
            return bool(self._out.deltas or self._out.ended or self._error is not None)

    def take(self) -> LanguageOutput:
        """Outputs and stats since the last call; re-raises an error of the batcher thread.

        Raises:
            RuntimeError: the batcher thread failed (the original error is its cause).
        """
        with self._cv:
            out, self._out = self._out, LanguageOutput()
            err, self._error = self._error, None
        if err is not None:
            raise RuntimeError(f"language batcher failed: {err}") from err
        return out

    def wait_progress(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds for the batcher to finish a unit of work."""
        with self._cv:
            self._cv.wait(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` in the batcher thread after the frames handed out, wait, return its result (e.g.
        warming the decode stage where it will run: CUDA graph trees are per thread).

        Raises:
            Exception: whatever ``fn`` raised.
        """
        box: dict[str, Any] = {}
        with self._cv:
            self._frames.append(_Call(fn, box))
            self._cv.notify_all()
            while "done" not in box:
                self._cv.wait(0.05)
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def paused(self) -> _Pause:
        """Context: wait until every frame handed out is processed and no step runs; none starts inside."""
        return _Pause(self)

    # ------------------------------------------------------------------ the loop (own thread)
    def _has_work(self) -> bool:
        if self._paused:
            return False
        if self._frames or self._stop:
            return True
        return self.policy == "continuous" and any(
            r.status == RequestStatus.RUNNING for r in self.stage.scheduler.running
        )

    def _run(self) -> None:
        if not self.stage.streams.cuda and self.threads > 0:
            torch.set_num_threads(self.threads)
        while True:
            with self._cv:
                while not self._has_work():
                    self._cv.wait()
                if self._stop and not self._frames:
                    return
                item = self._frames.popleft() if self._frames else None
                self._busy, self._in_frame = True, item is not None
            if isinstance(item, _Call):
                item.run()
                with self._cv:
                    self._busy = self._in_frame = False
                    self._cv.notify_all()
                continue
            out: LanguageOutput | None = None
            try:
                with torch.inference_mode():
                    out = self.stage.run(item) if item is not None else self.stage.continuous_step()
            except BaseException as e:  # not contained (the stage contains every Exception): surfaced by take()
                self._error = e
            with self._cv:
                if out is not None:
                    self._out.merge(out)
                self._busy = self._in_frame = False
                self._cv.notify_all()


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
            while lp._frames or lp._busy:
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
