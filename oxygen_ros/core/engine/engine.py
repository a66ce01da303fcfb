"""The engine facade: one control frame per :meth:`Engine.step` (OxyGen §3–4).

1. take the newest observation and what was submitted since the last frame (one
   :class:`FrameInputs` value, drained under the lock); 2. prefill the observation once into pool
   blocks; 3. the action path over the read-only prefix → action chunk, handed out first
   (``on_action``); 4.–5. the frame's language half (:class:`~.language.LanguageStage`): admission
   onto this frame's prefix, first tokens, batched decode — in ``unified`` mode every running
   request, whatever frame it started in, advances up to k tokens; ``shared_kv`` / ``isolated``
   finish this frame's requests within the frame (``isolated`` also prefills a private prefix copy
   per request, openpi-style).

This class is the serial schedule: the language half runs in the stepping thread right after the
chunk. The concurrent schedule (:class:`oxygen_ros.core.loops.concurrent.ConcurrentEngine`) runs
the same step with the language half handed to its batcher thread; the two differ only in the
hooks :meth:`Engine._prefix_table`, :meth:`Engine._language` and :meth:`Engine._language_pending`.

Thread-safety: ``submit_observation`` / ``submit_request`` / ``cancel`` / ``reconfigure`` may be
called from other threads (ROS callbacks); ``step`` runs in one inference thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cache.block_pool import BlockTable
from ..cache.kv_pool import KVPool
from ..cache.memory import size_engine
from ..config import EngineConfig
from ..live import live_configs
from ..model.flow import euler_times
from ..policy import EncodedObservation, Pi05Policy, frame_noise
from ..processing import InvalidInputError, NonFiniteActionError
from ..rtc.config import RTCConfig
from ..rtc.handover import ChunkHandover
from ..types import ActionChunk, FrameMetrics, Observation
from .compiled import warmup_observations
from .faults import Fault, FaultLog
from .frame import FramePrefix
from .language import LanguageFrame, LanguageOutput, LanguageStage
from .metrics import ScheduleMeter
from .plan import FramePlan
from .request_book import RequestBook
from .requests import FrameResult, LanguageRequest, Prompt, RequestResult, RequestStatus
from .runner import Runner, uses_flex
from .scheduler import Scheduler
from .streams import DeviceStreams, StageClock


@dataclass
class FrameInputs:
    """What the engine's inputs held when a frame began (taken under the lock, then passed on).

    Attributes:
        obs: the newest observation, or ``None`` (no new one since the last frame).
        obs_at: ``perf_counter`` seconds when ``obs`` was submitted (RTC's measured delay).
        explicit: ``(prev_chunk_left_over [T_left, A], inference_delay)`` given with ``obs``, or ``None``.
        new / cancels: requests and cancel ids submitted since the last frame.
        cfg: the engine config this frame runs with (live settings as of now).
    """

    obs: Observation | None
    obs_at: float
    explicit: tuple[Any, int | None] | None
    new: list[LanguageRequest]
    cancels: set[int]
    cfg: EngineConfig


@dataclass
class FrameAction:
    """The action half's outputs of one frame (filled in as it goes, so a failure midway still
    tells the frame which prefix blocks to release).

    Attributes:
        action: the chunk, or ``None`` (``error`` says why, unless there was no observation).
        enc / prefix / ready: the encoded observation, its prefilled prefix (the frame's
            reference) and the prefix-ready event — what language requests start on.
    """

    action: ActionChunk | None = None
    error: str | None = None
    enc: EncodedObservation | None = None
    prefix: FramePrefix | None = None
    ready: object | None = None
    t_chunk: float | None = None


class WarmupError(RuntimeError):
    """The engine's warm-up frame produced no action chunk (see :meth:`Engine.warmup`)."""


