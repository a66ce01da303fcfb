"""``bench rtc``: what real-time chunking (``core.rtc``) costs, as ratios measured in one run.

Two engines on the same weights and observations, RTC off and RTC on (LeRobot's ``elementwise``
guidance), both warmed up (compiled) before anything is timed. Each repetition times, in an order
that rotates every repetition so that load drift on a shared machine hits every variant alike:

* **denoise** — the S-step action expert loop alone (``Runner.actions_normalized``) over one prefix
  (prefilled once, its K/V copied into the RTC engine's pool: the same bits), with the same noise:
  plain flow, the ``elementwise`` guide, the paper's ``vjp`` guide (eager, one backward pass per
  step). The guide is active: the leftover is the previous chunk shifted by ``--gap`` rows, delay
  ``--delay`` rows, execution horizon = the chunk length;
* **chunk latency** — observation submitted → chunk handed out: one whole ``engine.step()`` with an
  observation and no language request, consecutive observation stamps ``--gap`` control periods
  apart so that every RTC chunk after the first is guided (counted by ``engine.handover``).

The first ``--warmup`` repetitions are excluded; figures are medians; a ratio is RTC ÷ off.
Writes ``results.json`` (every sample, the environment) and ``results.md`` to ``--out``.

    bench rtc                                   # pi05-tiny, eager, 30 repetitions
    bench rtc --preset pi05-small --repeats 10  # π0.5's token counts, small widths
    bench rtc --compile default                 # compiled stages (vjp stays eager)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.cache.block_pool import BlockTable
from ..core.config import COMPILE_MODES, EngineConfig
from ..core.engine.engine import Engine
from ..core.engine.frame import FramePrefix
from ..core.loops.schedules import make_engine
from ..core.model.flow import euler_times
from ..core.policy import Pi05Policy, frame_noise
from ..core.rtc.config import RTCConfig
from ..core.rtc.guidance import RTCGuide, make_guide
from ..core.rtc.handover import align_leftover
from .env import environment, finish_environment
from .workload import LAYOUTS, observations

DENOISE = ("off", "elementwise", "vjp")
CHUNK = ("off", "rtc")
BLOCK_SIZE = 16


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line of ``bench rtc``."""
    ap = argparse.ArgumentParser(prog="bench rtc", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="pi05-tiny", help="model preset (default pi05-tiny; pi05-small, pi05)")
    ap.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda if available)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default fp32 CPU / bf16 CUDA")
    ap.add_argument("--compile", default="none", choices=list(COMPILE_MODES), help="engine.compile (default none)")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--repeats", type=int, default=30, help="measured repetitions (default 30)")
    ap.add_argument("--warmup", type=int, default=3, help="repetitions excluded at the start (default 3)")
    ap.add_argument("--steps", type=int, default=10, help="denoise steps S")
    ap.add_argument("--horizon", type=int, help="chunk length T (default: the preset's)")
    ap.add_argument("--delay", type=int, default=3, help="inference delay d, rows (default 3)")
    ap.add_argument(
        "--gap",
        type=int,
        default=3,
        help="control periods between observation stamps = the leftover's shift in rows (default 3)",
    )
    ap.add_argument("--layout", default="libero", choices=list(LAYOUTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="output folder (default out/bench/rtc-<time>)")
    a = ap.parse_args(argv)
    if min(a.repeats, a.steps, a.gap) < 1 or a.warmup < 1 or a.delay < 0 or (a.horizon is not None and a.horizon < 2):
        ap.error("--repeats, --warmup, --steps, --gap must be >= 1, --delay >= 0, --horizon >= 2")
    return a


def rtc_config(a: argparse.Namespace, horizon: int, enabled: bool, guidance: str = "elementwise") -> RTCConfig:
    """The engines' RTC settings: fixed delay, execution horizon = the chunk length."""
    return RTCConfig(
        enabled=enabled,
        execution_horizon=horizon,
        inference_delay_mode="fixed",
        inference_delay=a.delay,
        guidance=guidance,
    ).validate()


def build_engines(policy: Pi05Policy, a: argparse.Namespace) -> dict[str, Engine]:
    """RTC off / on (elementwise); a pool for the held benchmark prefix, a frame's and the reserve."""
    mc = policy.cfg
    prefix_blocks = -(-mc.max_prefix_len // BLOCK_SIZE)
    cfg = EngineConfig(
        tasks=(),
        block_size=BLOCK_SIZE,
        kv_blocks=4 * prefix_blocks,
        max_running_requests=1,
        seed=a.seed,
        num_denoise_steps=a.steps,
        compile=a.compile,
    )
    cams = sum(v is not None for v in LAYOUTS[a.layout].values())
    engines = {}
    for name, on in (("off", False), ("rtc", True)):
        e = make_engine(policy, cfg, rtc=rtc_config(a, mc.action_horizon, on))
        if a.compile != "none":
            e.warmup(cameras=[cams])  # compiles every shape of the run before it is measured
        engines[name] = e
    return engines


@torch.inference_mode()
def shared_prefix(engines: dict[str, Engine], obs: Any) -> dict[str, FramePrefix]:
    """One prefill in the ``off`` engine's pool; its K/V copied into the other pools (the same bits)."""
    src = engines["off"]
    prefix = src.runner.prefill(src.policy.encode_observation(obs), 0, BlockTable(src.pool.blocks))
    s = torch.as_tensor(prefix.slots, device=src.pool.device)
    out = {"off": prefix}
    for name, e in engines.items():
        if name != "off":
            table = BlockTable(e.pool.blocks)
            slots = table.append(prefix.length)
            d = torch.as_tensor(slots, device=e.pool.device)
            e.pool.k[:, d], e.pool.v[:, d] = src.pool.k[:, s], src.pool.v[:, s]
            out[name] = dataclasses.replace(prefix, blocks=list(table.blocks), slots=list(slots))
    return out


def make_guides(
    engines: dict[str, Engine], prefix: FramePrefix, a: argparse.Namespace
) -> tuple[dict[str, RTCGuide], np.ndarray]:
    """The ``elementwise`` and ``vjp`` guides of a realistic hand-over: the previous chunk (another
    noise, same prefix) shifted by ``--gap`` rows; returns them and the leftover ``[T_left, A]``."""
    e = engines["off"]
    mc, a_dim = e.policy.cfg, e.policy.normalizer.action_dim
    prev = e.runner.actions_normalized(prefix, frame_noise(a.seed + 1, 0, mc.action_horizon, mc.action_dim), a.steps)
    left = align_leftover(prev[0, :, :a_dim].float().cpu().numpy(), float(a.gap))
    cfg = rtc_config(a, mc.action_horizon, True)
    guides = {
        form: make_guide(
            left,
            a.delay,
            schedule=cfg.schedule,
            horizon=cfg.execution_horizon,
            max_weight=cfg.max_guidance_weight,
            times=euler_times(a.steps)[0],
            length=mc.action_horizon,
            action_dim=mc.action_dim,
            vjp=form == "vjp",
        )
        for form in ("elementwise", "vjp")
    }
    assert all(g.active for g in guides.values())
    return guides, left


def _timed(e: Engine, fn: Callable[[], Any]) -> tuple[float, Any]:
    e.streams.sync()
    t = time.perf_counter()
    out = fn()
    e.streams.sync()
    return time.perf_counter() - t, out


def run(policy: Pi05Policy, a: argparse.Namespace) -> dict[str, Any]:
    """Warm-up + measured repetitions, each: the three denoise variants, then one chunk per engine,
    orders rotating. Returns the raw samples (seconds) and the checks."""
    engines = build_engines(policy, a)
    obs = observations(a.layout, 4, a.seed + 17)
    period = engines["rtc"].rtc.control_period_s
    try:
        prefixes = shared_prefix(engines, obs[0])
        guides, left = make_guides(engines, prefixes["off"], a)
        mc = policy.cfg
        noise = frame_noise(a.seed, 1, mc.action_horizon, mc.action_dim)
        calls: dict[str, tuple[Engine, Callable[[], Any]]] = {
            "off": (engines["off"], lambda: engines["off"].runner.actions_normalized(prefixes["off"], noise, a.steps))
        }
        for form in ("elementwise", "vjp"):

            def guided(g: RTCGuide = guides[form]) -> Any:  # the guide bound now, not at the call
                return engines["rtc"].runner.actions_normalized(prefixes["rtc"], noise, a.steps, g)

            calls[form] = (engines["rtc"], guided)
        den: dict[str, list[dict[str, Any]]] = {n: [] for n in DENOISE}
        chunk: dict[str, list[dict[str, Any]]] = {n: [] for n in CHUNK}
        outputs: dict[str, torch.Tensor] = {}
        for i in range(a.warmup + a.repeats):
            warm = i < a.warmup
            for n in DENOISE[i % 3 :] + DENOISE[: i % 3]:
                dt, x = _timed(*calls[n])
                den[n].append({"rep": i, "warmup": warm, "s": dt})
                outputs[n] = x
            o = dataclasses.replace(obs[i % len(obs)], stamp=100.0 + i * a.gap * period)
            for n in CHUNK[i % 2 :] + CHUNK[: i % 2]:
                chunk[n].append({"rep": i, "warmup": warm, **_chunk(engines[n], o)})
        a_dim, d = policy.normalizer.action_dim, min(a.delay, len(left))
        # how far each variant's first d rows (executed from the old chunk) are from the leftover:
        # ~0 with the guide active, O(1) for the plain flow
        frozen = {
            n: float((x[0, :d, :a_dim].float().cpu() - torch.as_tensor(left[:d])).abs().max()) if d else None
            for n, x in outputs.items()
        }
        counts = {n: dict(e.handover.counts) for n, e in engines.items()}
        state = {
            n: {
                k: v
                for k, v in e.diagnostics().items()
                if k.split("_")[0] in ("compiled", "graphs", "recompiles", "fallback")
            }
            for n, e in engines.items()
        }
        return {
            "denoise": den,
            "chunk": chunk,
            "frozen_rows_err": frozen,
            "leftover_rows": len(left),
            "handover_counts": counts,
            "compile_state": state,
            "warmup_s": {n: e.warmup_s for n, e in engines.items()},
        }
    finally:
        for e in engines.values():
            e.close()


def _chunk(e: Engine, obs: Any) -> dict[str, Any]:
    """One observation → chunk on ``e``: latency to the chunk's hand-out, whole step, guided or not."""
    before = e.handover.counts["guided"]
    handed: list[float] = []
    e.streams.sync()
    t0 = time.perf_counter()
    e.submit_observation(obs)
    r = e.step(lambda c: handed.append(time.perf_counter()))
    t1 = time.perf_counter()
    return {
        "latency_s": handed[0] - t0 if handed else None,
        "step_s": t1 - t0,
        "guided": e.handover.counts["guided"] > before,
        "error": r.error,
    }


def _stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "median_ms": 1e3 * statistics.median(s),
        "p90_ms": 1e3 * s[min(len(s) - 1, int(0.9 * len(s)))],
        "min_ms": 1e3 * s[0],
    }


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Medians (ms) and ratios over the measured repetitions; the per-repetition (paired) ratio's
    median too, which drift between repetitions cannot move."""
    den = {n: _stats([r["s"] for r in raw["denoise"][n] if not r["warmup"]]) for n in DENOISE}
    meas = {n: [r for r in raw["chunk"][n] if not r["warmup"]] for n in CHUNK}
    ch = {
        n: {
            **_stats([r["latency_s"] for r in rs if r["latency_s"] is not None]),
            "step_median_ms": 1e3 * statistics.median(r["step_s"] for r in rs),
            "chunks": sum(r["latency_s"] is not None for r in rs),
            "guided": sum(r["guided"] for r in rs),
            "errors": sum(r["error"] is not None for r in rs),
        }
        for n, rs in meas.items()
    }

    def paired(kind: str, num: str, key: str) -> float:
        rows = zip(raw[kind][num], raw[kind]["off"])
        median: float = statistics.median(x[key] / y[key] for x, y in rows if not x["warmup"] and x[key] and y[key])
        return median

    ratios = {f"denoise_{f}": den[f]["median_ms"] / den["off"]["median_ms"] for f in ("elementwise", "vjp")}
    ratios["chunk_latency_rtc"] = ch["rtc"]["median_ms"] / ch["off"]["median_ms"]
    paired_ratios = {f"denoise_{f}": paired("denoise", f, "s") for f in ("elementwise", "vjp")}
    paired_ratios["chunk_latency_rtc"] = paired("chunk", "rtc", "latency_s")
    return {"denoise": den, "chunk": ch, "ratios": ratios, "paired_ratios": paired_ratios}


def markdown(doc: dict[str, Any]) -> str:
    """The two tables: denoise variants, chunk latency; ratios RTC ÷ off."""
    st, env, s = doc["settings"], doc["environment"], doc["summary"]
    q, pq, fz = s["ratios"], s["paired_ratios"], doc["frozen_rows_err"]
    lines = [
        f"### bench rtc — {st['preset']} on {env['device_name']} ({st['dtype']}, {env['torch_threads']} threads), "
        f"compile {st['compile']}, S = {st['steps']}, T = {st['horizon']}, delay {st['delay']} rows, leftover "
        f"shifted {st['gap']} rows ({doc['leftover_rows']} rows)",
        "",
        f"{st['repeats']} interleaved repetitions (+ {st['warmup']} warm-up, excluded), medians; load average "
        f"start/end {env['loadavg_start']} / {env.get('loadavg_end', '?')}; {doc['duration_s']:.0f} s.",
        "",
        "| denoise (S steps, same prefix + noise) | median ms | p90 ms | × off (paired) | max err, first d rows |",
        "|---|---|---|---|---|",
    ]
    names = {"off": "off (plain flow)", "elementwise": "elementwise (LeRobot)", "vjp": "vjp (paper, eager)"}
    for n in DENOISE:
        r = s["denoise"][n]
        ratio = "1.00" if n == "off" else f"{q['denoise_' + n]:.2f} ({pq['denoise_' + n]:.2f})"
        err = "–" if fz.get(n) is None else f"{fz[n]:.3f}"
        lines.append(f"| {names[n]} | {r['median_ms']:.2f} | {r['p90_ms']:.2f} | {ratio} | {err} |")
    lines += [
        "",
        "| chunk latency (obs → chunk) | median ms | p90 ms | step ms | × off (paired) | guided |",
        "|---|---|---|---|---|---|",
    ]
    for n in CHUNK:
        r = s["chunk"][n]
        ratio = "1.00" if n == "off" else f"{q['chunk_latency_rtc']:.2f} ({pq['chunk_latency_rtc']:.2f})"
        lines.append(
            f"| {'RTC elementwise' if n == 'rtc' else 'off'} | {r['median_ms']:.2f} | {r['p90_ms']:.2f} | "
            f"{r['step_median_ms']:.2f} | {ratio} | {r['guided']}/{r['chunks']} |"
        )
    bad = [
        f"{n}: {k} {v}"
        for n, c in doc["compile_state"].items()
        for k, v in c.items()
        if k.startswith(("recompiles_", "fallback_"))
    ]
    if st["compile"] != "none":
        stages = {n: c.get("compiled_stages") for n, c in doc["compile_state"].items()}
        lines += [
            "",
            f"Compiled stages: {stages}; warm-up s {doc['warmup_s']}; "
            + ("**" + "; ".join(bad) + "**" if bad else "no recompile after warm-up"),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``bench rtc``; returns the exit status (2: CUDA asked for but absent)."""
    a = parse_args(argv)
    if (a.device or "").startswith("cuda") and not torch.cuda.is_available():
        print(
            f"bench rtc: --device {a.device} needs a CUDA device, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})",
            file=sys.stderr,
        )
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    t0 = time.perf_counter()
    env = environment(device, dtype)
    over = {"action_horizon": a.horizon} if a.horizon else {}
    policy = Pi05Policy.from_pretrained(a.preset, device=device, dtype=dtype, seed=a.seed, config_overrides=over)
    build_s = time.perf_counter() - t0
    raw = run(policy, a)
    settings = {
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "horizon": policy.cfg.action_horizon,
        "action_dim": policy.normalizer.action_dim,
        "model_build_s": build_s,
        "rtc": dataclasses.asdict(rtc_config(a, policy.cfg.action_horizon, True)),
        "interleave": "per repetition, order rotated; denoise variants then one chunk per engine",
    }
    doc = {
        "schema": "oxygen_ros.bench.rtc/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "settings": settings,
        "environment": finish_environment(env),
        "summary": summarize(raw),
        **raw,
        "duration_s": time.perf_counter() - t0,
    }
    out = a.out or Path("out/bench") / f"rtc-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=float))
    md = markdown(doc)
    (out / "results.md").write_text(md)
    print(md)
    print(f"bench rtc: wrote {out / 'results.json'} and results.md")
    return 0


__all__ = ["main", "parse_args", "run", "summarize", "markdown", "DENOISE", "CHUNK"]
