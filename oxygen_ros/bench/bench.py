"""``bench``: isolated vs shared_kv vs unified on synthetic observations, without ROS.

For every sweep point the three engine modes run in one process, on the same weights, the same
observations and the same seeded request arrivals, interleaved frame by frame (the order rotates
every frame) so that load drift on a shared machine hits all three alike. Writes ``results.json``
(every raw frame and the environment), ``results.md`` and three PNG plots to ``--out``.

    bench --quick          # N = 30, k ∈ {1, 5}, LIBERO, S = 10, eager and compiled points in one run
    bench --quick --compile none           # eager only (CI smoke test, < 2 min on 2 cores)
    bench --host-floor     # host floor per frame at π0.5 depth, tiny widths, eager vs compiled
    bench --gpu            # full pi05, random weights, bf16, one CUDA GPU, compiled, <= 8 min
    bench                  # the paper sweep (see ``bench_workload.paper_sweep``); long on a CPU
    bench schedules --quick   # serial vs concurrent schedule, with / without language (issue 13)
    bench rtc              # real-time chunking's cost: denoise and chunk latency, RTC on ÷ off
    bench overhead         # what the engine adds to one chunk, against the single-request policy
    bench quant            # weight formats (int8 / fp8 / int4 vs fp32 or bf16): accuracy and paired speed
    bench --quick --weights int8           # any sweep with the Gemma projections int8 weight-only
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.config import COMPILE_MODES, WEIGHT_FORMATS, EngineConfig, TaskConfig
from .report import MODES, add_ratios, check_targets, markdown, missing_fields, summarize_mode
from .workload import BenchPoint, arrival_schedule, observations, paper_sweep, product_points

# torch and the engine are imported where they run, after the arguments are parsed:
# `bench --help` and a mistyped flag answer at once instead of after torch's ~7 s import
if TYPE_CHECKING:
    from ..core.policy import Pi05Policy
    from .costs import CostModel
    from .probe import MemoryMeter

PROFILES: dict[str, dict[str, Any]] = {
    "quick": dict(
        layouts=["libero"], steps=[10], tokens=[30], k=[1, 5], arrivals=["uniform:1"], compile=["none", "default"]
    ),
    "gpu": dict(
        preset="pi05",
        device="cuda",
        dtype="bfloat16",
        layouts=["libero"],
        steps=[10],
        tokens=[30],
        k=[1, 5],
        arrivals=["uniform:1"],
        max_minutes=6.5,
        compile=["reduce-overhead"],
        frames=30,
        action_cameras=True,
    ),
}
BLOCK_SIZE = 16
TASK = "bench"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line; a profile fills every option the user did not give."""
    ap = argparse.ArgumentParser(prog="bench", description=__doc__.split("\n\n")[0])
    prof = ap.add_mutually_exclusive_group()
    prof.add_argument("--quick", action="store_true", help="smoke profile: N=30, k in {1,5}, LIBERO, S=10")
    prof.add_argument("--gpu", action="store_true", help="full pi05 in bf16 on one CUDA GPU (fails fast without)")
    ap.add_argument("--preset", help="model preset (default pi05-small on CPU, pi05 on CUDA)")
    ap.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda if available)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default fp32 CPU / bf16 CUDA")
    ap.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        help="weight format of the Gemma projections (default: the dtype's floats; int8 / fp8 / int4: torchao "
        "weight-only, fp8 and int4 on CUDA only)",
    )
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--layouts", nargs="+", choices=["libero", "droid", "aloha"])
    ap.add_argument("--steps", nargs="+", type=int, help="denoise steps S")
    ap.add_argument("--tokens", nargs="+", type=int, help="tokens per request N")
    ap.add_argument("--k", nargs="+", type=int, help="decode steps per frame (default: every divisor of N)")
    ap.add_argument("--arrivals", nargs="+", help="uniform:R, poisson:LAMBDA, mix:R (requests per frame)")
    ap.add_argument("--horizon", type=int, default=10, help="action horizon H (10: the paper comparison)")
    ap.add_argument("--frames", type=int, help="measured frames per point (after warm-up; default 50)")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cost-samples", type=int, default=3, help="minimum samples per stage cost (cost model)")
    ap.add_argument("--max-minutes", type=float, help="stop starting new points after this long")
    ap.add_argument(
        "--compile",
        nargs="+",
        choices=list(COMPILE_MODES),
        help="engine.compile modes, each a set of points in the same run (default none)",
    )
    ap.add_argument(
        "--host-floor",
        action="store_true",
        help="host floor per frame at pi05 depth, tiny widths, "
        "for each --compile mode (default: none and default), then exit",
    )
    ap.add_argument("--action-cameras", action="store_true", help="also time the action path with 1, 2, 3 cameras")
    ap.add_argument("--out", type=Path, help="output folder (default out/bench/<profile>-<time>)")
    ap.add_argument("--overwrite", action="store_true", help="write into an --out folder that already holds files")
    ap.add_argument(
        "--no-progress", action="store_true", help="no progress bar (none either when stderr is not a terminal)"
    )
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    a.profile = (
        "quick"
        if a.quick
        else "gpu"
        if a.gpu
        else ("custom" if any(getattr(a, n) for n in ("layouts", "steps", "tokens", "k", "arrivals")) else "paper")
    )
    for key, val in PROFILES.get(a.profile, {}).items():
        if getattr(a, key, None) in (None, False):
            setattr(a, key, val)
    a.frames = 50 if a.frames is None else a.frames
    if a.frames < 1 or a.horizon < 1:
        ap.error("--frames and --horizon must be >= 1")
    if a.out is not None and a.out.is_dir() and any(a.out.iterdir()) and not a.overwrite:
        ap.error(
            f"--out {a.out} already holds files (an earlier run's results); choose another --out "
            "or pass --overwrite to write into it"
        )  # exit 2, before anything is loaded
    return a


