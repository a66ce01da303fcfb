"""``bench schedules``: serial vs concurrent schedule, with and without language load (issue 13).

Four engines on the same weights and observations, all in one run: {serial, concurrent} ×
{no language, the paper's language load: one request per frame, N tokens, k = 1}. They run in
rounds of ``--block`` frames each, the order rotating every round, so load drift on a shared
machine hits all alike; a concurrent engine's batcher is flushed before the next engine runs (no
background work leaks into another engine's frames). The first ``N/k + 5`` frames of every engine
are warm-up and excluded. Reported per engine: chunk interval (chunk to chunk: the action rate the
robot gets; the serial schedule's includes its decode), chunk latency (frame start → chunk),
language tok/s, batcher busy fraction, tokens per frame; and the ratios the issue targets.

    bench schedules --quick          # pi05-small, 1 thread per loop, 40 measured frames per engine
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.config import EngineConfig, TaskConfig
from .workload import observations

if TYPE_CHECKING:  # torch and the engine load after the arguments (`bench schedules --help` answers at once)
    from ..core.policy import Pi05Policy

TASK = "bench"
ENGINES = (("serial", False), ("serial", True), ("concurrent", False), ("concurrent", True))
TARGET_RATIO = 1.15


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line of ``bench schedules``."""
    ap = argparse.ArgumentParser(prog="bench schedules", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="40 measured frames per engine (the table in docs/benchmark.md)"
    )
    ap.add_argument("--preset", default=None, help="model preset (default pi05-small on CPU, pi05 on CUDA)")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
    ap.add_argument("--layout", default="libero", choices=["libero", "droid", "aloha"])
    ap.add_argument("--tokens", type=int, default=30, help="N tokens per request")
    ap.add_argument("--k", type=int, default=1, help="decode steps per frame")
    ap.add_argument("--steps", type=int, default=10, help="denoise steps S")
    ap.add_argument("--horizon", type=int, default=10)
    ap.add_argument("--frames", type=int, default=80, help="measured frames per engine")
    ap.add_argument("--block", type=int, default=10, help="frames per engine per round")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per loop (CPU)")
    ap.add_argument("--policy", default="frame", choices=["frame", "continuous"], help="batcher policy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="output folder (default out/bench/schedules-<time>)")
    a = ap.parse_args(argv)
    if a.quick:
        a.frames = 40
    if min(a.tokens, a.k, a.frames, a.block, a.steps) < 1:
        ap.error("--tokens, --k, --frames, --block and --steps must be >= 1")
    return a


def engine_config(schedule: str, a: argparse.Namespace, prefix_tokens: int, max_prefix: int) -> EngineConfig:
    """Pool for ⌈N/k⌉ live requests, each holding its frame's prefix, plus prefixes in flight."""
    bs = 16
    live = -(-a.tokens // a.k) + 2
    blocks = live * (-(-prefix_tokens // bs) + -(-a.tokens // bs)) + 3 * -(-max_prefix // bs)
    return EngineConfig(
        mode="unified",
        schedule=schedule,
        batcher_policy=a.policy,
        tokens_per_frame=a.k,
        block_size=bs,
        kv_blocks=blocks,
        max_running_requests=live,
        max_queued_requests=64,
        seed=a.seed,
        num_denoise_steps=a.steps,
        tasks=(TaskConfig(TASK, "", max_new_tokens=a.tokens),),
    )


def run(policy: Pi05Policy, a: argparse.Namespace) -> dict[str, Any]:
    """Run the four engines in rotating rounds; returns the raw per-frame records per engine."""
    from ..core.loops.schedules import make_engine

    obs = observations(a.layout, 4, a.seed + 17)
    prefix_tokens = policy.encode_observation(obs[0]).prefix_len
    names = [f"{s}{'+language' if lang else ''}" for s, lang in ENGINES]
    engines = {
        n: make_engine(policy, engine_config(s, a, prefix_tokens, policy.cfg.max_prefix_len), a.threads)
        for n, (s, _) in zip(names, ENGINES)
    }
    lang = {n: la for n, (_, la) in zip(names, ENGINES)}
    warm = -(-a.tokens // a.k) + 5
    recs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    done = {n: 0 for n in names}
    rnd = 0
    try:
        while min(done.values()) < warm + a.frames:
            for n in names[rnd % 4 :] + names[: rnd % 4]:
                e = engines[n]
                e.meter.reset()  # a new round: no interval across another engine's frames
                for _ in range(a.block if done[n] >= warm else warm):
                    f = done[n]
                    e.submit_observation(obs[f % len(obs)])
                    if lang[n]:
                        e.submit_request(TASK, "", a.tokens, temperature=0.0)
                    m = e.step().metrics
                    done[n] += 1
                    recs[n].append(
                        {
                            "frame": f,
                            "warmup": f < warm,
                            "T": m.frame_time,
                            "tokens": m.tokens_emitted,
                            **{k: m.extra.get(k) for k in ("chunk_latency", "chunk_interval", "batcher_busy")},
                        }
                    )
                t_flush = time.perf_counter()
                tail = e.flush().metrics.tokens_emitted  # the round's last grants, before the next engine
                recs[n][-1]["tokens"] += tail
                recs[n][-1]["flush_s"] = time.perf_counter() - t_flush  # counted in the wall time
            rnd += 1
    finally:
        for e in engines.values():
            e.close()
    return recs


def summarize(name: str, frames: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the measured frames of one engine (times in ms)."""
    fr = [f for f in frames if not f["warmup"]]
    iv = [f["chunk_interval"] for f in fr if f["chunk_interval"] is not None]
    busy = [f["batcher_busy"] for f in fr if f["batcher_busy"] is not None]
    wall = sum(f["T"] + f.get("flush_s", 0.0) for f in fr)
    return {
        "engine": name,
        "frames": len(fr),
        "chunk_interval_ms": 1e3 * statistics.fmean(iv),
        "chunk_interval_p90_ms": 1e3 * _p90(iv),
        "chunk_latency_ms": 1e3 * statistics.fmean(f["chunk_latency"] for f in fr),
        "action_hz": None,
        "tok_s": sum(f["tokens"] for f in fr) / wall if wall else 0.0,
        "tokens_per_frame": sum(f["tokens"] for f in fr) / len(fr),
        "batcher_busy": statistics.fmean(busy) if busy else 0.0,
    }


def _p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.9 * len(s)))] if s else float("nan")


def ratios(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's numbers: language ÷ no-language chunk interval per schedule, tok/s ratio."""
    out = {}
    for s in ("serial", "concurrent"):
        out[f"{s}_chunk_ratio"] = rows[f"{s}+language"]["chunk_interval_ms"] / rows[s]["chunk_interval_ms"]
        out[f"{s}_latency_ratio"] = rows[f"{s}+language"]["chunk_latency_ms"] / rows[s]["chunk_latency_ms"]
    out["tok_s_concurrent_over_serial"] = rows["concurrent+language"]["tok_s"] / max(
        rows["serial+language"]["tok_s"], 1e-9
    )
    out["target_chunk_ratio_met"] = out["concurrent_chunk_ratio"] <= TARGET_RATIO
    out["target_tok_s_met"] = out["tok_s_concurrent_over_serial"] >= 1.0
    return out


def markdown(doc: dict[str, Any]) -> str:
    """The table of docs/benchmark.md ("Schedules: serial vs concurrent")."""
    s = doc["settings"]
    lines = [
        f"schedules — {s['preset']} on {s['device']}, {s['threads']} torch thread(s) per loop, "
        f"{s['layout']}, S={s['steps']}, H={s['horizon']}, language: 1 request/frame, N={s['tokens']}, "
        f"k={s['k']}, batcher policy {s['policy']}; {s['frames']} measured frames per engine",
        "",
        "| engine | chunk interval ms (p90) | chunk latency ms | action Hz | tok/s | tokens/frame | batcher busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"].values():
        lines.append(
            f"| {r['engine']} | {r['chunk_interval_ms']:.1f} ({r['chunk_interval_p90_ms']:.1f}) | "
            f"{r['chunk_latency_ms']:.1f} | {r['action_hz']:.1f} | {r['tok_s']:.1f} | "
            f"{r['tokens_per_frame']:.2f} | {r['batcher_busy']:.2f} |"
        )
    q = doc["ratios"]
    lines += [
        "",
        f"chunk interval with ÷ without language: serial {q['serial_chunk_ratio']:.3f}, concurrent "
        f"{q['concurrent_chunk_ratio']:.3f} (target ≤ {TARGET_RATIO}: "
        f"{'met' if q['target_chunk_ratio_met'] else 'NOT met'}); language tok/s concurrent ÷ serial "
        f"{q['tok_s_concurrent_over_serial']:.2f} (target ≥ 1: {'met' if q['target_tok_s_met'] else 'NOT met'})",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``bench schedules``; returns the exit status (2: CUDA asked for but absent)."""
    a = parse_args(argv)
    import torch

    from ..core.policy import Pi05Policy
    from .env import environment, finish_environment

    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "bench schedules: --device cuda needs a CUDA device (torch.cuda.is_available() is False)", file=sys.stderr
        )
        return 2
    if device.type == "cpu" and a.threads > 0:
        torch.set_num_threads(a.threads)  # the serial engines get the same per-loop threads
    preset = a.preset or ("pi05" if device.type == "cuda" else "pi05-small")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    env = environment(device, dtype)
    policy = Pi05Policy.from_pretrained(
        preset, device=device, dtype=dtype, seed=a.seed, config_overrides={"action_horizon": a.horizon}
    )
    policy.eos_id = -1  # every request emits exactly N tokens
    recs = run(policy, a)
    rows = {n: summarize(n, fr) for n, fr in recs.items()}
    for r in rows.values():
        r["action_hz"] = a.horizon / (r["chunk_interval_ms"] / 1e3)
    doc = {
        "schema": "oxygen_ros.bench.schedules/1",
        "argv": sys.argv[1:] if argv is None else list(argv),
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
            "preset": preset,
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
        },
        "environment": finish_environment(env),
        "rows": rows,
        "ratios": ratios(rows),
        "frames": recs,
        "duration_s": time.perf_counter() - t0,
    }
    out = a.out or Path("out/bench") / f"schedules-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=float))
    md = markdown(doc)
    (out / "results.md").write_text(md)
    print(md)
    print(f"bench schedules: wrote {out / 'results.json'} and results.md")
    return 0


__all__ = ["main", "parse_args", "run", "summarize", "ratios", "markdown", "engine_config"]
