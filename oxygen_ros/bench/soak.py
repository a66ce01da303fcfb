"""``chaos_soak``: thousands of pi05-tiny frames under random load and injected faults, checked.

Two runs of the same seeded workload in one process — a fault-free reference and the chaos run —
on the same weights. The workload (drawn up front, so both runs get the same one): random
language asks (Poisson arrivals, random budgets, greedy or seeded sampling, stop ids), a periodic
task, random cancels (and a cancel arriving while a request runs its last step), EOS from the
random weights, over-long asks and over-long instructions, all on a pool sized to run near
exhaustion. The chaos run also gets, every few hundred frames, an exception in a random stage
(vision, prefill, denoise, decode forward, sampling, detokenising; some as out-of-memory errors)
and, in between, NaN logits in one row of a decode batch — injected by wrapping the real stage
functions (:mod:`.injection`).

Checked: the pool invariant and the request accounting after every frame (``Engine.
check_invariants``: submitted = finished + rejected + expired + failed + cancelled + in flight, and
every in-flight request is somewhere the engine will still process it); no block in use whenever
nothing is in flight, and none after the drain at the end; every request submitted ended exactly
once (``lost`` counts those that did not); every request untouched by a fault and admitted on the
same frame as in the reference ends with the reference's status and exactly its tokens; process
RSS at frame 1,000 vs the end (flat after warm-up).

The chaos run uses ``--schedule`` (``serial`` or ``concurrent``: the action loop and the batcher
thread); the reference is always the serial schedule, so the comparison also checks that the two
schedules give the same tokens.

    chaos_soak                          # 10,000 frames (the figures in docs/benchmark.md)
    chaos_soak --schedule concurrent    # the same with the two-loop schedule
    chaos_soak --frames 2000            # the CI version (a slow test)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

from ..core.config import EngineConfig, TaskConfig
from ..core.engine.requests import RequestStatus
from ..core.types import Observation

# torch and the engine are imported where they run, after the arguments are parsed:
# `chaos_soak --help` and a mistyped flag answer at once instead of after torch's ~7 s import
if TYPE_CHECKING:
    from ..core.engine.engine import Engine
    from ..core.engine.requests import FrameResult
    from ..core.policy import Pi05Policy

TASKS = (
    TaskConfig("conversation", "Q: {text} A: ", max_new_tokens=16),
    TaskConfig("memory", "Memory: ", max_new_tokens=6, every_n_frames=50),
)
RSS_FRAME = 1000


def soak_config(schedule: str = "serial") -> EngineConfig:
    """Engine of the soak: k = 2, a 40-block pool (room for ~5 requests in flight beside the action
    path while ~6 arrive per lifetime: near exhaustion), bounded queue, no wall-clock expiry (both
    runs must admit alike)."""
    return EngineConfig(
        tasks=TASKS,
        tokens_per_frame=2,
        kv_blocks=40,
        max_running_requests=8,
        max_queued_requests=8,
        max_queue_wait_s=0.0,
        max_overtakes=4,
        schedule=schedule,
    )


#: One language request: (text, max_new_tokens, temperature, seed or None, stop token ids).
Ask = tuple[str, int, float, int | None, tuple[int, ...]]


@dataclass
class FramePlan:
    """What happens at one frame: asks ``(text, max_new_tokens, temperature, seed, stop_ids)``,
    cancels (indices into all asks so far), the instruction, the injected fault (chaos run)."""

    asks: list[Ask] = field(default_factory=list)
    cancels: list[int] = field(default_factory=list)
    instruction: str = "stack the blocks"
    last_step_cancel: bool = False
    fault: str | None = None  # a stage, "<stage>:oom", or "nan" (row ``nan_row`` of the batch)
    nan_row: int = 0


def workload(frames: int, seed: int) -> list[FramePlan]:
    """The seeded per-frame plan (identical for both runs)."""
    from .injection import STAGES

    rng = np.random.default_rng(seed)
    plans, asked = [], 0
    next_fault = int(rng.integers(100, 400))
    next_nan = int(rng.integers(150, 450))
    for f in range(frames):
        p = FramePlan()
        for _ in range(int(rng.poisson(0.7))):
            kind = rng.random()
            if kind < 0.03:
                p.asks.append(("tell me " + "everything " * 300, 8, 0.0, None, ()))  # prompt never fits
            elif kind < 0.05:
                p.asks.append(("all of it", 1000, 0.0, None, ()))  # budget never fits: rejected at submission
            else:
                n = int(rng.choice([1, 2, 4, 8, 12, 16]))
                temp, s = (0.0, None) if rng.random() < 0.5 else (1.0, int(rng.integers(1 << 30)))
                stop = tuple(int(x) for x in rng.integers(3, 512, 8)) if rng.random() < 0.2 else ()
                p.asks.append((f"what is at step {f}?", n, temp, s, stop))
            asked += 1
        if asked and rng.random() < 0.06:
            p.cancels.append(int(rng.integers(asked)))
        p.last_step_cancel = rng.random() < 0.05
        if rng.random() < 0.002:
            p.instruction = "move " * 200  # over-long instruction: the observation is dropped
        if f == next_fault:
            stage = str(rng.choice(STAGES))
            p.fault = stage + (":oom" if rng.random() < 0.25 else "")
            next_fault += int(rng.integers(100, 400))
        elif f == next_nan:
            p.fault, p.nan_row = "nan", int(rng.integers(8))
            next_nan += int(rng.integers(150, 450))
        plans.append(p)
    return plans


def observations(seed: int, n: int = 8) -> list[dict[str, np.ndarray | None]]:
    """A few camera images the frames cycle through (one or two cameras)."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for i in range(n):
        imgs: dict[str, np.ndarray | None] = {"base_0_rgb": rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)}
        if i % 2:
            imgs["left_wrist_0_rgb"] = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
        out.append(imgs)
    return out


