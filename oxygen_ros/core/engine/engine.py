"""The engine facade: one control frame per :meth:`Engine.step` (DESIGN §5, OxyGen §3–4).

1. take the newest observation; 2. prefill it once into pool blocks; 3. action path over the
read-only prefix → action chunk, handed out first (``on_action``); 4. admit language requests onto
this frame's prefix; 5. batched decode — in ``unified`` mode every running request, whatever frame
it started in, advances up to k tokens; ``shared_kv`` / ``isolated`` finish this frame's requests
within the frame (``isolated`` also prefills a private prefix copy per request, openpi-style).

Thread-safety: ``submit_observation`` / ``submit_request`` / ``cancel`` may be called from other
threads (ROS callbacks); ``step`` runs in one inference thread.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..cache.block_pool import BlockTable
from ..cache.kv_pool import KVPool
from ..cache.memory import size_engine
from ..config import EngineConfig
from ..live import live_configs
from ..model.flow import euler_times
from ..policy import Pi05Policy, frame_noise
from ..rtc.config import RTCConfig
from ..rtc.handover import ChunkHandover
from ..processing import InvalidInputError, NonFiniteActionError
from ..types import ActionChunk, FrameMetrics, Observation
from .compiled import warmup_observations
from .faults import FaultLog
from .lifecycle import RequestBook
from .frame import FramePrefix
from .plan import FramePlan
from .requests import FrameResult, LanguageRequest, Prompt, RequestStatus
from .runner import Runner, uses_flex
from .scheduler import Scheduler
from .streams import DeviceStreams


class WarmupError(RuntimeError):
    """The engine's warm-up frame produced no action chunk (see :meth:`Engine.warmup`)."""


