"""Every accepted request is answered (issue 19): per-task request accounting, checked after every
frame in both schedules — ``submitted = finished + rejected + expired + failed + cancelled + in
flight`` and every in-flight request sits somewhere the engine will still process it.

- forced interleavings: an ask submitted from inside the action loop and the batcher thread at
  fixed points of a frame (hooks wrapping the real functions), each answered;
- randomised interleavings with recorded seeds: many short runs of the concurrent engine with asks
  from another thread at random points, frames without an observation, asks right after start,
  cancels — the accounting after every frame, every request ended exactly once;
- request ids stay unique when the ROS thread and the batcher thread create requests at once.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch

from oxygen_ros.core.config import EngineConfig, TaskConfig
from oxygen_ros.core.engine.requests import OUTCOMES, RequestStatus
from oxygen_ros.core.loops.schedules import make_engine
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.types import Observation

TASKS = (
    TaskConfig("conversation", "Q: {text} A: ", max_new_tokens=6),
    TaskConfig("memory", "Memory: ", max_new_tokens=3, every_n_frames=4),
)
SEEDS = list(range(12))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def policy():
    return Pi05Policy.from_pretrained("pi05-tiny", device="cpu")


def obs(i: int) -> Observation:
    rng = np.random.default_rng(i)
    return Observation(
        images={"base_0_rgb": rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)},
        state=rng.uniform(-1, 1, 14).astype(np.float32),
        instruction="stack",
        stamp=float(i),
    )


def engine(policy, schedule: str, **kw):
    cfg = EngineConfig(tasks=TASKS, schedule=schedule, tokens_per_frame=2, **kw)
    eng = make_engine(policy, cfg)
    eng.warmup()
    return eng


class Ledger:
    """Every ended result of a run, by request id (an id ending twice is an error)."""

    def __init__(self) -> None:
        self.ended: dict[int, object] = {}

    def add(self, result) -> None:
        for e in result.ended:
            assert e.id not in self.ended, f"request {e.id} ended twice"
            self.ended[e.id] = e


def drain(eng, ledger: Ledger, frames: int = 400) -> None:
    """Language-only frames (and observations) until nothing is in flight; invariants each frame."""
    for i in range(frames):
        if eng.in_flight == 0 and not getattr(eng, "busy", False):
            break
        eng.submit_observation(obs(10_000 + i))
        ledger.add(eng.step())
        eng.check_invariants()
    ledger.add(eng.flush())
    assert eng.in_flight == 0


def check_counts(eng, ledger: Ledger, submitted: dict[str, int]) -> None:
    counts = eng.request_counts()
    for task, n in submitted.items():
        row = counts[task]
        assert row["submitted"] == n, (task, row)
        assert row["in_flight"] == 0 and sum(row[o] for o in OUTCOMES) == n, (task, row)
        got = Counter(e.outcome for e in ledger.ended.values() if e.task == task)
        assert got == Counter({o: row[o] for o in OUTCOMES if row[o]}), (task, got, row)


# ------------------------------------------------------------------ forced interleavings
def _wrap(obj, name: str, before=None, after=None) -> None:
    real = getattr(obj, name)

    def hooked(*a, **k):
        if before is not None:
            before()
        out = real(*a, **k)
        if after is not None:
            after()
        return out

    setattr(obj, name, hooked)


POINTS = ["before_drain", "after_drain", "grant_start", "grant_end", "batcher_decode", "on_action"]


@pytest.mark.parametrize("point", POINTS)
def test_an_ask_at_any_point_of_a_concurrent_frame_is_answered(policy, point):
    """An ask submitted at a fixed point of the action loop or the batcher thread (the hook runs
    in that thread, exactly where a ROS callback could interleave) is decoded and ends; the
    accounting holds after every frame."""
    eng = engine(policy, "concurrent")
    asked: list[int] = []
    fired = threading.Event()

    def ask() -> None:
        if not fired.is_set():
            fired.set()
            asked.append(eng.submit_request("conversation", f"at {point}"))

    if point == "before_drain":
        _wrap(eng, "_drain", before=ask)
    elif point == "after_drain":
        _wrap(eng, "_drain", after=ask)
    elif point == "grant_start":
        _wrap(eng.language, "run", before=ask)
    elif point == "grant_end":
        _wrap(eng.language, "run", after=ask)
    elif point == "batcher_decode":
        _wrap(eng.runner, "decode", before=ask)
    ledger = Ledger()
    eng.submit_request("memory")  # something for the batcher to decode from the first frame
    for f in range(6):
        if f != 2:  # frame 2 has no observation: a language-only frame
            eng.submit_observation(obs(f))
        ledger.add(eng.step(on_action=(lambda chunk: ask()) if point == "on_action" else None))
        eng.check_invariants()
    drain(eng, ledger)
    assert fired.is_set() and len(asked) == 1
    assert ledger.ended[asked[0]].status == RequestStatus.FINISHED, ledger.ended[asked[0]]
    assert ledger.ended[asked[0]].token_ids
    check_counts(eng, ledger, {"conversation": 1})
    eng.close()


@pytest.mark.parametrize("schedule", ["serial", "concurrent"])
def test_an_ask_with_no_observation_ever_ends_with_the_reason(policy, schedule):
    """No camera: the ask cannot start (no prefix). It waits in the queue, counted in flight, and
    ends as expired after ``max_queue_wait_s`` — never silently kept."""
    eng = engine(policy, schedule, max_queue_wait_s=0.2)
    ledger = Ledger()
    rid = eng.submit_request("conversation", "anyone there?")
    assert eng.in_flight == 1 and eng.request_counts()["conversation"]["in_flight"] == 1
    end = time.monotonic() + 30
    while rid not in ledger.ended and time.monotonic() < end:
        ledger.add(eng.step())  # language-only frames
        eng.check_invariants()
        time.sleep(0.01)
    ledger.add(eng.flush())
    assert ledger.ended[rid].outcome == "expired", ledger.ended.get(rid)
    check_counts(eng, ledger, {"conversation": 1})
    eng.close()


# ------------------------------------------------------------------ randomised interleavings
def _random_run(policy, seed: int, schedule: str) -> None:
    rng = random.Random(seed)
    eng = engine(policy, schedule, max_queued_requests=4, kv_blocks=60 if rng.random() < 0.5 else 0)
    ledger, asked = Ledger(), []
    lock = threading.Lock()
    stop = threading.Event()

    def asker() -> None:  # a ROS callback thread: asks and cancels at random instants
        r = random.Random(seed * 7919)
        while not stop.is_set() and len(asked) < 12:
            time.sleep(r.choice([0.0, 0.0, 0.001, 0.005, 0.02]))
            with lock:
                asked.append(eng.submit_request("conversation", "q", r.randint(1, 6)))
            if r.random() < 0.2:
                eng.cancel(r.choice(asked))

    if rng.random() < 0.5:  # right after start: before the first step
        asked.append(eng.submit_request("conversation", "first"))
    t = threading.Thread(target=asker)
    t.start()
    try:
        for f in range(rng.randint(8, 20)):
            if rng.random() < 0.75:
                eng.submit_observation(obs(f))
            ledger.add(eng.step())
            eng.check_invariants()
    finally:
        stop.set()
        t.join()
    drain(eng, ledger)
    lost = [i for i in asked if i not in ledger.ended]
    assert not lost, f"seed {seed} ({schedule}): requests {lost} never ended"
    n_memory = sum(1 for e in ledger.ended.values() if e.task == "memory")
    check_counts(eng, ledger, {"conversation": len(asked), "memory": n_memory})
    eng.close()


@pytest.mark.parametrize("seed", SEEDS)
def test_random_interleavings_lose_no_request_concurrent(policy, seed):
    _random_run(policy, seed, "concurrent")


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_random_interleavings_lose_no_request_serial(policy, seed):
    _random_run(policy, seed, "serial")


# ------------------------------------------------------------------ ids
def test_request_ids_stay_unique_when_two_threads_create_requests(policy):
    """The ROS thread (asks) and the batcher thread (periodic tasks) both create requests: each
    gets its own id (ids are how deltas, results and utterances are matched)."""
    eng = engine(policy, "serial")
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        ids: list[list[int]] = [[], []]

        def make(k: int) -> None:
            for _ in range(3000):
                ids[k].append(eng.book.new_request(eng.cfg, "memory", "", None, None, None, None, ()).id)

        threads = [threading.Thread(target=make, args=(k,)) for k in (0, 1)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(before)
    every = ids[0] + ids[1]
    assert len(set(every)) == len(every) == 6000
    assert eng.request_counts()["memory"]["submitted"] == 6000 == eng.in_flight
