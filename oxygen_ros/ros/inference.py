"""The inference thread of the ``oxygen`` node (DESIGN §5–6).

One thread owns :meth:`Engine.step`. It wakes when a camera delivers a new image, waits briefly
(``camera_sync_s``) for the other live cameras' images of the same instant, assembles the newest
observation, runs one engine frame and publishes from this thread: the action chunk the
moment the engine hands it out (``on_action``, before any language work), then the frame's text
deltas and finished utterances. With no new observation it keeps stepping while language requests
are running, so text keeps flowing when the cameras stop. Executor callbacks never wait for it.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable

from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.engine.requests import FrameResult, RequestStatus
from oxygen_ros.core.robot_io import RobotFrames
from oxygen_ros.core.types import ActionChunk
from oxygen_ros.ros.diagnostics import ERROR, WARN, FrameStats
from oxygen_ros.ros.observation import ObservationAssembler
from oxygen_ros.ros.outputs import Outputs
from oxygen_ros.ros.streams.text import TaskTextStream

__all__ = ['InferenceWorker']

_IDLE_WAIT_S = 0.05


class InferenceWorker:
    """Runs engine frames in a background thread.

    Args:
        engine: the engine (used only from this thread, except its thread-safe submit methods).
        assembler: source of observations.
        outputs: publishers.
        stats: frame statistics sink.
        report: ``report(kind, message, level)`` for problems.
        logger: the node's logger.
        camera_sync_s: after the first new image, wait up to this long (seconds) for the other
            live cameras' images before starting the frame.
        frames: the action space around the engine (robot-space state in, robot command out).
    """

    def __init__(self, engine: Engine, assembler: ObservationAssembler, outputs: Outputs,
                 stats: FrameStats, report: Callable[[str, str, int], None], logger,
                 camera_sync_s: float = 0.0, *, frames: RobotFrames) -> None:
        self._engine, self._asm, self._out, self._stats = engine, assembler, outputs, stats
        self._frames = frames
        self._sync_s = camera_sync_s
        self._report, self._log = report, logger
        self._streams = {t.name: TaskTextStream() for t in engine.cfg.tasks}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.snapshot: dict[str, int] = {'running_requests': 0, 'queued_requests': 0}
        self.rejected_requests = 0
        self.failed_requests = 0
        self.expired_requests = 0
        self._logged_faults: set[str] = set()
        self.repeated_observations = 0
        self._last_stamp: float | None = None

    @property
    def alive(self) -> bool:
        """Whether the thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (no-op if running)."""
        if self.alive:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name='oxygen-inference', daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> bool:
        """Ask the thread to stop after the current frame and wait up to ``timeout`` seconds.

        Returns:
            True if the thread has ended.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        self._thread = None
        return True

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._once()
            except Exception as exc:  # a bug must not kill the node: report, back off, go on
                self._report('inference_error', f'{type(exc).__name__}: {exc}', ERROR)
                self._log.error(f'inference frame failed:\n{traceback.format_exc()}')
                self._stop.wait(0.5)

    def _once(self) -> None:
        got = self._asm.wait_new(_IDLE_WAIT_S)
        obs = None
        if got:
            end = time.monotonic() + self._sync_s
            while self._asm.cameras_behind() and time.monotonic() < end:
                self._asm.wait_new(max(0.0, end - time.monotonic()))
            assembly = self._asm.assemble()
            for err in assembly.errors:
                self._report('bad_image', f'{err}; image dropped', WARN)
            obs = assembly.observation
        if obs is not None and obs.stamp == self._last_stamp:
            obs = None  # same instant as the last frame (a late camera of that instant): no new frame
            self.repeated_observations += 1
        if obs is None and self._engine.running == 0:
            return
        if obs is not None:
            self._last_stamp = obs.stamp
        if obs is not None:
            self._engine.submit_observation(self._frames.observation(obs))
            if self._out.model_input:
                self._out.publish_model_input(obs.images, obs.stamp)
        result = self._engine.step(on_action=self._on_action)
        self._handle(result)

    def _on_action(self, chunk: ActionChunk) -> None:
        if self._stop.is_set():
            return
        try:
            cmd = self._frames.command(chunk)
        except ValueError as exc:
            self._report('action_refused', f'action chunk of frame {chunk.frame_id} not published: {exc}', ERROR)
            return
        self._out.publish_chunk(chunk, cmd)

    def _handle(self, result: FrameResult) -> None:
        self._stats.record(time.monotonic(), result.metrics, result.action is not None)
        if result.error:
            self._report('frame_dropped', result.error, WARN)
        for f in result.faults:  # contained engine faults: counted by kind, traceback logged once
            if f.kind not in self._logged_faults:
                self._logged_faults.add(f.kind)
                self._log.error(f'engine fault in {f.stage} (contained):\n{f.trace}')
            self._report(f'fault_{f.kind}', f'{f.error} (frame {f.frame_id}, failed requests {list(f.request_ids)})',
                         ERROR)
        by_task: dict[str, list] = {}
        for d in result.deltas:
            by_task.setdefault(d.task, []).extend(self._streams[d.task].delta(d.request_id, d.text))
        for r in result.ended:
            notice = None
            if r.status == RequestStatus.REJECTED:
                expired = r.reason.startswith('expired')
                self.rejected_requests += 1
                self.expired_requests += int(expired)
                notice = f'[request {r.id} {"expired" if expired else "rejected"}: {r.reason}]'
                self._report('request_expired' if expired else 'request_rejected', notice[1:-1], WARN)
            elif r.status == RequestStatus.FAILED:
                self.failed_requests += 1
                notice = f'[request {r.id} failed: {r.reason}]'
                self._report('request_failed', notice[1:-1], WARN)
            stream = self._streams[r.task]
            by_task.setdefault(r.task, []).extend(stream.end(r.id, r.text, notice=notice))
        if not self._stop.is_set():
            for task, emits in by_task.items():
                self._out.publish_text(task, emits)
        self.snapshot = {'running_requests': self._engine.running,
                         'queued_requests': self._engine.queued}