class Engine:
    """Unified KV cache engine over one :class:`Pi05Policy` — the serial schedule (module doc).

    Args:
        policy: the model with its tokenizer and normaliser.
        cfg: engine settings (validated; the KV pool is sized from them and the model).
        rtc: real-time chunking of the action path (default: off).
        rtc_relative / stamp_clock: the RTC hand-over's action dims relative to a state dim and
            the clock of the observation stamps (:class:`~oxygen_ros.core.rtc.handover.ChunkHandover`).

    Raises:
        ConfigError: an invalid ``cfg`` / ``rtc``, or a pool that cannot be held (``size_engine``).
    """

    schedule = "serial"

    def __init__(
        self,
        policy: Pi05Policy,
        cfg: EngineConfig | None = None,
        rtc: RTCConfig | None = None,
        *,
        rtc_relative: tuple[Any, Any] | None = None,
        stamp_clock: Callable[[], float] | None = None,
    ) -> None:
        cfg = (cfg or EngineConfig()).validate()
        self.rtc = (rtc or RTCConfig()).validate()
        self.policy = policy
        mc, dev = policy.cfg, policy.model.device
        # the one current config: read per frame into FrameInputs, swapped only by reconfigure()
        self.cfg, self.pool_plan = size_engine(
            cfg, mc, policy.model.dtype, dev, uses_flex(cfg, dev)
        )  # nothing allocated yet
        self.pool = KVPool(
            mc.vlm.depth,
            self.pool_plan.blocks,
            self.cfg.block_size,
            mc.vlm.num_kv_heads,
            mc.vlm.head_dim,
            policy.model.dtype,
            dev,
        )
        self.streams = DeviceStreams(dev)
        self.clock = StageClock(self.streams.cuda)
        self.runner = Runner(policy, self.pool, self.streams, self.cfg, rtc=self.rtc.enabled)
        self.scheduler = Scheduler(self.pool.blocks, mc.max_prefix_len, self.cfg.max_running_requests)
        self.faults = FaultLog(dev)  # the stepping thread's; the language half's faults are added each frame
        language_faults = FaultLog(dev)
        self.book = RequestBook(self.scheduler, policy, self.pool, self.streams, language_faults)
        serial = self.schedule == "serial"
        policy_name = "frame" if serial else self.cfg.batcher_policy
        self.language = LanguageStage(
            self.book,
            self.scheduler,
            self.runner,
            self.streams,
            language_faults,
            policy=policy_name,
            late_cancels=self.take_cancels if serial or policy_name == "continuous" else None,
        )
        self.num_steps = self.cfg.num_denoise_steps or mc.num_denoise_steps
        self.handover = ChunkHandover(
            self.rtc,
            policy.normalizer,
            mc.action_horizon,
            mc.action_dim,
            euler_times(self.num_steps)[0],
            rtc_relative,
            stamp_clock,
        )  # core.rtc
        self.meter = ScheduleMeter()
        self.frame_id = 0
        self.dropped_observations = 0
        self._lock = threading.Lock()  # guards the inputs below (any thread) and the config swap
        self._obs: Observation | None = None
        self._obs_at = 0.0
        self._explicit: tuple[Any, int | None] | None = None
        self._new: list[LanguageRequest] = []
        self._cancels: set[int] = set()
        self._rtc_next: RTCConfig | None = None  # reconfigure(): the hand-over takes it at the next frame
        self.ready = False  # set by warmup(): every hot-path shape ran once (compiled if enabled)
        self.warmup_s = 0.0

    # ------------------------------------------------------------------ inputs (any thread)
    def submit_observation(
        self, obs: Observation, *, prev_chunk_left_over: Any = None, inference_delay: int | None = None
    ) -> None:
        """Make ``obs`` the newest observation (an unprocessed older one is superseded). With RTC on,
        ``prev_chunk_left_over`` ``[T_left, A]`` (normalised model space, LeRobot's argument) and
        ``inference_delay`` (rows) replace the remembered previous chunk for this observation."""
        with self._lock:
            self._obs, self._obs_at = obs, time.perf_counter()
            self._explicit = None if prev_chunk_left_over is None else (prev_chunk_left_over, inference_delay)

    def prompt(self, task: str, text: str, instruction: str) -> Prompt | None:
        """Build the prompt of a request of ``task`` now — ``text`` checked against
        ``max_request_chars`` first, then the template filled with ``instruction`` and tokenized —
        in the calling thread with no lock held, for :meth:`submit_request` (``prompt=``).

        Raises:
            KeyError: unknown task.
        """
        return self.book.prompt_of(self.cfg, task, text, instruction)

    def submit_request(
        self,
        task: str,
        text: str = "",
        max_new_tokens: int | None = None,
        *,
        temperature: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop_ids: tuple[int, ...] = (),
        instruction: str | None = None,
        prompt: Prompt | None = None,
    ) -> int:
        """Queue a language request of ``task`` (template and defaults from the task config).

        Its prompt: ``prompt`` (from :meth:`prompt`), or built here from ``instruction``, in the
        calling thread — never the stepping one; with neither, at admission from the frame's
        instruction. A text over ``max_request_chars``, a prompt that cannot be built, or a prompt
        + budget that can never fit beside the action path is rejected here (REJECTED with the
        reason, delivered in the next frame's ``ended``).

        Returns:
            The request id (its deltas and result carry it).

        Raises:
            KeyError: unknown task; ValueError: bad ``max_new_tokens`` / sampling parameters.
        """
        if prompt is None:
            prompt = self.book.prompt_of(self.cfg, task, text, instruction)  # outside the lock
        with self._lock:  # accepted and placed in one step: the accounting never sees it nowhere
            cfg = self.cfg
            r = self.book.new_request(cfg, task, text, max_new_tokens, temperature, top_k, seed, stop_ids, prompt)
            if r.status == RequestStatus.QUEUED:
                reason = self.scheduler.submission_check(cfg, r)
                if reason is not None:  # can never fit: rejected now, reported in the next frame's ``ended``
                    r.status, r.reason = RequestStatus.REJECTED, reason
            self._new.append(r)
        return r.id

    def cancel(self, request_id: int) -> bool:
        """Cancel a request before its next token (concurrent: its next frame). False if unknown or over."""
        with self._lock:
            if not self.book.is_live(request_id):
                return False
            self._cancels.add(request_id)
            return True

    def take_cancels(self) -> set[int]:
        """The cancel ids submitted since they were last taken (the serial language half takes
        them before each decode step, so a cancel stops a request before its next token)."""
        with self._lock:
            cancels, self._cancels = self._cancels, set()
        return cancels

    def reconfigure(self, cfg: EngineConfig | None = None, rtc: RTCConfig | None = None) -> None:
        """Take new live settings (any thread): requests submitted from now on and the next frame use
        ``cfg``, the next chunk ``rtc`` (``None``: unchanged; :mod:`..live` lists the live fields).

        Raises:
            ConfigError: a field that is not live differs (named), or a value is invalid.
        """
        cfg, rtc = live_configs(self.cfg, cfg, self.rtc, rtc)
        with self._lock:  # the one place the config is swapped
            self.cfg = cfg
            self.rtc = self._rtc_next = rtc

    def _drain(self) -> FrameInputs:
        """Take the inputs for a frame (newest observation, new requests, cancels, config)."""
        with self._lock:
            inp = FrameInputs(self._obs, self._obs_at, self._explicit, self._new, self._cancels, self.cfg)
            self._obs, self._new, self._cancels = None, [], set()
            rtc, self._rtc_next = self._rtc_next, None
        if rtc is not None:
            self.handover.reconfigure(rtc)
        return inp

    # ------------------------------------------------------------------ one frame
    def step(self, on_action: Callable[[ActionChunk], None] | None = None) -> FrameResult:
        """Run one control frame (see module doc). Never raises an ``Exception``: bad input or a
        stage exception (contained, :mod:`.faults`) drops the chunk with ``error`` set, or fails
        the touched requests.

        Raises:
            RuntimeError: concurrent schedule only — the batcher thread died of a non-``Exception``.
        """
        self._before_step()
        t0 = time.perf_counter()
        self.pool.blocks.reclaim(self.streams.is_done)
        inp = self._drain()
        fid = self.frame_id
        self.faults.begin_frame(fid)
        m = FrameMetrics(frame_id=fid, blocks_total=self.pool.blocks.num_blocks)
        language = bool(inp.new) or self.running + self.queued > 0
        act = FrameAction()
        try:
            self._action(inp, fid, m, act)
            if act.action is not None and on_action is not None:
                with self.faults.guard("action_callback"):
                    on_action(act.action)
            act.t_chunk = None if act.action is None else time.perf_counter()
        except Exception as e:  # outside any guarded stage (a bug): drop the chunk, go on
            act.action, act.error = None, f"frame failed: {self.faults.record('frame', e).error}"
        prefix = act.prefix
        if prefix is not None and (act.enc is None or not self._may_start(inp, fid)):
            self.pool.blocks.free(prefix.blocks, self.streams.fence())  # nothing can start on it
            prefix = None
        frame = LanguageFrame(
            fid,
            inp.cfg,
            inp.new,
            inp.cancels,
            None if inp.obs is None else inp.obs.instruction,
            act.enc,
            prefix,
            act.ready,
            t0,
        )
        out = self._language(frame)
        faults = list(self.faults.frame) + self._absorb(out)
        m.tokens_emitted, m.decode, m.decode_steps, m.decode_batch = (
            out.tokens,
            out.decode,
            out.decode_steps,
            out.decode_batch,
        )
        m.frame_time = time.perf_counter() - t0
        if self.schedule == "serial":  # the language half ran in this thread: part of the frame's time
            m.vision += out.vision
            m.prefill += out.prefill
            m.extra["start"] = out.start
            busy = in_step = out.decode + out.start
        else:
            busy, in_step = out.busy, 0.0
        m.bookkeeping = max(0.0, m.frame_time - m.vision - m.prefill - m.denoise - in_step)
        m.blocks_in_use = self.pool.blocks.num_in_use
        m.deadline_met = inp.cfg.frame_deadline_s <= 0 or m.frame_time <= inp.cfg.frame_deadline_s
        self.meter.frame(m, t0, act.t_chunk, busy, language)
        plan = out.plans[-1] if out.plans else FramePlan(fid)  # the newest frame the language half finished
        return FrameResult(fid, act.action, out.deltas, out.ended, m, act.error, plan, faults)

    def _action(self, inp: FrameInputs, fid: int, m: FrameMetrics, act: FrameAction) -> None:
        """Encode → prefill (blocks from :meth:`_prefix_table`) → prefix-ready event → denoise,
        on the action lane, into ``act``."""
        obs = inp.obs
        if obs is None:
            return
        self.frame_id += 1
        with self.faults.guard("observation") as g:
            try:
                act.enc = self.policy.encode_observation(obs)
            except InvalidInputError as e:
                act.error = self._drop("observation", str(e))
                return
        if g.fault:
            act.error = self._drop("observation", f"failed in observation: {g.fault.error}")
            return
        assert act.enc is not None  # no fault: encode_observation returned
        table = self._prefix_table(act.enc.prefix_len)
        with self.streams.action():
            with self.faults.guard("prefill") as g:
                c0 = self.clock.mark()
                act.prefix = self.runner.prefill_new(act.enc, fid, table)
                c1 = self.clock.mark()
                act.ready = self.streams.event()
                self.streams.hand_over(act.prefix.last_hidden, "decode")
            if g.fault:
                act.enc = None  # nothing starts on a frame without a prefix
                act.error = self._drop("action chunk", f"failed in prefill: {g.fault.error}")
                return
            assert act.prefix is not None  # no fault: prefill_new returned
            act.action, act.error = self._denoise(inp, act.prefix, fid, m)  # the chunk reaches the host
            c2 = self.clock.mark()
        if self.streams.cuda and not self.streams.host_sync:  # events; vision is inside the prefill events
            m.vision, m.prefill, m.denoise = 0.0, self.clock.seconds(c0, c1), self.clock.seconds(c1, c2)
        else:
            m.vision, m.prefill = act.prefix.stage_times["vision"], act.prefix.stage_times["prefill"]

    def _drop(self, what: str, reason: str) -> str:
        self.dropped_observations += 1
        self.handover.forget("dropped")  # the next chunk is not guided toward a stale one
        return f"{what} dropped: {reason}"

    def _denoise(
        self, inp: FrameInputs, prefix: FramePrefix, fid: int, m: FrameMetrics
    ) -> tuple[ActionChunk | None, str | None]:
        """Guarded denoise over the frame's prefix: the chunk, or ``None`` and the drop reason."""
        t1 = time.perf_counter()
        obs = inp.obs
        assert obs is not None  # _action denoises only a frame with an observation
        action, error = None, None
        with self.faults.guard("denoise") as g:
            try:
                mc = self.policy.cfg
                noise = frame_noise(inp.cfg.seed, fid, mc.action_horizon, mc.action_dim)
                guide = self.handover.guide(obs, inp.explicit)
                x = self.runner.actions_normalized(prefix, noise, self.num_steps, guide)[0].float().cpu().numpy()
                action = ActionChunk(self.policy.normalizer.unnormalize_actions(x), obs.stamp, fid)
                self.handover.emitted(x, obs, time.perf_counter() - inp.obs_at)
            except (NonFiniteActionError, ValueError) as e:  # ValueError: a malformed explicit leftover
                error = self._drop("action chunk", str(e))
            self.streams.sync()
        if g.fault:
            error = self._drop("action chunk", f"failed in denoise: {g.fault.error}")
        m.denoise = time.perf_counter() - t1
        return action, error

    def _absorb(self, out: LanguageOutput) -> list[Fault]:
        """Count the language half's contained faults in the engine's log; returns them."""
        for kind, n in out.fault_counts.items():
            self.faults.counts[kind] = self.faults.counts.get(kind, 0) + n
        self.faults.cache_emptied += out.cache_emptied
        return list(out.faults)

    # ------------------------------------------------------------------ schedule hooks
    def _before_step(self) -> None:
        """Anything the schedule needs before a frame (serial: nothing)."""

    def _prefix_table(self, tokens: int) -> BlockTable:
        """The block table the frame's prefix is prefilled into (serial: an empty one; its blocks
        are taken by the prefill — the scheduler's reserve keeps them free)."""
        return BlockTable(self.pool.blocks)

    def _language(self, frame: LanguageFrame) -> LanguageOutput:
        """Run the frame's language half (serial: here, now) and return what it produced."""
        return self.language.run(frame)

    def _language_pending(self) -> int:
        """Frames whose language half has not run yet (serial: none)."""
        return 0

    def _may_start(self, inp: FrameInputs, fid: int) -> bool:
        """Whether a request could start on this frame's prefix (else it is released at once)."""
        if inp.new or self.scheduler.queue or self._language_pending():
            return True
        return any(t.every_n_frames and fid % t.every_n_frames == 0 for t in inp.cfg.tasks)

    def warmup(self, frames: int = 1, cameras: list[int] | None = None) -> float:
        """Run every hot-path shape once before the engine reports :attr:`ready`: one throw-away
        frame per camera count (vision / prefill / denoise buckets), one decode step per batch
        bucket (on padding rows that touch only the null block), then ``frames - 1`` more blank
        frames. With ``compile`` this is where every graph is compiled / captured.

        ``cameras``: the camera counts to warm (default: 1 … all slots — a stale camera changes the
        count at run time). Leaves no trace: frame ids restart at 0 and nothing is queued or held.
        Call before submitting anything. Returns the warm-up time in seconds (also :attr:`warmup_s`, reported
        apart from steady-state frame times).

        Raises:
            WarmupError: a warm-up frame produced no chunk (non-finite: NaN weights; a stage that
                failed: a size that cannot be allocated), with the frame's drop reason.
        """
        t0 = time.perf_counter()
        for obs in warmup_observations(self.policy, frames, cameras, self.runner.static):
            self.submit_observation(obs)
            r = self.step()
            if r.action is None:  # the model cannot act (NaN weights, a size that does not fit): refuse now
                cams = sum(img is not None for img in obs.images.values())
                raise WarmupError(
                    f"warm-up frame ({cams} camera(s), blank images) produced no action chunk: {r.error or 'no chunk'}"
                )
        self.runner.warm_decode_buckets()
        self.streams.sync()
        self.runner.seal()
        self.cancel_all()  # the warm-up's periodic requests: ended, then forgotten with their counts
        self.handover.clear()  # and its chunks, latencies (compile time) and counts
        self.book.forget()
        self.frame_id = 0
        self.meter.reset()
        self.warmup_s = time.perf_counter() - t0
        self.ready = True
        return self.warmup_s

    def diagnostics(self) -> dict[str, object]:
        """Readiness and compilation state for ``/diagnostics``: ``ready``, ``warmup_s``,
        ``compile`` mode, the stages running compiled, and per compiled stage its graphs
        (``graphs_<stage>``), its recompiles after warm-up (``recompiles_<stage>``, when any) and
        any eager fallback with its reason (``fallback_<stage>``)."""
        return {
            "ready": self.ready,
            "warmup_s": round(self.warmup_s, 3),
            "compile": self.cfg.compile,
            "attention": "flex" if self.runner.flex else "gather",
            **self.runner.compile_state(),
            **self.handover.diagnostics(),
        }

    def reset_chunks(self, reason: str = "reset") -> None:
        """Forget the last action chunk (the robot was reset or stopped): the next one is not guided."""
        self.handover.forget(reason)

    # ------------------------------------------------------------------ inspection
    def check_invariants(self) -> None:
        """Raise unless the pool is consistent (:meth:`RequestBook.check_invariants`) and every
        accepted request is accounted for (:meth:`RequestBook.check_accounting`). Call it from the
        stepping thread, between frames."""
        self.book.check_invariants()
        with self._lock:
            self.book.check_accounting(self._located())

    def _located(self) -> list[LanguageRequest]:
        """Live requests not yet drained, queued or running (the caller holds ``self._lock``)."""
        running = [r for r in self.scheduler.running if not r.status.terminal]
        return list(self._new) + list(self.scheduler.queue) + running

    def request_counts(self) -> dict[str, dict[str, int]]:
        """Per task: submitted, finished, rejected, expired, failed, cancelled, in_flight (warm-up
        excluded; :class:`~.requests.RequestCounts`)."""
        return self.book.counts.snapshot()

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet ended, wherever they are (not yet drained included)."""
        return self.book.num_live

    @property
    def queued(self) -> int:
        """Requests waiting for admission."""
        return len(self.scheduler.queue)

    @property
    def running(self) -> int:
        """Requests decoding."""
        return sum(1 for r in self.scheduler.running if not r.status.terminal)

    def flush(self) -> FrameResult:
        """Language work handed out but not yet returned by a step (``action=None``, ``frame_id`` =
        the next frame). The serial schedule returns everything with each step: an empty result."""
        return FrameResult(
            self.frame_id, None, [], [], FrameMetrics(frame_id=self.frame_id, blocks_total=self.pool.blocks.num_blocks)
        )

    def close(self) -> list[RequestResult]:
        """End of the engine's life: cancel every request, release all blocks (the concurrent
        schedule also stops its batcher); returns the ended results."""
        return self.cancel_all()

    def cancel_all(self, reason: str = "cancelled") -> list[RequestResult]:
        """Cancel every request (not yet drained, queued, running) with ``reason``; returns the ended results."""
        with self._lock:
            new, self._new = self._new, []
            cfg = self.cfg
        self.book.begin_frame()
        self.book.enqueue(cfg, new)
        self.book.cancel({r.id for r in list(self.scheduler.queue) + self.scheduler.running}, reason)
        self.scheduler.drop_terminal()
        return self.book.end_frame()[1]


__all__ = ["Engine", "WarmupError"]