def make_points(a: argparse.Namespace) -> list[BenchPoint]:
    """Sweep points of the profile / axes."""
    if a.profile == "paper":
        return paper_sweep(a.horizon, a.frames, a.seed)
    return product_points(
        a.layouts or ["libero"],
        a.steps or [10],
        a.tokens or [30],
        a.k,
        a.arrivals or ["uniform:1"],
        a.horizon,
        a.frames,
        a.seed,
        a.compile or ["none"],
    )


def engine_config(
    mode: str, pt: BenchPoint, schedule: list[list[int]], prefix_tokens: int, max_prefix_tokens: int
) -> EngineConfig:
    """Engine config of ``mode`` with its KV pool sized to this schedule's peak need (nothing
    queues, nothing is over-provisioned): held prefixes + own blocks + the next-prefix reserve."""

    def bf(n: int) -> int:  # blocks for n tokens
        return -(-n // BLOCK_SIZE)

    p, peak, running = bf(prefix_tokens), 0, 1
    alive: list[tuple[int, int, int]] = []  # (last frame, start frame, own blocks)
    for f, lens in enumerate(schedule):
        if mode == "unified":
            alive = [x for x in alive if x[0] >= f] + [
                (f + max(1, math.ceil((n - 1) / pt.k)) - 1, f, bf(n)) for n in lens
            ]
            need = len({x[1] for x in alive} | {f}) * p + sum(x[2] for x in alive)
            running = max(running, len(alive))
        else:
            need = p + sum(bf(n) + (p if mode == "isolated" else 0) for n in lens)
            running = max(running, len(lens))
        peak = max(peak, need)
    reserve = bf(max_prefix_tokens)
    return EngineConfig(
        mode=mode,
        tokens_per_frame=pt.k,
        block_size=BLOCK_SIZE,
        kv_blocks=max(peak + reserve, 2 * reserve + bf(pt.tokens)),
        max_running_requests=running,
        max_queued_requests=max(64, 2 * running),
        seed=pt.seed,
        num_denoise_steps=pt.steps,
        compile=pt.compile,
        tasks=(TaskConfig(TASK, "", max_new_tokens=pt.tokens),),
    )


def run_point(
    policy: Pi05Policy, pt: BenchPoint, modes: list[str], costs: CostModel, meter: MemoryMeter, bar: Any
) -> dict[str, Any]:
    """Run one point in every mode, frames interleaved, cost-model samples between frames; returns
    the raw frames with their ideal times. Modes without cross-frame state (isolated, shared_kv) skip
    all but the last two warm-up frames: only unified needs N/k frames to reach its steady state."""
    from ..core.engine.engine import Engine
    from ..core.engine.requests import RequestStatus
    from .probe import StageProbe

    obs = observations(pt.layout, 4, pt.seed + 17)
    total = pt.warmup + pt.frames
    sched = arrival_schedule(pt.arrival, pt.tokens, total, pt.seed * 7919 + zlib.crc32(pt.key.encode()))
    prefix_tokens = policy.encode_observation(obs[0]).prefix_len
    cfgs = {m: engine_config(m, pt, sched, prefix_tokens, policy.cfg.max_prefix_len) for m in modes}
    if pt.compile != "none":  # one decode bucket set for all modes: their compiled graphs are shared
        top = max(c.max_running_requests for c in cfgs.values())
        cfgs = {m: dataclasses.replace(c, max_running_requests=top) for m, c in cfgs.items()}
    engines = {m: Engine(policy, c) for m, c in cfgs.items()}
    cams = sum(v is not None for v in obs[0].images.values())
    for e in engines.values():  # compiles / captures every shape of this point before it is measured
        if pt.compile != "none":
            e.warmup(cameras=[cams])
    runs: dict[str, dict[str, Any]] = {
        m: {
            "frames": [],
            "rejected": 0,
            "errors": 0,
            "config": dataclasses.asdict(e.cfg),
            "warmup_s": e.warmup_s,
            "pool_blocks": e.pool.blocks.num_blocks,
            "pool_bytes": e.pool.k.nbytes + e.pool.v.nbytes,
        }
        for m, e in engines.items()
    }
    costs.begin_point(pt.layout, obs[0], pt.steps, pt.tokens // 2)
    seen: set[int] = set()
    probe = StageProbe(policy, wrap_model=pt.compile == "none")
    for e in engines.values():
        probe.attach(e)
    try:
        for f in range(total):
            for m in modes[f % len(modes) :] + modes[: f % len(modes)]:
                if m != "unified" and f < pt.warmup - 2:
                    continue
                e = engines[m]
                e.submit_observation(obs[f % len(obs)])
                for n in sched[f]:
                    e.submit_request(TASK, "", n, temperature=0.0)
                meter.before_step()
                probe.begin()
                r = e.step()
                rec = probe.frame(r.metrics)
                rec.update(
                    frame=f,
                    warmup=f < pt.warmup,
                    transient=meter.after_step(),
                    running=e.running,
                    queued=e.queued,
                    arrivals=len(sched[f]),
                )
                runs[m]["rejected"] += sum(x.status == RequestStatus.REJECTED for x in r.ended)
                runs[m]["errors"] += int(r.error is not None or r.action is None)
                frames = runs[m]["frames"]
                frames.append(rec)
                # request latency in this mode's own time (engine frame id = this mode's step index):
                # from its submission (start of its first step) to the end of this step
                rec["latencies"] = [
                    sum(g["T"] for g in frames[res.frame_id :])
                    for res in r.ended
                    if res.status == RequestStatus.FINISHED
                ]
                if not rec["warmup"]:
                    seen.update(rec["batches"])
                bar.update(1)
            if f >= pt.warmup:
                costs.tick(seen)
    finally:
        probe.detach()
        for m, e in engines.items():  # compiled stages, graphs, recompiles after warm-up, eager fallbacks
            runs[m]["compile_state"] = {
                k: v
                for k, v in e.diagnostics().items()
                if "_" in k and k[: k.index("_")] in ("compiled", "graphs", "recompiles", "fallback")
            }
            e.close()
        del engines
        gc.collect()
    for m in modes:
        for rec in runs[m]["frames"]:
            rec["ideal"] = None if rec["warmup"] else costs.ideal(rec)
    return {"point": pt.to_dict(), "prefix_tokens": prefix_tokens, "cost_model": costs.to_dict(), "modes": runs}


def limits(
    policy: Pi05Policy, device: Any, dtype: Any, results: list[dict[str, Any]], weights: str = ""
) -> dict[str, Any]:
    """Every point's cost-model stage times beside their roofline floors on this device
    (:func:`~.roofline.against_floor`): the CPU probed now (~2 s), a CUDA device by its name in
    ``bench roofline``'s table. ``{"device": None, "note": ...}`` when the device is not there.
    ``weights``: the run's quantized weight format (``int8``/``fp8``/``int4``), else the dtype's."""
    import torch

    from .roofline import Workload, against_floor, device_spec
    from .workload import LAYOUTS

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    spec = device_spec(device.type, name)
    if spec is None:
        return {"device": None, "note": f"{name} is not in bench roofline's device table"}
    fmt = weight_format(weights, dtype == torch.float32)
    cfg = policy.cfg
    points = {}
    for res in results:
        pt, cm = res["point"], res["cost_model"]
        cams = sum(hw is not None for hw in LAYOUTS[pt["layout"]].values())
        prefix = int(res["prefix_tokens"])
        w = Workload(
            cameras=cams,
            prompt_tokens=max(0, prefix - cams * cfg.vision.num_tokens),
            horizon=cfg.action_horizon,
            steps=pt["steps"],
            tokens=pt["tokens"],
            context=prefix + int(cm["own_tokens"]),
        )
        points[pt["key"]] = against_floor(cfg, spec, fmt, w, cm["costs"])
    return {"device": spec.name, "note": spec.note, "format": fmt, "points": points}


def weight_format(weights: str, fp32: bool) -> str:
    """The roofline weight format of a run: its quantized ``weights`` format, else ``fp32`` for an
    fp32 model and ``bf16`` for a 16-bit one."""
    return weights if weights in ("fp8", "int8", "int4") else ("fp32" if fp32 else "bf16")


def warm_up(policy: Pi05Policy, layout: str, modes: list[str]) -> None:
    """A few unrecorded frames per mode (allocator, thread pools, cuBLAS handles)."""
    from ..core.engine.engine import Engine

    pt = BenchPoint(layout, 2, 4, 2, "uniform:1", policy.cfg.action_horizon, 3)
    obs = observations(layout, 1, 0)[0]
    sched = [[4]] * 3
    for m in modes:
        e = Engine(
            policy, engine_config(m, pt, sched, policy.encode_observation(obs).prefix_len, policy.cfg.max_prefix_len)
        )
        for _ in range(3):
            e.submit_observation(obs)
            e.submit_request(TASK, "", 4)
            e.step()
        e.close()


def _no_cuda(a: argparse.Namespace) -> str | None:
    """Why this run cannot start (CUDA asked for but absent), or ``None``."""
    import torch

    if (a.gpu or (a.device or "").startswith("cuda")) and not torch.cuda.is_available():
        return (
            f"bench: {'--gpu' if a.gpu else '--device ' + a.device} needs a CUDA device, but "
            f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda or 'none'}). Run `bench --quick` on a CPU."
        )
    return None


