"""The inference thread of the ``oxygen`` node (docs/architecture.md, 'Schedules').

One thread owns :meth:`Engine.step`. It wakes when a camera delivers a new image, waits briefly
(``camera_sync_s``) for the other live cameras' images of the same instant, assembles the newest
observation, runs one engine frame and publishes from this thread: the action chunk the
moment the engine hands it out (``on_action``, before any language work), then the frame's text
deltas and finished utterances. With no new observation it keeps stepping while any accepted
language request has not ended (including one asked while no camera streams: it waits in the
queue and, without an observation, ends as expired with the reason), so every ask is answered.
An ask taken before the first observation since activation, or while every camera has been
silent for ``input_timeout_s``, also gets an immediate waiting notice on its task's text topic
(:func:`~oxygen_ros.streams.text.waiting_notice`).
Executor callbacks never wait for it.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.engine.requests import FrameResult
from oxygen_ros.core.robot_io import RobotFrames
from oxygen_ros.core.types import ActionChunk
from oxygen_ros.ros.diagnostics import ERROR, WARN, FrameStats
from oxygen_ros.ros.outputs import Outputs
from oxygen_ros.streams.observation import ObservationAssembler
from oxygen_ros.streams.text import Emit, Utterances, waiting_notice

if TYPE_CHECKING:
    from rclpy.impl.rcutils_logger import RcutilsLogger

    from oxygen_ros.ros.params.node_config import NodeConfig

__all__ = ["InferenceWorker"]

_IDLE_WAIT_S = 0.05
_RESTART_WAIT_S = (0.1, 5.0)  # first and longest wait before the frame loop restarts after a fault
_RESTART_CALM_S = 30.0  # a fault this long after the previous one waits the first time again


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
        text_header: utterance header of the text topics (``ask``, ``id``, ``none``;
            :mod:`oxygen_ros.streams.text`).
        camera_silence: seconds since the newest camera image when every camera has stopped (the
            node's input liveness, by arrival time), else ``None``: an ask then gets the waiting
            notice again.
    """

    def __init__(
        self,
        engine: Engine,
        assembler: ObservationAssembler,
        outputs: Outputs,
        stats: FrameStats,
        report: Callable[[str, str, int], None],
        logger: RcutilsLogger,
        camera_sync_s: float = 0.0,
        *,
        frames: RobotFrames,
        text_header: str = "ask",
        camera_silence: Callable[[], float | None] = lambda: None,
    ) -> None:
        self._engine, self._asm, self._out, self._stats = engine, assembler, outputs, stats
        self._frames = frames
        self.camera_sync_s = camera_sync_s  # live (the node parameter)
        self._report, self._log = report, logger
        self.utterances = Utterances([t.name for t in engine.cfg.tasks], text_header)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.snapshot: dict[str, int] = {"running_requests": 0, "queued_requests": 0}
        self.ended: dict[str, int] = dict.fromkeys(("rejected", "expired", "failed", "cancelled"), 0)
        self._logged_faults: set[str] = set()
        self._unsent: list[dict[str, list[Emit]]] = []  # frames' text not yet published (_publish_unsent)
        self.repeated_observations = 0
        self._last_stamp: float | None = None
        self.observed = False  # an observation went to the engine since start() (activation)
        self.started_at = time.monotonic()  # start() (activation), monotonic seconds
        self.last_observation_at: float | None = None  # newest observation handed to the engine
        self.last_chunk_at: float | None = None  # newest chunk published
        self.frame_started_at: float | None = None  # the running engine step's start, else None
        self.restarts = 0  # supervised restarts of the frame loop (see _run)
        self.last_restart_error = ""
        self._last_restart = float("-inf")
        self.camera_silence = camera_silence

    def reconfigure(self, cfg: NodeConfig) -> None:
        """Take the node's live parameters: ``camera_sync_s`` and the text
        topics' ``text_header``."""
        self.camera_sync_s = cfg.camera_sync_s
        self.utterances.set_header(cfg.text_header)

    @property
    def alive(self) -> bool:
        """Whether the thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (no-op if running)."""
        if self.alive:
            return
        self._stop.clear()
        self.observed = False
        self.started_at, self.last_observation_at, self.last_chunk_at = time.monotonic(), None, None
        self._thread = threading.Thread(target=self._run, name="oxygen-inference", daemon=True)
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

    @property
    def rejected_requests(self) -> int:
        """Requests that ended rejected (expired ones not included)."""
        return self.ended["rejected"]

    @property
    def failed_requests(self) -> int:
        """Requests that ended failed."""
        return self.ended["failed"]

    @property
    def expired_requests(self) -> int:
        """Requests that expired in the queue."""
        return self.ended["expired"]

    def ask(self, task: str, text: str) -> int:
        """Submit a language ask (any thread) and reserve its utterance on the task's text topics,
        so asks are answered in the order they arrive. Its prompt is built here, in the calling
        thread, with the instruction in force now — never on the inference thread, and before the
        text streams' lock is taken (the inference thread never waits for a tokenization). Returns
        the request id.

        Raises:
            KeyError: unknown task; ValueError: a bad ask (from ``Engine.submit_request``).
        """
        prompt = self._engine.prompt(task, text, self._asm.instruction)  # before any lock is taken
        return self.utterances.submit(
            task,
            text,
            lambda: self._engine.submit_request(task, text=text, prompt=prompt),
            lambda rid: self._waiting(task, rid),
        )

    def _waiting(self, task: str, rid: int) -> None:
        """Before the first observation since activation, or while every camera has stopped
        (:attr:`camera_silence`), tell the asker at once that its request waits (the answer or the
        expiry notice follows as usual)."""
        silent = self.camera_silence() if self.observed else None
        if self.observed and silent is None:
            return
        if silent is not None:
            reason = f"no camera image for {silent:.1f} s (the inputs stopped)"
        elif self._asm.received_images() == 0:
            reason = "no camera input yet"
        else:  # images came, but no observation was assembled (e.g. no joint state yet)
            waiting, _ = self._asm.status()
            reason = f"no observation yet ({waiting})" if waiting else "no observation yet"
        notice = waiting_notice(rid, self._engine.cfg.max_queue_wait_s, reason)
        self._out.publish_text(task, [Emit("text", notice, rid)])

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        """The thread: the frame loop under a supervisor. ``Engine.step`` contains every engine
        fault itself, so an exception here is a fault of this node's own glue (publishing, the
        text streams, statistics): the supervisor reports it (ERROR on /diagnostics, traceback
        logged), ends every request in flight with a notice saying why, forgets the last chunk,
        waits (0.1 s, doubling to 5 s while faults repeat) and runs the loop again. The thread only
        ends when :meth:`stop` is called."""
        wait = _RESTART_WAIT_S[0]
        while not self._stop.is_set():
            try:
                while not self._stop.is_set():
                    self._once()
            except Exception as exc:  # noqa: BLE001 — supervised: reported, requests ended, restarted
                wait = self._restart_after(exc, wait)
                self._stop.wait(wait)

    def _restart_after(self, exc: Exception, wait: float) -> float:
        """Recover from a frame-loop exception (see :meth:`_run`); returns the wait before restarting."""
        now = time.monotonic()
        first, longest = _RESTART_WAIT_S
        wait = first if now - self._last_restart > _RESTART_CALM_S else min(2.0 * wait, longest)
        self._last_restart = now
        self.frame_started_at = None
        self.restarts += 1
        error = f"{type(exc).__name__}: {exc}"
        self.last_restart_error = error
        trace = traceback.format_exc()
        try:
            self._report(
                "inference_restarted",
                f"inference loop failed ({error}); restarting in {wait:.1f} s, requests in flight ended",
                ERROR,
            )
            self._log.error(
                f"inference loop failed; every request in flight ends, the loop restarts in {wait:.1f} s:\n{trace}"
            )
        except Exception:  # noqa: BLE001 — the node's logger failed too: stderr is the last resort
            traceback.print_exc()
        try:
            ended = self._end_all(f"inference restarted after an error: {error}")
            self._engine.reset_chunks("inference restarted")
        except Exception:  # noqa: BLE001 — the engine itself is broken: still answer every ask
            traceback.print_exc()
            try:
                ended = self.abandon(f"inference failed: {error}")
            except Exception:  # noqa: BLE001 — nothing can be published now: the next restart tries again
                traceback.print_exc()
                ended = 0
        if ended:
            try:
                self._log.warning(f"{ended} language requests ended by the restart")
            except Exception:  # noqa: BLE001 — as above
                traceback.print_exc()
        return wait

    def _once(self) -> None:
        got = self._asm.wait_new(_IDLE_WAIT_S)
        obs = None
        if got:
            end = time.monotonic() + self.camera_sync_s
            while self._asm.cameras_behind() and time.monotonic() < end:
                self._asm.wait_new(max(0.0, end - time.monotonic()))
            assembly = self._asm.assemble()
            for err in assembly.errors:
                self._report("bad_image", f"{err}; image dropped", WARN)
            obs = assembly.observation
        if obs is not None and obs.stamp == self._last_stamp:
            obs = None  # same instant as the last frame (a late camera of that instant): no new frame
            self.repeated_observations += 1
        if obs is None and self._engine.in_flight == 0 and not getattr(self._engine, "busy", False):
            return  # no request in flight (the concurrent schedule: nor outputs still to hand out)
        if obs is not None:
            self._last_stamp = obs.stamp
            try:
                model_obs = self._frames.observation(obs)
            except ValueError as exc:  # a state the action space cannot take: this frame only
                self._report("bad_observation", f"{exc}; observation dropped", WARN)
                model_obs = None
            if model_obs is not None:
                self._engine.submit_observation(model_obs)
                self.observed = True
                self.last_observation_at = time.monotonic()
                if self._out.model_input:
                    self._out.publish_model_input(obs.images, obs.stamp)
        self.frame_started_at = time.monotonic()
        result = self._engine.step(on_action=self._on_action)
        self.frame_started_at = None
        self._handle(result)

    def _on_action(self, chunk: ActionChunk) -> None:
        if self._stop.is_set():
            return
        try:
            cmd = self._frames.command(chunk)
        except ValueError as exc:
            self._report("action_refused", f"action chunk of frame {chunk.frame_id} not published: {exc}", ERROR)
            return
        if self._out.publish_chunk(chunk, cmd):
            self.last_chunk_at = time.monotonic()

    def stalled(self, now: float, timeout_s: float) -> str | None:
        """Why the action path has published nothing for more than ``timeout_s`` seconds (monotonic
        ``now``), or ``None`` while it publishes (or has nothing to publish: no observation since
        activation). The node's health is derived from this — from chunks actually published, not
        from the absence of errors (``/diagnostics`` ERROR)."""
        if not self.alive:
            return "the inference thread is not running" if self._thread is not None else None
        if not self.observed:
            return None
        since = now - (self.last_chunk_at if self.last_chunk_at is not None else self.started_at)
        if since <= timeout_s:
            return None
        started = self.frame_started_at
        if started is not None and now - started > timeout_s:
            return f"no action chunk for {since:.1f} s: one inference frame has run for {now - started:.1f} s"
        return f"no action chunk published for {since:.1f} s (chunk_timeout_s {timeout_s:.1f})"

    def _handle(self, result: FrameResult) -> None:
        # the frame's text first: if anything below raises (the supervisor restarts the loop), the
        # restart still publishes it — an answer that ended in this frame is never lost
        self._unsent.append(self.utterances.frame(result.deltas, result.ended))
        self._stats.record(time.monotonic(), result.metrics, result.action is not None)
        if result.error:
            self._report("frame_dropped", result.error, WARN)
        for f in result.faults:  # contained engine faults: counted by kind, traceback logged once
            if f.kind not in self._logged_faults:
                self._logged_faults.add(f.kind)
                self._log.error(f"engine fault in {f.stage} (contained):\n{f.trace}")
            self._report(
                f"fault_{f.kind}", f"{f.error} (frame {f.frame_id}, failed requests {list(f.request_ids)})", ERROR
            )
        for r in result.ended:
            if r.outcome in self.ended:  # every end but finishing; its utterance says why
                self.ended[r.outcome] += 1
                if r.outcome != "cancelled":  # a cancel is asked for, not a problem
                    self._report(f"request_{r.outcome}", f"request {r.id} ({r.task}) {r.outcome}: {r.reason}", WARN)
        if not self._stop.is_set():  # else the node is deactivating or shutting down: the node decides
            self._publish_unsent()
        self._snapshot()

    def _publish_unsent(self) -> None:
        """Publish the text not yet published, oldest frame first, one message at a time; each
        leaves the queue only once its publish returned. If a publish raises, it and everything
        after it stay queued, and the supervisor's restart publishes them before the notices of
        the requests it ends — a finished answer is never lost with the frame that failed."""
        while self._unsent:
            by_task = self._unsent[0]
            while by_task:
                task, emits = next(iter(by_task.items()))
                while emits:
                    self._out.publish_text(task, emits[:1])
                    del emits[0]
                del by_task[task]
            del self._unsent[0]

    def end_requests(self, reason: str) -> int:
        """After :meth:`stop` (thread ended, publishers still active): publish the text of the
        last frame, then cancel every request still in flight with ``reason`` and end its utterance
        with that reason, so no ask is left unanswered by a deactivation or a shutdown. Returns how
        many ended."""
        assert not self.alive, "end_requests() while the inference thread runs"
        return self._end_all(reason)

    def _end_all(self, reason: str) -> int:
        """Publish the text not yet published (held back while stopping, or left by a publish
        that raised), then cancel every request in flight with ``reason`` (the concurrent
        schedule's granted decode steps run first) and publish the end of each utterance. Runs in
        the thread that steps the engine (or after it ended)."""
        self._publish_unsent()  # first, before the engine is asked anything
        flushed = self._engine.flush()  # the concurrent schedule's granted decode steps
        ended = flushed.ended + self._engine.cancel_all(reason)
        for r in ended:
            if r.outcome in self.ended:
                self.ended[r.outcome] += 1
        self._unsent.append(self.utterances.frame(flushed.deltas, ended))
        self._publish_unsent()
        self._snapshot()
        return len(ended)

    def abandon(self, reason: str, outcome: str = "failed") -> int:
        """End every open utterance on the text topics with ``[request N <outcome>: <reason>]``
        without the engine: the last resort when the engine cannot end its requests (a broken
        engine), or when the node must exit while a frame still runs (shutdown). Returns how many
        utterances were ended."""
        by_task = self.utterances.abandon(reason, outcome)
        for task, emits in by_task.items():
            self._out.publish_text(task, emits)
        return sum(1 for emits in by_task.values() for e in emits if e.kind == "text")

    def _snapshot(self) -> None:
        snap: dict[str, int] = {
            "running_requests": self._engine.running,
            "queued_requests": self._engine.queued,
            "requests_in_flight": self._engine.in_flight,
        }
        for task, row in self._engine.request_counts().items():
            snap.update({f"requests_{task}_{k}": v for k, v in row.items()})
        self.snapshot = snap