@dataclass
class RunReport:
    """Outcome of one run."""

    frames: int = 0
    results: dict[int, tuple[int, int, tuple[int, ...]]] = field(
        default_factory=dict
    )  # id -> (status, frame_id, tokens)
    touched: set[int] = field(default_factory=set)
    injected: Counter[str] = field(default_factory=Counter)
    faults: dict[str, int] = field(default_factory=dict)
    invariant_checks: int = 0
    idle_leaks: int = 0
    leaked_blocks: int = -1
    dropped_frames: int = 0
    peak_blocks: int = 0
    frames_with_queue: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    submitted: int = 0
    ended_twice: int = 0
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    rss_mib: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0


def _cancel_last_step(eng: Engine, rep: RunReport) -> None:
    """Cancel, from "another thread", a running request whose current step emits its last token.

    The serial schedule applies it before that token (the request ends cancelled); the concurrent
    one at the next grant (its ``frame`` policy keeps frames deterministic), after the token (it
    ends finished): there the request is left out of the comparison (``touched``)."""
    for r in eng.scheduler.running:
        if r.status == RequestStatus.RUNNING and r.remaining == 1:
            eng.cancel(r.id)
            if eng.schedule == "concurrent":
                rep.touched.add(r.id)
            return


def run(
    policy: Pi05Policy, plans: list[FramePlan], seed: int, chaos: bool, progress: bool = False, schedule: str = "serial"
) -> RunReport:
    """One run of ``plans`` (faults only when ``chaos``) on the ``schedule``'s engine. In the
    concurrent schedule the per-frame check pauses the batcher after its grant, so a fault armed
    for a frame fires in that frame's language work (as in the serial schedule)."""
    import torch

    from ..core.loops.schedules import make_engine
    from .injection import FaultInjector

    eng = make_engine(policy, soak_config(schedule))
    rep, images, proc = RunReport(), observations(seed), psutil.Process()
    rng = np.random.default_rng(seed + 2)
    asked: list[int] = []
    t0 = time.perf_counter()
    with FaultInjector(eng) as inj:
        for f, p in enumerate(plans):
            eng.submit_observation(
                Observation(
                    images=images[f % len(images)],
                    state=rng.uniform(-1, 1, 14).astype(np.float32),
                    instruction=p.instruction,
                    stamp=f * 0.02,
                )
            )
            asked += [
                eng.submit_request("conversation", t, n, temperature=tp, seed=s, stop_ids=st)
                for t, n, tp, s, st in p.asks
            ]
            for i in p.cancels:
                eng.cancel(asked[i])
            if p.last_step_cancel:
                inj.on_next_call("decode", lambda: _cancel_last_step(eng, rep))
            if chaos and p.fault == "nan":
                inj.arm_nan_row(p.nan_row)
            elif chaos and p.fault:
                stage, _, oom = p.fault.partition(":")
                inj.arm(
                    stage,
                    torch.OutOfMemoryError(f"CUDA out of memory (injected in {stage})")
                    if oom
                    else RuntimeError(f"injected fault in {stage}"),
                )
            r = eng.step()
            _record(eng, r, rep)
            inj.disarm()  # a fault whose stage did not run this frame is not carried over
            if f + 1 == RSS_FRAME or f + 1 == len(plans):
                gc.collect()
                rep.rss_mib[f + 1] = proc.memory_info().rss / 2**20
            if progress and (f + 1) % 1000 == 0:
                print(
                    f"  {'chaos' if chaos else 'reference'} frame {f + 1}: {time.perf_counter() - t0:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
        rep.injected = Counter(k for k, _ in inj.fired)
    while eng.in_flight or getattr(eng, "busy", False):  # drain: nothing new, every request ends
        eng.submit_observation(Observation(images=images[0], state=np.zeros(14, np.float32), instruction="x"))
        _record(eng, eng.step(), rep)
    _record(eng, eng.flush(), rep, frame=False)  # the concurrent schedule's last grants
    rep.frames, rep.seconds = len(plans), time.perf_counter() - t0
    rep.leaked_blocks = eng.pool.blocks.num_in_use
    rep.faults = dict(eng.faults.counts)
    rep.counts = eng.request_counts()
    rep.submitted = sum(row["submitted"] for row in rep.counts.values())
    eng.close()
    return rep


def _record(eng: Engine, r: FrameResult, rep: RunReport, frame: bool = True) -> None:
    eng.check_invariants()
    rep.invariant_checks += 1
    if not eng.in_flight and not getattr(eng, "busy", False) and eng.pool.blocks.num_in_use:
        rep.idle_leaks += 1
    rep.dropped_frames += int(frame and r.action is None)  # flush() is no frame
    rep.peak_blocks = max(rep.peak_blocks, r.metrics.blocks_in_use)
    rep.frames_with_queue += int(eng.queued > 0)
    for fl in r.faults:
        rep.touched.update(fl.request_ids)
    for e in r.ended:
        if e.status == RequestStatus.FAILED and e.reason == "non-finite token distribution":
            rep.touched.add(e.id)
        rep.ended_twice += int(e.id in rep.results)
        rep.results[e.id] = (int(e.status), e.frame_id, tuple(e.token_ids))
        rep.statuses[e.status.name.lower()] += 1


def compare(ref: RunReport, chaos: RunReport) -> dict[str, int]:
    """Untouched requests admitted on the same frame in both runs must end alike, token for token."""
    out: Counter[str] = Counter()
    for rid, (status, frame, toks) in chaos.results.items():
        if rid in chaos.touched:
            out["touched"] += 1
            continue
        rs, rf, rt = ref.results[rid]
        if frame != rf:
            out["rescheduled"] += 1
        elif (status, toks) == (rs, rt):
            out["identical"] += 1
        else:
            out["mismatched"] += 1
    return dict(out)


def soak(
    frames: int = 10_000, seed: int = 0, threads: int = 1, progress: bool = False, schedule: str = "serial"
) -> dict[str, Any]:
    """Both runs and the checks; returns the report (see module doc). ``threads``: torch intra-op
    threads (1: pi05-tiny's ops are far too small to split, and a shared 2-core machine thrashes);
    ``schedule``: the chaos run's schedule (the reference is serial)."""
    import torch

    from ..core.policy import Pi05Policy

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cpu", seed=seed)
    plans = workload(frames, seed)
    ref = run(policy, plans, seed, chaos=False, progress=progress)
    chaos = run(policy, plans, seed, chaos=True, progress=progress, schedule=schedule)
    cmp = compare(ref, chaos)
    rss = chaos.rss_mib
    lost = chaos.submitted - len(chaos.results)
    report: dict[str, Any] = {
        "frames": frames,
        "seed": seed,
        "schedule": schedule,
        "requests": len(chaos.results),
        "requests_submitted": chaos.submitted,
        "requests_lost": lost,
        "requests_ended_twice": chaos.ended_twice,
        "request_counts": chaos.counts,
        "faults_injected": dict(sorted(chaos.injected.items())),
        "faults_contained": chaos.faults,
        "invariant_checks": chaos.invariant_checks,
        "idle_frames_with_blocks_in_use": chaos.idle_leaks,
        "leaked_blocks": chaos.leaked_blocks,
        "reference_leaked_blocks": ref.leaked_blocks,
        "frames_without_chunk": chaos.dropped_frames,
        "pool_blocks": soak_config().kv_blocks,
        "peak_blocks_in_use_after_frame": chaos.peak_blocks,
        "frames_with_queued_requests": chaos.frames_with_queue,
        "statuses": dict(chaos.statuses),
        "comparison": cmp,
        "rss_mib_at_1000": round(rss.get(RSS_FRAME, float("nan")), 1),
        "rss_mib_at_end": round(rss[frames], 1),
        "seconds": {"reference": round(ref.seconds, 1), "chaos": round(chaos.seconds, 1)},
    }
    report["ok"] = bool(
        chaos.leaked_blocks == 0
        and ref.leaked_blocks == 0
        and chaos.idle_leaks == 0
        and lost == 0
        and chaos.ended_twice == 0
        and ref.submitted == len(ref.results)
        and not cmp.get("mismatched")
        and (frames < RSS_FRAME + 500 or report["rss_mib_at_end"] - report["rss_mib_at_1000"] < 32)
    )
    return report


def main(argv: list[str] | None = None) -> int:
    """Console entry point: prints the JSON report; exit status 1 if a check failed."""
    ap = argparse.ArgumentParser(prog="chaos_soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument(
        "--schedule",
        choices=("serial", "concurrent"),
        default="serial",
        help="schedule of the chaos run (the fault-free reference is serial)",
    )
    ap.add_argument("--json", help="also write the report to this file")
    a = ap.parse_args(argv)
    report = soak(a.frames, a.seed, a.threads, progress=True, schedule=a.schedule)
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as fh:
            fh.write(text + "\n")
        print(f"chaos_soak: wrote {a.json}", file=sys.stderr)  # stdout is the JSON alone
    return 0 if report["ok"] else 1


__all__ = ["soak", "workload", "run", "compare", "soak_config", "main", "FramePlan", "RunReport"]


if __name__ == "__main__":
    sys.exit(main())