def run_sweep(
    policy: Pi05Policy, points: list[BenchPoint], a: argparse.Namespace, meter: MemoryMeter, t_start: float
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every point in turn (with a progress bar); points that would overrun ``--max-minutes`` are
    skipped. Returns (point results, skipped point keys)."""
    from tqdm import tqdm

    from .costs import CostModel

    costs = CostModel(policy, block_size=BLOCK_SIZE, min_samples=a.cost_samples)
    warm_up(policy, points[0].layout, a.modes)
    bar = tqdm(
        total=sum(_frames_run(p, a.modes) for p in points),
        unit="frame",  # no bar frames into a pipe
        disable=a.no_progress or not sys.stderr.isatty(),
        file=sys.stderr,
        dynamic_ncols=True,
    )
    results, skipped, last = [], [], 0.0
    for pt in points:
        if a.max_minutes and time.perf_counter() - t_start + last > 60 * a.max_minutes:
            skipped.append(pt.key)
            continue
        bar.set_description(pt.key)
        t0 = time.perf_counter()
        results.append(run_point(policy, pt, a.modes, costs, meter, bar))
        last = time.perf_counter() - t0
    bar.close()
    return results, skipped


def _host_floor(a: argparse.Namespace) -> int:
    from .host_floor import host_floor, markdown as floor_md  # noqa: I001

    doc = host_floor(a.compile or ["none", "default"], steps=(a.steps or [10])[0])
    out = a.out or Path("out/bench") / f"host-floor-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_floor.json").write_text(json.dumps(doc, indent=1, default=float))
    md = floor_md(doc)
    (out / "host_floor.md").write_text(md + "\n")
    print(md)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status (2: bad environment, e.g. ``--gpu`` without CUDA).
    ``bench schedules …`` runs the serial-vs-concurrent schedule comparison (:mod:`.schedule`),
    ``bench rtc …`` the cost of real-time chunking (:mod:`.rtc`), ``bench roofline …`` the roofline
    floor of each stage per device and weight format (:mod:`.roofline`), ``bench quant …`` the
    accuracy and speed of each weight format (:mod:`.quant`)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["schedules"]:
        from .schedule import main as schedules

        return schedules(args[1:])
    if args[:1] == ["overhead"]:
        from .overhead import main as overhead

        return overhead(args[1:])
    if args[:1] == ["rtc"]:
        from .rtc import main as rtc_bench

        return rtc_bench(args[1:])
    if args[:1] == ["roofline"]:
        from .roofline import main as roofline

        return roofline(args[1:])
    if args[:1] == ["quant"]:
        from .quant import main as quant

        return quant(args[1:])
    a = parse_args(argv)
    import torch

    from ..core.cache.kv_pool import KVPool
    from ..core.policy import Pi05Policy
    from .env import environment, finish_environment
    from .host_floor import action_path
    from .probe import MemoryMeter

    why = _no_cuda(a)
    if why:
        print(why, file=sys.stderr)
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.host_floor:
        return _host_floor(a)
    points = make_points(a)
    if not points:
        print("bench: no sweep point (does any --k divide any --tokens?)", file=sys.stderr)
        return 2
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    preset = a.preset or ("pi05" if device.type == "cuda" else "pi05-small")
    from ..core.model.quantize import WeightFormatError, resolve_dtype

    try:  # --weights fp32 / bf16 / int4 pick the dtype; a contradicting --dtype or device is refused
        dtype = resolve_dtype(a.weights or "", getattr(torch, a.dtype) if a.dtype else None, device)
    except WeightFormatError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    out = a.out or Path("out/bench") / f"{a.profile}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    env = environment(device, dtype)
    warnings = _load_warning(env) if device.type == "cpu" else []
    policy = Pi05Policy.from_pretrained(
        preset,
        device=device,
        dtype=dtype,
        seed=a.seed,
        config_overrides={"action_horizon": a.horizon},
        weights=a.weights or "",
    )
    build_s = time.perf_counter() - t_start
    policy.eos_id = -1  # ignore EOS (as vLLM's benchmarks): every request emits exactly its budget
    meter = MemoryMeter(device)
    results, skipped = run_sweep(policy, points, a, meter, t_start)
    cams = action_path(policy, (a.compile or ["none"])[-1], (a.steps or [10])[0]) if a.action_cameras else []
    c = policy.cfg.vlm
    bpb = KVPool.bytes_per_block(c.depth, BLOCK_SIZE, c.num_kv_heads, c.head_dim, policy.model.dtype)
    rows = [summarize_mode(res["point"], m, run, meter.base, bpb) for res in results for m, run in res["modes"].items()]
    add_ratios(rows)
    settings = {
        "preset": preset,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "weights": a.weights or "",
        "horizon": a.horizon,
        "frames": a.frames,
        "modes": a.modes,
        "seed": a.seed,
        "block_size": BLOCK_SIZE,
        "model_build_s": build_s,
        "ignore_eos": True,
        "request": "empty template (first token from the prefix), greedy",
        "memory_method": meter.method,
        "memory_base_mb": meter.base / 2**20,
        "kv_bytes_per_block": bpb,
        "warnings": warnings,
        "interleave": "frame by frame, order rotated",
    }
    doc = {
        "schema": "oxygen_ros.bench/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "profile": a.profile,
        "environment": finish_environment(env),
        "settings": settings,
        "points": results,
        "summary": rows,
        "targets": check_targets(rows, {r["point"]["key"]: r["point"] for r in results}, device.type == "cuda"),
        "skipped": skipped,
        "action_path": cams,
        "frames_total": sum(len(r["frames"]) for res in results for r in res["modes"].values()),
        "duration_s": time.perf_counter() - t_start,
    }
    doc["limits"] = limits(policy, device, dtype, results, a.weights or "")
    doc["plots"] = [] if a.no_plots else _plots(doc, out)
    doc["missing"] = missing_fields(doc)
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=float))
    md = markdown(doc)
    (out / "results.md").write_text(md)
    print(md)
    print(f"bench: wrote {out / 'results.json'}, results.md, {', '.join(doc['plots']) or 'no plots'}")
    return 0


def _load_warning(env: dict[str, Any]) -> list[str]:
    load, cores, threads = (env["loadavg_start"] or [0.0])[0], env["cpu_affinity"] or 1, env["torch_threads"]
    if load + threads <= cores + 0.5:
        return []
    msg = f"load average {load} on {cores} cores with {threads} torch thread(s): timings are noisy"
    if threads > 1:
        msg += "; intra-op threads waiting for busy cores inflate them badly, consider --threads 1"
    print(f"bench: warning: {msg}", file=sys.stderr)
    return [msg]


def _frames_run(pt: BenchPoint, modes: list[str]) -> int:
    return sum(pt.warmup + pt.frames if m == "unified" else min(pt.warmup, 2) + pt.frames for m in modes)


def _plots(doc: dict[str, Any], out: Path) -> list[str]:
    from .plots import write_plots

    return write_plots(doc, out)


if __name__ == "__main__":
    sys.exit(main())
