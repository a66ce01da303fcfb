"""Language request lifecycle: creation, prompts, attachment to a prefix, token acceptance,
finishing, cancellation and rejection — with the per-frame deltas and ended lists.

Every terminal transition releases all of the request's KV references in the same frame, and is
counted in :attr:`RequestBook.counts` (``submitted = finished + rejected + expired + failed +
cancelled + in flight``, checked by :meth:`RequestBook.check_accounting`).

Threads: :meth:`RequestBook.new_request` runs on any thread (ROS callbacks submit asks while the
batcher thread creates periodic requests), so ids, the live set and the counts are taken under one
lock; every other method runs in the thread that runs the language half of the frames
(:class:`~.language.LanguageStage`). The live settings come with each call as the frame's
:class:`~oxygen_ros.core.config.EngineConfig`; the queue and the running list belong to the
:class:`~.scheduler.Scheduler`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

from ..cache.block_pool import BlockTable
from ..detokenize import IncrementalDetokenizer
from ..model.sampling import SamplingParams
from ..prompt import format_template
from ..types import TextDelta
from .frame import FramePrefix, RequestState
from .requests import OUTCOMES, LanguageRequest, Prompt, RequestCounts, RequestResult, RequestStatus, outcome_of

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..cache.kv_pool import KVPool
    from ..config import EngineConfig
    from ..policy import Pi05Policy
    from .faults import FaultLog
    from .scheduler import Scheduler
    from .streams import DeviceStreams


class RequestBook:
    """Owns request state transitions for one engine (the parts it needs, passed in explicitly).

    Args:
        scheduler: owner of the queue and the running list.
        policy: tokenizer, prompt builder and EOS id.
        pool / streams: the KV pool (ended requests release their blocks) and the device lanes.
        faults: the fault log of the thread that runs the language half (contained prompt,
            detokenize and non-finite faults are counted there).
    """

    def __init__(
        self, scheduler: Scheduler, policy: Pi05Policy, pool: KVPool, streams: DeviceStreams, faults: FaultLog
    ) -> None:
        self.scheduler = scheduler
        self.policy = policy
        self.pool = pool
        self.streams = streams
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # ids, _live and counts: new_request runs on any thread
        self._live: dict[int, LanguageRequest] = {}
        self.counts = RequestCounts()
        self._deltas: list[TextDelta] = []
        self._ended: list[RequestResult] = []
        self.tokens_this_frame = 0
        self.rejected_total = 0
        self.failed_total = 0
        self.faults = faults

    # ------------------------------------------------------------------ creation
    def prompt_of(self, cfg: EngineConfig, task: str, text: str, instruction: str | None) -> Prompt | None:
        """The prompt of a new request of ``task`` — its template filled with ``text`` and
        ``instruction``, tokenized (an ``own_prefix`` task's prompt goes into its own prefix) — built
        in the caller's thread (a ROS callback for an ask). A ``text`` longer than
        ``cfg.max_request_chars`` is never formatted or tokenized: ``reject`` names the cap. With
        ``instruction`` None the prompt is left to admission (``None`` returned), where the
        admitting frame's instruction fills it (:meth:`prepare_prompts`). A template or prompt error
        gives ``reject``; a tokenizer exception ``fail`` (logged with its traceback). Thread-safe.

        Raises:
            KeyError: unknown task.
        """
        t = cfg.task(task)
        if not isinstance(text, str):
            return None  # new_request refuses it
        if len(text) > cfg.max_request_chars:  # checked before any formatting or tokenization
            return Prompt(
                reject=f"the ask has {len(text)} characters; at most {cfg.max_request_chars} are "
                "accepted (engine.max_request_chars)"
            )
        if instruction is None:
            return None
        try:
            filled = format_template(t.template, text=text, instruction=instruction)
            if t.own_prefix:  # π0.5 subtask style: prompt inside its own prefix
                return Prompt(filled, [], self.policy.prompt.tokenize_prefix_prompt(filled))
            return Prompt(filled, self.policy.prompt.tokenize_continuation(filled) if filled else [])
        except (KeyError, ValueError) as e:
            return Prompt(reject=f"bad prompt: {e}")
        except Exception as e:  # a tokenizer bug: this request fails, nothing else
            log.exception("tokenizing the prompt of a %s request failed", task)
            return Prompt(fail=f"failed in prompt: {type(e).__name__}: {e}")

    def new_request(
        self,
        cfg: EngineConfig,
        task: str,
        text: str,
        max_new_tokens: int | None,
        temperature: float | None,
        top_k: int | None,
        seed: int | None,
        stop_ids: tuple[int, ...],
        prompt: Prompt | None = None,
    ) -> LanguageRequest:
        """Validate arguments and build a QUEUED request with its ``prompt`` (:meth:`prompt_of`;
        ``None``: built at admission); one whose prompt could not be built comes back REJECTED or
        FAILED with the reason, so it still ends with a notice.

        Raises:
            KeyError: unknown task; ValueError: a bad argument.
        """
        t = cfg.task(task)
        n = t.max_new_tokens if max_new_tokens is None else max_new_tokens
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"max_new_tokens={n!r} must be an int >= 1")
        params = SamplingParams(
            t.temperature if temperature is None else temperature, t.top_k if top_k is None else top_k, seed
        ).validate()
        if params.top_k > cfg.max_top_k:
            raise ValueError(f"top_k={params.top_k} exceeds engine.max_top_k={cfg.max_top_k}")
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        stop = tuple(int(s) for s in stop_ids)
        with self._lock:  # one id per request, whatever thread asks (ids are how outputs are matched)
            rid = next(self._ids)
            r = LanguageRequest(
                id=rid,
                task=task,
                text=text,
                max_new_tokens=n,
                temperature=params.temperature,
                top_k=params.top_k,
                seed=seed,
                stop_ids=stop,
                t_submit=time.perf_counter(),
                sample_key=params.key(),
            )
            self._live[rid] = r
            self.counts.submitted(task)
        if prompt is not None:
            r.prompt, r.prompt_ids, r.prefix_ids, r.prompt_ready = (
                prompt.text,
                list(prompt.ids),
                list(prompt.prefix_ids),
                True,
            )
        if prompt is not None and (prompt.reject or prompt.fail):
            r.status = RequestStatus.FAILED if prompt.fail else RequestStatus.REJECTED
            r.reason = prompt.fail or prompt.reject
        return r

    def is_live(self, rid: int) -> bool:
        """Whether ``rid`` exists and has not ended."""
        with self._lock:
            return rid in self._live

    @property
    def num_live(self) -> int:
        """Requests accepted and not yet ended."""
        with self._lock:
            return len(self._live)

    def enqueue(self, cfg: EngineConfig, reqs: list[LanguageRequest]) -> None:
        """Queue new requests; one rejected (or failed) at submission ends now, a full queue rejects too."""
        for r in reqs:
            if r.status == RequestStatus.FAILED:  # its prompt could not be built (a tokenizer fault)
                self.faults.count("prompt")
                self.failed_total += 1
                self._end(r, RequestStatus.FAILED, r.reason)
                continue
            reason = r.reason if r.status == RequestStatus.REJECTED else self.scheduler.enqueue(cfg, r)
            if reason is not None:
                self._end(r, RequestStatus.REJECTED, reason)

    def periodic(self, cfg: EngineConfig, frame_id: int, instruction: str) -> None:
        """Submit the periodic tasks (``every_n_frames``) due at ``frame_id``, their prompts filled
        with the frame's ``instruction``."""
        for t in cfg.tasks:
            if t.every_n_frames and frame_id % t.every_n_frames == 0:
                prompt = self.prompt_of(cfg, t.name, "", instruction)
                self.enqueue(cfg, [self.new_request(cfg, t.name, "", None, None, None, None, (), prompt)])

    def prepare_prompts(self, cfg: EngineConfig, instruction: str) -> None:
        """Build the prompts left to admission (requests submitted without an instruction) with
        the admitting frame's ``instruction``; one that cannot be built ends now with the reason."""
        for r in [r for r in self.scheduler.queue if not r.prompt_ready]:
            prompt = self.prompt_of(cfg, r.task, r.text, instruction)
            assert prompt is not None  # an instruction is given and a queued request's text is a str
            r.prompt, r.prompt_ids, r.prefix_ids, r.prompt_ready = (
                prompt.text,
                list(prompt.ids),
                list(prompt.prefix_ids),
                True,
            )
            if prompt.reject:
                self.scheduler.remove([r])
                self._end(r, RequestStatus.REJECTED, prompt.reject)
            elif prompt.fail:
                self.faults.count("prompt")
                self.fail([r], prompt.fail)

    def expire(self, cfg: EngineConfig) -> None:
        """End queued requests older than ``max_queue_wait_s`` (rejected, reason "expired ...")."""
        self.rejected(self.scheduler.expire(cfg, time.perf_counter()))

    def rejected(self, reqs: list[LanguageRequest]) -> None:
        """Record requests the scheduler rejected (status and reason already set)."""
        for r in reqs:
            self._end(r, RequestStatus.REJECTED, r.reason)

    def attach(self, r: LanguageRequest, prefix: FramePrefix, shared: bool) -> None:
        """Start ``r`` on ``prefix``: take a reference (shared) or own it (private copy), reserve
        its own blocks for prompt + ``max_new_tokens``."""
        pool = self.pool.blocks
        if shared:
            pool.incref(prefix.blocks)
        table = BlockTable(pool)
        table.reserve(len(r.prompt_ids) + r.max_new_tokens)
        r.state = RequestState(prefix, table, IncrementalDetokenizer(self.policy.tokenizer))
        r.frame_id = prefix.frame_id
        r.status = RequestStatus.RUNNING

    # ------------------------------------------------------------------ tokens
    def accept(self, reqs: list[LanguageRequest], toks: list[int], oks: list[bool]) -> None:
        """Apply one sampled token per request: emit a delta, or finish on EOS/stop/length, or fail
        on a non-finite distribution. An exception while detokenising one request fails that
        request only (counted as a ``detokenize`` fault)."""
        now = time.perf_counter()
        for r, t, ok in zip(reqs, toks, oks):
            if r.status != RequestStatus.RUNNING:
                continue
            if not ok:
                self.faults.count("non_finite_logits")
                self.fail([r], "non-finite token distribution")
                continue
            try:
                self._accept_one(r, t, now)
            except Exception as e:
                self.fail([r], f"failed in detokenize: {self.faults.record('detokenize', e, (r.id,)).error}")

    def _accept_one(self, r: LanguageRequest, t: int, now: float) -> None:
        eos = self.policy.eos_id
        if r.t_first_token is None:
            r.t_first_token = now
        if t == eos or t in r.stop_ids:
            self._finish(r, "eos" if t == eos else "stop")
            return
        piece = r.running_state.detok.push(t)
        r.output_ids.append(t)
        self.tokens_this_frame += 1
        if piece:
            r.output_text += piece
            self._deltas.append(TextDelta(r.id, r.task, piece, r.frame_id))
        if len(r.output_ids) >= r.max_new_tokens:
            self._finish(r, "length")
        else:
            r.pending = t

    def fail(self, reqs: list[LanguageRequest], reason: str) -> None:
        """End the live ones of ``reqs`` as FAILED with ``reason`` (blocks released now)."""
        for r in reqs:
            if not r.status.terminal:
                self.scheduler.remove([r])
                self.failed_total += 1
                self._end(r, RequestStatus.FAILED, reason)

    def _finish(self, r: LanguageRequest, reason: str) -> None:
        rest = r.running_state.detok.flush()
        r.output_text += rest
        self._deltas.append(TextDelta(r.id, r.task, rest, r.frame_id, finished=True))
        self._end(r, RequestStatus.FINISHED, reason)

    def cancel(self, ids: set[int], reason: str = "cancelled") -> None:
        """Cancel queued or running requests by id (no further deltas); ``reason`` goes on their result."""
        if not ids:
            return
        sched = self.scheduler
        queued = [r for r in sched.queue if r.id in ids]
        sched.remove(queued)
        for r in queued:
            self._end(r, RequestStatus.CANCELLED, reason)
        for r in sched.running:
            if r.id in ids and r.status == RequestStatus.RUNNING:
                self._end(r, RequestStatus.CANCELLED, reason)

    def _end(self, r: LanguageRequest, status: RequestStatus, reason: str) -> None:
        r.status = status
        r.reason = reason
        r.t_done = time.perf_counter()
        r.pending = -1
        if status == RequestStatus.REJECTED:
            self.rejected_total += 1
        st, r.state = r.state, None
        if st is not None:
            fence = self.streams.fence()
            st.table.release(fence)
            self.pool.blocks.free(st.prefix.blocks, fence)
        with self._lock:
            if self._live.pop(r.id, None) is not None:  # counted once, however it ended
                self.counts.ended(r.task, outcome_of(status, reason))
        self._ended.append(RequestResult.of(r))

    def check_invariants(self) -> None:
        """Raise ``AssertionError``/``BlockPoolError`` unless the pool is consistent: free + in-use
        = total, and every reference is held by a running request (none leaked by frames)."""
        blocks = self.pool.blocks
        blocks.check()
        expected = [0] * blocks.num_blocks
        for r in self.scheduler.running:
            if not r.status.terminal:
                for b in r.running_state.block_row():
                    expected[b] += 1
        actual = [blocks.refcount(b) for b in range(blocks.num_blocks)]
        assert expected == actual, "KV block references do not match the running requests"

    def check_accounting(self, located: list[LanguageRequest]) -> None:
        """Raise ``AssertionError`` unless every accepted request is accounted for: per task,
        ``submitted = finished + rejected + expired + failed + cancelled + in flight``, the in-flight
        ones are exactly the live ones, and each sits in one place the engine will still process (``located``: not
        yet drained, queued or running)."""
        with self._lock:
            live = dict(self._live)
            counts = self.counts.snapshot()
        ids = [r.id for r in located]
        dup = sorted(i for i, n in Counter(ids).items() if n > 1)
        assert not dup, f"requests {dup} are in two places at once"
        lost = sorted(set(live) - set(ids))
        assert not lost, f"requests {lost} were accepted, have not ended and are nowhere (lost)"
        stray = sorted(set(ids) - set(live))
        assert not stray, f"requests {stray} are queued or running but no longer live"
        per_task = Counter(r.task for r in live.values())
        for task, row in counts.items():
            ended = sum(row[o] for o in OUTCOMES)
            assert row["submitted"] == ended + row["in_flight"], f"{task}: {row}"
            assert row["in_flight"] == per_task.get(task, 0), (
                f"{task}: {row['in_flight']} in flight by the counts, {per_task.get(task, 0)} live"
            )
        assert set(per_task) <= set(counts), f"live requests of uncounted tasks {set(per_task) - set(counts)}"

    def forget(self) -> None:
        """Forget every count and ended result (the warm-up's own requests); call with nothing live."""
        with self._lock:
            assert not self._live, f"requests {sorted(self._live)} are still live"
            self.counts.reset()
        self.begin_frame()

    # ------------------------------------------------------------------ frames
    def begin_frame(self) -> None:
        """Reset the per-frame outputs."""
        self._deltas, self._ended, self.tokens_this_frame = [], [], 0

    def end_frame(self) -> tuple[list[TextDelta], list[RequestResult]]:
        """This frame's deltas and ended requests."""
        return self._deltas, self._ended
