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

import numpy as np

from ..cache.block_pool import BlockTable
from ..cache.kv_pool import KVPool
from ..config import ConfigError, EngineConfig
from ..policy import Pi05Policy, frame_noise
from ..processing import InvalidInputError, NonFiniteActionError
from ..types import ActionChunk, FrameMetrics, Observation
from .lifecycle import RequestBook
from .requests import FrameResult, LanguageRequest, RequestStatus
from .frame import FramePrefix
from .plan import FramePlan
from .runner import Runner
from .scheduler import Scheduler
from .streams import DeviceStreams


def pool_blocks(policy: Pi05Policy, cfg: EngineConfig) -> int:
    """Pool size in blocks from ``kv_blocks`` / ``kv_memory_mb`` / automatic sizing.

    Raises:
        ConfigError: the pool cannot hold two frame prefixes (the current one and the reserve).
    """
    mc = policy.cfg
    per_block = KVPool.bytes_per_block(mc.vlm.depth, cfg.block_size, mc.vlm.num_kv_heads, mc.vlm.head_dim,
                                       policy.model.dtype)
    prefix_blocks = -(-mc.max_prefix_len // cfg.block_size)
    if cfg.kv_blocks:
        n = cfg.kv_blocks
    elif cfg.kv_memory_mb:
        n = int(cfg.kv_memory_mb * 2**20) // per_block
    else:
        longest = max((t.max_new_tokens for t in cfg.tasks), default=32) + 64
        per_req = -(-longest // cfg.block_size) + (prefix_blocks if cfg.mode == "isolated" else 0)
        n = 2 * prefix_blocks + cfg.max_running_requests * per_req
    if n < 2 * prefix_blocks:
        raise ConfigError(f"engine.kv_blocks={n} is invalid: must be >= {2 * prefix_blocks} "
                          f"(two prefixes of {mc.max_prefix_len} tokens at block_size {cfg.block_size})")
    return n


class Engine:
    """Unified KV cache engine over one :class:`Pi05Policy`."""

    def __init__(self, policy: Pi05Policy, cfg: EngineConfig | None = None) -> None:
        self.cfg = (cfg or EngineConfig()).validate()
        self.policy = policy
        mc = policy.cfg
        self.pool = KVPool(mc.vlm.depth, pool_blocks(policy, self.cfg), self.cfg.block_size, mc.vlm.num_kv_heads,
                           mc.vlm.head_dim, policy.model.dtype, policy.model.device)
        self.streams = DeviceStreams(policy.model.device)
        self.runner = Runner(policy, self.pool, self.streams, self.cfg)
        self.scheduler = Scheduler(self.cfg, self.pool.blocks, mc.max_prefix_len)
        self.book = RequestBook(self.cfg, self.scheduler, self.policy, self.pool, self.streams)
        self.num_steps = self.cfg.num_denoise_steps or mc.num_denoise_steps
        self.frame_id = 0
        self.dropped_observations = 0
        self._lock = threading.Lock()
        self._obs: Observation | None = None
        self._new: list[LanguageRequest] = []
        self._cancels: set[int] = set()
        self.ready = False  # set by warmup(): every hot-path shape ran once (compiled if enabled)
        self.warmup_s = 0.0

    # ------------------------------------------------------------------ inputs (any thread)
    def submit_observation(self, obs: Observation) -> None:
        """Make ``obs`` the newest observation (an unprocessed older one is superseded)."""
        with self._lock:
            self._obs = obs

    def submit_request(self, task: str, text: str = "", max_new_tokens: int | None = None, *,
                       temperature: float | None = None, top_k: int | None = None, seed: int | None = None,
                       stop_ids: tuple[int, ...] = ()) -> int:
        """Queue a language request of ``task`` (template and defaults from the task config).

        Returns:
            The request id (its deltas and result carry it).

        Raises:
            KeyError: unknown task; ValueError: bad ``max_new_tokens`` / sampling parameters.
        """
        r = self.book.new_request(task, text, max_new_tokens, temperature, top_k, seed, stop_ids)
        with self._lock:
            self._new.append(r)
        return r.id

    def cancel(self, request_id: int) -> bool:
        """Ask to cancel a request; applied before its next token. False if unknown or already over."""
        with self._lock:
            if not self.book.is_live(request_id):
                return False
            self._cancels.add(request_id)
            return True

    def _drain(self) -> tuple[Observation | None, list[LanguageRequest], set[int]]:
        with self._lock:
            obs, self._obs = self._obs, None
            new, self._new = self._new, []
            cancels, self._cancels = self._cancels, set()
        return obs, new, cancels

    def _drain_cancels(self) -> set[int]:
        with self._lock:
            cancels, self._cancels = self._cancels, set()
        return cancels

    # ------------------------------------------------------------------ one frame
    def step(self, on_action: Callable[[ActionChunk], None] | None = None) -> FrameResult:
        """Run one control frame (see module doc). Never raises for bad input: a bad observation
        gives ``action=None`` with ``error`` set and is counted in ``dropped_observations``."""
        t0 = time.perf_counter()
        self.pool.blocks.reclaim(self.streams.is_done)
        obs, new, cancels = self._drain()
        self.book.begin_frame()
        self.book.enqueue(new)
        self.book.cancel(cancels)
        fid = self.frame_id
        plan = FramePlan(fid)
        m = FrameMetrics(frame_id=fid, blocks_total=self.pool.blocks.num_blocks)
        action, error, prefix, enc = None, None, None, None
        if obs is not None:
            self.frame_id += 1
            self.book.periodic(fid)
            try:
                enc = self.policy.encode_observation(obs)
            except InvalidInputError as e:
                error = f"observation dropped: {e}"
                self.dropped_observations += 1
        if enc is not None:
            with self.streams.action():
                prefix = self.runner.prefill(enc, fid, BlockTable(self.pool.blocks))
                m.vision, m.prefill = prefix.stage_times["vision"], prefix.stage_times["prefill"]
                t1 = time.perf_counter()
                try:
                    noise = frame_noise(self.cfg.seed, fid, self.policy.cfg.action_horizon, self.policy.cfg.action_dim)
                    act = self.runner.actions(prefix, noise, self.num_steps)
                    action = ActionChunk(actions=act, stamp=obs.stamp, frame_id=fid)
                except NonFiniteActionError as e:
                    error = f"action chunk dropped: {e}"
                    self.dropped_observations += 1
                self.streams.sync()
                m.denoise = time.perf_counter() - t1
            if action is not None and on_action is not None:
                on_action(action)
            self._start_requests(obs, enc, prefix, m, plan)
        self._decode(m, t0, plan)
        if prefix is not None:
            self.pool.blocks.free(prefix.blocks, self.streams.fence())
        self.scheduler.drop_terminal()
        m.frame_time = time.perf_counter() - t0
        m.bookkeeping = max(0.0, m.frame_time - m.vision - m.prefill - m.denoise - m.decode - m.extra.get("start", 0.0))
        m.blocks_in_use = self.pool.blocks.num_in_use
        m.deadline_met = self.cfg.frame_deadline_s <= 0 or m.frame_time <= self.cfg.frame_deadline_s
        deltas, ended = self.book.end_frame()
        plan.finished = [e.id for e in ended]
        m.tokens_emitted = self.book.tokens_this_frame
        return FrameResult(fid, action, deltas, ended, m, error, plan)

    def _start_requests(self, obs: Observation, enc, prefix: FramePrefix, m: FrameMetrics, plan: FramePlan) -> None:
        t = time.perf_counter()
        self.book.prepare_prompts(obs.instruction)
        admitted, rejected = self.scheduler.plan_admission(plan, prefix.length)
        self.book.rejected(rejected)
        if not admitted:
            return
        staged = m.vision + m.prefill + m.decode  # model time spent inside this call is not "start"
        with self.streams.decode():
            for r in admitted:
                if self.cfg.mode == "isolated":
                    own_prefix = self.runner.prefill(enc, prefix.frame_id, BlockTable(self.pool.blocks))
                    m.vision += own_prefix.stage_times["vision"]
                    m.prefill += own_prefix.stage_times["prefill"]
                    self.book.attach(r, own_prefix, shared=False)
                else:
                    self.book.attach(r, prefix, shared=True)
            if self.cfg.mode == "isolated":
                for r in admitted:  # openpi-style: one request at a time, to completion
                    self.book.accept([r], *self.runner.start([r]))
                    while r.status == RequestStatus.RUNNING:
                        self._decode_once([r], m)
            else:
                self.book.accept(admitted, *self.runner.start(admitted))
            self.streams.sync()
        m.extra["start"] = time.perf_counter() - t - (m.vision + m.prefill + m.decode - staged)

    def _decode_once(self, batch: list[LanguageRequest], m: FrameMetrics) -> None:
        t = time.perf_counter()
        toks, oks = self.runner.decode(batch)
        self.streams.sync()
        dt = time.perf_counter() - t
        self.scheduler.costs.update(len(batch), dt)
        m.decode += dt
        m.decode_steps += 1
        m.decode_batch = max(m.decode_batch, len(batch))
        self.book.accept(batch, toks, oks)

    def _decode(self, m: FrameMetrics, t0: float, plan: FramePlan) -> None:
        left = None
        if self.cfg.frame_deadline_s > 0:
            left = self.cfg.frame_deadline_s - (time.perf_counter() - t0)
        self.scheduler.plan_decode(plan, left)
        with self.streams.decode():
            for _ in range(plan.decode_steps):
                self.book.cancel(self._drain_cancels())
                batch = self.scheduler.decode_batch()
                if not batch:
                    break
                self._decode_once(batch, m)

    def warmup(self, frames: int = 1) -> float:
        """Run every hot-path shape once before the engine reports :attr:`ready`: one throw-away
        frame per camera count (vision / prefill / denoise buckets), one decode step per batch
        bucket (on padding rows that touch only the null block), then ``frames - 1`` more blank
        frames. With ``compile`` this is where every graph is compiled / captured.

        Leaves no trace: frame ids restart at 0 and nothing is queued or held. Call before
        submitting anything. Returns the warm-up time in seconds (also :attr:`warmup_s`, reported
        apart from steady-state frame times).
        """
        t0 = time.perf_counter()
        slots = self.policy.cfg.image_slots
        size = self.policy.cfg.vision.image_size
        state = np.zeros(self.policy.normalizer.state_dim, np.float32)
        blanks = [{s: np.zeros((size, size, 3), np.uint8) for s in slots[:n]} for n in range(1, len(slots) + 1)]
        if not self.runner.static:
            blanks = blanks[-1:]
        for images in blanks + [blanks[-1]] * max(frames - 1, 0):
            self.submit_observation(Observation(images=images, state=state, instruction="warm up"))
            self.step()
        self.runner.warm_decode_buckets()
        self.streams.sync()
        self.frame_id = 0
        self.warmup_s = time.perf_counter() - t0
        self.ready = True
        return self.warmup_s

    def diagnostics(self) -> dict[str, object]:
        """Readiness and compilation state for ``/diagnostics``: ``ready``, ``warmup_s``,
        ``compile`` mode, the stages running compiled, and any eager fallback with its reason."""
        out: dict[str, object] = {"ready": self.ready, "warmup_s": round(self.warmup_s, 3),
                                  "compile": self.cfg.compile, "attention": "flex" if self.runner.flex else "gather"}
        out["compiled_stages"] = ",".join(st.name for st in self.runner.stages if st.compiled) or "none"
        for st in self.runner.stages:
            if st.fallback_reason:
                out[f"fallback_{st.name}"] = st.fallback_reason
        return out

    # ------------------------------------------------------------------ inspection
    def check_invariants(self) -> None:
        """Raise ``AssertionError``/``BlockPoolError`` unless the pool is consistent: free + in-use
        = total, and every reference is held by a running request (none leaked by frames)."""
        self.pool.blocks.check()
        expected = [0] * self.pool.blocks.num_blocks
        for r in self.scheduler.running:
            if r.status.terminal:
                continue
            for b in r.state.blocks_held():
                expected[b] += 1
        actual = [self.pool.blocks.refcount(b) for b in range(self.pool.blocks.num_blocks)]
        assert expected == actual, "KV block references do not match the running requests"

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
        with self._lock:
            new, self._new = self._new, []
        self.book.begin_frame()
        self.book.enqueue(new)
        self.book.cancel({r.id for r in list(self.scheduler.queue) + self.scheduler.running})
        self.scheduler.drop_terminal()
        return self.book.end_frame()[1]


__all__ = ["Engine", "pool_blocks"]