class Engine:
    """Unified KV cache engine over one :class:`Pi05Policy`."""

    def __init__(self, policy: Pi05Policy, cfg: EngineConfig | None = None, rtc: RTCConfig | None = None) -> None:
        self.cfg = (cfg or EngineConfig()).validate()
        self.rtc = (rtc or RTCConfig()).validate()
        self.policy = policy
        mc = policy.cfg
        self.cfg, self.pool_plan = size_engine(self.cfg, mc, policy.model.dtype, policy.model.device,
                                               uses_flex(self.cfg, policy.model.device))  # nothing allocated yet
        self.pool = KVPool(mc.vlm.depth, self.pool_plan.blocks, self.cfg.block_size, mc.vlm.num_kv_heads,
                           mc.vlm.head_dim, policy.model.dtype, policy.model.device)
        self.streams = DeviceStreams(policy.model.device)
        self.runner = Runner(policy, self.pool, self.streams, self.cfg, rtc=self.rtc.enabled)
        self.scheduler = Scheduler(self.cfg, self.pool.blocks, mc.max_prefix_len)
        self.book = RequestBook(self.cfg, self.scheduler, self.policy, self.pool, self.streams)
        self.faults = FaultLog(policy.model.device)
        self.book.faults = self.faults
        self.num_steps = self.cfg.num_denoise_steps or mc.num_denoise_steps
        self.handover = ChunkHandover(self.rtc, policy.normalizer, mc.action_horizon, mc.action_dim,
                                      euler_times(self.num_steps)[0])  # real-time chunking (core.rtc)
        self._obs_at, self._taken_at, self._explicit, self._taken_explicit = 0.0, 0.0, None, None
        self._rtc_next: RTCConfig | None = None  # reconfigure(): the hand-over takes it at the next frame
        self.frame_id = 0
        self.dropped_observations = 0
        self._lock = threading.Lock()
        self._obs: Observation | None = None
        self._new: list[LanguageRequest] = []
        self._cancels: set[int] = set()
        self.ready = False  # set by warmup(): every hot-path shape ran once (compiled if enabled)
        self.warmup_s = 0.0

    # ------------------------------------------------------------------ inputs (any thread)
    def submit_observation(self, obs: Observation, *, prev_chunk_left_over=None, inference_delay: int | None = None) -> None:
        """Make ``obs`` the newest observation (an unprocessed older one is superseded). With RTC on,
        ``prev_chunk_left_over`` ``[T_left, A]`` (normalised model space, LeRobot's argument) and
        ``inference_delay`` (rows) replace the remembered previous chunk for this observation."""
        with self._lock:
            self._obs, self._obs_at = obs, time.perf_counter()
            self._explicit = None if prev_chunk_left_over is None else (prev_chunk_left_over, inference_delay)

    def prompt(self, task: str, text: str, instruction: str) -> Prompt:
        """Build the prompt of a request of ``task`` now — ``text`` checked against
        ``max_request_chars`` first, then the template filled with ``instruction`` and tokenized —
        in the calling thread with no lock held, for :meth:`submit_request` (``prompt=``).

        Raises:
            KeyError: unknown task.
        """
        return self.book.prompt_of(self.cfg, task, text, instruction)

    def submit_request(self, task: str, text: str = "", max_new_tokens: int | None = None, *,
                       temperature: float | None = None, top_k: int | None = None, seed: int | None = None,
                       stop_ids: tuple[int, ...] = (), instruction: str | None = None,
                       prompt: Prompt | None = None) -> int:
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
            r = self.book.new_request(task, text, max_new_tokens, temperature, top_k, seed, stop_ids, prompt)
            if r.status == RequestStatus.QUEUED:
                reason = self.scheduler.submission_check(r)
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

    def reconfigure(self, cfg: EngineConfig | None = None, rtc: RTCConfig | None = None) -> None:
        """Take new live settings (any thread): requests submitted from now on and the next frame use
        ``cfg``, the next chunk ``rtc`` (``None``: unchanged; :mod:`..live` lists the live fields).

        Raises:
            ConfigError: a field that is not live differs (named), or a value is invalid.
        """
        cfg, rtc = live_configs(self.cfg, cfg, self.rtc, rtc)
        with self._lock:  # submit_request reads the task settings under this lock
            self.cfg = self.runner.cfg = self.scheduler.cfg = self.book.cfg = cfg
            self.rtc = self._rtc_next = rtc

    def _drain(self) -> tuple[Observation | None, list[LanguageRequest], set[int]]:
        with self._lock:
            obs, self._obs = self._obs, None
            self._taken_at, self._taken_explicit = self._obs_at, self._explicit
            new, self._new = self._new, []
            cancels, self._cancels = self._cancels, set()
            rtc, self._rtc_next = self._rtc_next, None
        if rtc is not None:
            self.handover.reconfigure(rtc)
        return obs, new, cancels

    def _drain_cancels(self) -> set[int]:
        with self._lock:
            cancels, self._cancels = self._cancels, set()
        return cancels

    # ------------------------------------------------------------------ one frame
    def step(self, on_action: Callable[[ActionChunk], None] | None = None) -> FrameResult:
        """Run one control frame (see module doc). Never raises: bad input or a stage exception
        (contained, :mod:`.faults`) drops the chunk with ``error`` set, or fails the touched requests."""
        t0 = time.perf_counter()
        self.pool.blocks.reclaim(self.streams.is_done)
        obs, new, cancels = self._drain()
        fid = self.frame_id
        self.book.begin_frame()
        self.faults.begin_frame(fid)
        plan = FramePlan(fid)
        m = FrameMetrics(frame_id=fid, blocks_total=self.pool.blocks.num_blocks)
        self._prefix: FramePrefix | None = None
        try:
            action, error = self._frame(obs, new, cancels, m, plan, t0, on_action)
        except Exception as e:  # outside any guarded stage (a bug): fail what is running, go on
            live = [r for r in self.scheduler.running if not r.status.terminal]
            f = self.faults.record("frame", e, [r.id for r in live])
            self.book.fail(live, f"failed in frame: {f.error}")
            action, error = None, f"frame failed: {f.error}"
        if self._prefix is not None:  # the frame's reference; requests on it hold their own
            self.pool.blocks.free(self._prefix.blocks, self.streams.fence())
        self.scheduler.drop_terminal()
        m.frame_time = time.perf_counter() - t0
        m.bookkeeping = max(0.0, m.frame_time - m.vision - m.prefill - m.denoise - m.decode - m.extra.get("start", 0.0))
        m.blocks_in_use = self.pool.blocks.num_in_use
        m.deadline_met = self.cfg.frame_deadline_s <= 0 or m.frame_time <= self.cfg.frame_deadline_s
        deltas, ended = self.book.end_frame()
        plan.finished = [e.id for e in ended]
        m.tokens_emitted = self.book.tokens_this_frame
        return FrameResult(fid, action, deltas, ended, m, error, plan, list(self.faults.frame))

    def _drop(self, what: str, reason: str) -> str:
        self.dropped_observations += 1
        self.handover.forget("dropped")  # the next chunk is not guided toward a stale one
        return f"{what} dropped: {reason}"

    def _frame(self, obs, new, cancels, m: FrameMetrics, plan: FramePlan, t0: float, on_action) -> tuple[ActionChunk | None, str | None]:
        self.book.enqueue(new)
        self.book.cancel(cancels)
        self.book.expire()
        fid = self.frame_id
        action, error, enc = None, None, None
        if obs is not None:
            self.frame_id += 1
            self.book.periodic(fid, obs.instruction)
            with self.faults.guard("observation") as g:
                try:
                    enc = self.policy.encode_observation(obs)
                except InvalidInputError as e:
                    error = self._drop("observation", str(e))
            if g.fault:
                error = self._drop("observation", f"failed in observation: {g.fault.error}")
        if enc is not None:
            with self.streams.action():
                with self.faults.guard("prefill") as g:
                    self._prefix = self._prefill(enc, fid)
                    m.vision, m.prefill = self._prefix.stage_times["vision"], self._prefix.stage_times["prefill"]
                if g.fault:
                    error = self._drop("action chunk", f"failed in prefill: {g.fault.error}")
                else:
                    action, error = self._act(obs, fid, m)
            if action is not None and on_action is not None:
                with self.faults.guard("action_callback"):
                    on_action(action)
            if self._prefix is not None:
                self._start_requests(obs, enc, self._prefix, m, plan)
        self._decode(m, t0, plan)
        return action, error

    def _act(self, obs: Observation, fid: int, m: FrameMetrics) -> tuple[ActionChunk | None, str | None]:
        """Guarded denoise over the frame's prefix: the chunk, or ``None`` and the drop reason."""
        t1 = time.perf_counter()
        action, error = None, None
        with self.faults.guard("denoise") as g:
            try:
                noise = frame_noise(self.cfg.seed, fid, self.policy.cfg.action_horizon, self.policy.cfg.action_dim)
                guide = self.handover.guide(obs, self._taken_explicit)
                x = self.runner.actions_normalized(self._prefix, noise, self.num_steps, guide)[0].float().cpu().numpy()
                action = ActionChunk(self.policy.normalizer.unnormalize_actions(x), obs.stamp, fid)
                self.handover.emitted(x, obs, time.perf_counter() - self._taken_at)
            except (NonFiniteActionError, ValueError) as e:  # ValueError: a malformed explicit leftover
                error = self._drop("action chunk", str(e))
            self.streams.sync()
        if g.fault:
            error = self._drop("action chunk", f"failed in denoise: {g.fault.error}")
        m.denoise = time.perf_counter() - t1
        return action, error

    def _prefill(self, enc, frame_id: int) -> FramePrefix:
        """Prefill into fresh blocks; if it raises, the blocks it took are released first."""
        table = BlockTable(self.pool.blocks)
        try:
            return self.runner.prefill(enc, frame_id, table)
        except BaseException:
            table.release(self.streams.fence())
            raise

    def _start_requests(self, obs: Observation, enc, prefix: FramePrefix, m: FrameMetrics, plan: FramePlan) -> None:
        t = time.perf_counter()
        staged = m.vision + m.prefill + m.decode  # model time spent inside this call is not "start"
        with self.streams.decode():
            own = self.book.start_on(prefix, enc, obs.instruction, plan, self.faults, self._prefill,
                                     self.runner.start, lambda batch: self._decode_once(batch, m))
        for p in own:
            m.vision += p.stage_times["vision"]
            m.prefill += p.stage_times["prefill"]
        m.extra["start"] = time.perf_counter() - t - (m.vision + m.prefill + m.decode - staged)

    def _decode_once(self, batch: list[LanguageRequest], m: FrameMetrics) -> bool:
        """One guarded decode step of ``batch``; False if it failed (the batch then ended FAILED)."""
        t = time.perf_counter()
        with self.faults.guard("decode", [r.id for r in batch]) as g:
            toks, oks = self.runner.decode(batch)
            self.streams.sync()
        dt = time.perf_counter() - t
        m.decode += dt
        m.decode_steps += 1
        m.decode_batch = max(m.decode_batch, len(batch))
        if g.fault:
            self.book.fail(batch, f"failed in decode: {g.fault.error}")
            return False
        self.scheduler.costs.update(len(batch), dt)
        self.book.accept(batch, toks, oks)
        return True

    def _decode(self, m: FrameMetrics, t0: float, plan: FramePlan) -> None:
        left = None
        if self.cfg.frame_deadline_s > 0:
            left = self.cfg.frame_deadline_s - (time.perf_counter() - t0)
        self.scheduler.plan_decode(plan, left)
        with self.streams.decode():
            for _ in range(plan.decode_steps):
                self.book.cancel(self._drain_cancels())
                batch = self.scheduler.decode_batch()
                if not batch or not self._decode_once(batch, m):
                    break

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
                raise WarmupError(f"warm-up frame ({cams} camera(s), blank images) produced no action chunk: "
                                  f"{r.error or 'no chunk'}")
        self.runner.warm_decode_buckets()
        self.streams.sync()
        self.runner.seal()
        self.cancel_all()  # the warm-up's periodic requests: ended, then forgotten with their counts
        self.handover.clear()  # and its chunks, latencies (compile time) and counts
        self.book.forget()
        self.frame_id = 0
        self.warmup_s = time.perf_counter() - t0
        self.ready = True
        return self.warmup_s

    def diagnostics(self) -> dict[str, object]:
        """Readiness and compilation state for ``/diagnostics``: ``ready``, ``warmup_s``,
        ``compile`` mode, the stages running compiled, and per compiled stage its graphs
        (``graphs_<stage>``), its recompiles after warm-up (``recompiles_<stage>``, when any) and
        any eager fallback with its reason (``fallback_<stage>``)."""
        return {"ready": self.ready, "warmup_s": round(self.warmup_s, 3), "compile": self.cfg.compile,
                "attention": "flex" if self.runner.flex else "gather", **self.runner.compile_state(),
                **self.handover.diagnostics()}

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

    def close(self) -> list:
        """Cancel every request and release all blocks; returns the ended results."""
        return self.cancel_all()

    def cancel_all(self, reason: str = "cancelled") -> list:
        """Cancel every request (not yet drained, queued, running) with ``reason``; returns the ended results."""
        with self._lock:
            new, self._new = self._new, []
        self.book.begin_frame()
        self.book.enqueue(new)
        self.book.cancel({r.id for r in list(self.scheduler.queue) + self.scheduler.running}, reason)
        self.scheduler.drop_terminal()
        return self.book.end_frame()[1]


__all__ = ["Engine", "WarmupError"]
