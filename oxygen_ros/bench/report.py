"""Aggregation of ``bench`` raw frames: per-(point, mode) summaries, ratios, targets, markdown."""

from __future__ import annotations

import math
import statistics
from typing import Any

MODES = ("isolated", "shared_kv", "unified")
STAGES = ("preprocess", "vision", "prefill", "denoise", "fwd_decode", "fwd_start", "build", "sample", "other")
SUMMARY_KEYS = (
    "point",
    "mode",
    "frames",
    "frame_time_ms",
    "frame_time_median_ms",
    "frame_time_p90_ms",
    "action_hz",
    "tok_s",
    "speedup",
    "tok_s_ratio",
    "overhead_pct",
    "build_pct",
    "sample_pct",
    "other_pct",
    "engine_bookkeeping_pct",
    "decode_batch_mean",
    "decode_batch_max",
    "decode_steps_mean",
    "ideal_ms",
    "efficiency",
    "peak_mem_mb",
    "mem_ratio",
    "kv_used_peak_mb",
    "kv_ratio",
    "pool_mb",
    "request_latency_ms",
    "queued_max",
    "rejected",
    "errors",
    "stages_ms",
)
#: The issue's targets: (name, mode, metric, comparison, bound, where).
TARGETS: tuple[tuple[str, str, str, str, float, dict[str, int]], ...] = (
    ("bookkeeping <= 2 % of a frame at k = 1", "unified", "overhead_pct", "<=", 2.0, {"k": 1}),
    ("bookkeeping <= 1 % of a frame at k = 5", "unified", "overhead_pct", "<=", 1.0, {"k": 5}),
    ("efficiency vs cost model >= 0.9 (unified)", "unified", "efficiency", ">=", 0.9, {}),
    ("peak memory unified <= 1.10 x isolated", "unified", "mem_ratio", "<=", 1.10, {}),
    ("unified >= 4 x isolated at N = 30, k = 1 (GPU)", "unified", "speedup", ">=", 4.0, {"tokens": 30, "k": 1}),
)


def _pct(q: list[float], p: float) -> float:
    s = sorted(q)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def summarize_mode(
    point: dict[str, Any], mode: str, run: dict[str, Any], base_bytes: int, bytes_per_block: int
) -> dict[str, Any]:
    """Summary row of one mode at one point from its measured (non-warm-up) frames."""
    fr = [f for f in run["frames"] if not f["warmup"]]
    total = sum(f["T"] for f in fr) or float("nan")
    n = len(fr)

    def mean(key: str) -> float:
        m: float = sum(f[key] for f in fr) / n
        return m

    steps = [s for f in fr for s in f["batches"]]
    lat = [x for f in fr for x in f["latencies"]]
    ideal = [f["ideal"] for f in fr if f.get("ideal") is not None]

    def pct(key: str) -> float:
        p: float = 100.0 * sum(f[key] for f in fr) / total
        return p

    peak = base_bytes + run["pool_bytes"] + max((f["transient"] for f in fr), default=0)
    # A compiled point runs the decode forward inside the compiled step, so the probe cannot split
    # model time from bookkeeping there, and the cost model prices eager forwards: those figures
    # exist only for eager points ("–" in the table; the targets skip them).
    eager = point.get("compile", "none") == "none"

    def split(key: str) -> float | None:
        return pct(key) if eager else None

    return {
        "warmup_s": run.get("warmup_s", 0.0),
        "compile_state": run.get("compile_state", {}),
        "point": point["key"],
        "mode": mode,
        "frames": n,
        "frame_time_ms": 1e3 * total / n,
        "frame_time_median_ms": 1e3 * statistics.median(f["T"] for f in fr),
        "frame_time_p90_ms": 1e3 * _pct([f["T"] for f in fr], 90),
        "action_hz": point["horizon"] * n / total,
        "tok_s": sum(f["tokens"] for f in fr) / total,
        "speedup": None,
        "tok_s_ratio": None,
        "overhead_pct": split("overhead"),
        "build_pct": split("build"),
        "sample_pct": split("sample"),
        "other_pct": split("other"),
        "engine_bookkeeping_pct": pct("engine_bookkeeping"),
        "decode_batch_mean": sum(steps) / len(steps) if steps else 0.0,
        "decode_batch_max": max(steps, default=0),
        "decode_steps_mean": mean("decode_steps"),
        "ideal_ms": 1e3 * sum(ideal) / len(ideal) if ideal and eager else None,
        "efficiency": sum(ideal) / total if len(ideal) == n and eager else None,
        "peak_mem_mb": peak / 2**20,
        "mem_ratio": None,
        "kv_used_peak_mb": max(f["kv_peak_blocks"] for f in fr) * bytes_per_block / 2**20,
        "kv_ratio": None,
        "pool_mb": run["pool_bytes"] / 2**20,
        "request_latency_ms": 1e3 * sum(lat) / len(lat) if lat else None,
        "queued_max": max(f["queued"] for f in fr),
        "rejected": run["rejected"],
        "errors": run["errors"],
        "stages_ms": _stages_ms({s: 1e3 * mean(s) for s in STAGES}, eager),
    }


def _stages_ms(stages: dict[str, float], eager: bool) -> dict[str, float]:
    """Mean stage times; at a compiled point the decode/start forwards and their step building are
    one compiled call, reported as ``fwd_decode`` (``build`` 0) instead of posing as bookkeeping."""
    if not eager:
        stages["fwd_decode"] += stages["build"]
        stages["build"] = 0.0
    return stages


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Fill speedup / tok_s_ratio / mem_ratio / kv_ratio of each row against isolated at its point."""
    iso = {r["point"]: r for r in rows if r["mode"] == "isolated"}
    for r in rows:
        b = iso.get(r["point"])
        if b is None:
            continue
        r["speedup"] = b["frame_time_ms"] / r["frame_time_ms"]
        r["tok_s_ratio"] = r["tok_s"] / b["tok_s"] if b["tok_s"] else None
        r["mem_ratio"] = r["peak_mem_mb"] / b["peak_mem_mb"]
        r["kv_ratio"] = r["kv_used_peak_mb"] / b["kv_used_peak_mb"] if b["kv_used_peak_mb"] else None


def check_targets(rows: list[dict[str, Any]], points: dict[str, dict[str, Any]], gpu: bool) -> list[dict[str, Any]]:
    """Each target against every matching row: worst value, pass/miss (GPU-only targets need a GPU run)."""
    out: list[dict[str, Any]] = []
    for name, mode, metric, op, bound, where in TARGETS:
        vals = [
            (r["point"], r[metric])
            for r in rows
            if r["mode"] == mode
            and r[metric] is not None
            and all(points[r["point"]].get(k) == v for k, v in where.items())
        ]
        applies = gpu or "GPU" not in name
        if not vals:
            out.append({"target": name, "status": "not measured", "worst": None, "at": None})
            continue
        worst = max(vals, key=lambda x: x[1]) if op == "<=" else min(vals, key=lambda x: x[1])
        ok = worst[1] <= bound if op == "<=" else worst[1] >= bound
        status = ("met" if ok else "missed") if applies else f"n/a on CPU ({'met' if ok else 'missed'})"
        out.append({"target": name, "status": status, "worst": worst[1], "at": worst[0], "bound": bound})
    return out


def _f(v: Any, nd: int = 1) -> str:
    return "–" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def markdown(doc: dict[str, Any]) -> str:
    """The results as a markdown report: settings, one table row per (point, mode), targets."""
    env, st = doc["environment"], doc["settings"]
    lines = [
        f"### bench — {st['preset']} on {env['device_name']} ({st['dtype']}, {env['torch_threads']} threads), "
        f"H = {st['horizon']}",
        "",
        f"{doc['frames_total']} frames in {doc['duration_s']:.0f} s; load average at start/end "
        f"{env['loadavg_start']} / {env.get('loadavg_end', '?')} (timings on a shared machine are noisy).",
        "",
        "| point | mode | T ms (p50) | action Hz | tok/s | speedup | overhead % (build/sample/other) | "
        "batch | ideal ms | eff. | peak MB (×iso) | KV used MB | warm-up s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["summary"]:
        lines.append(
            f"| {r['point']} | {r['mode']} | {_f(r['frame_time_ms'])} ({_f(r['frame_time_median_ms'])}) | "
            f"{_f(r['action_hz'])} | {_f(r['tok_s'])} | {_f(r['speedup'], 2)}× | {_f(r['overhead_pct'], 2)} "
            f"({_f(r['build_pct'], 2)}/{_f(r['sample_pct'], 2)}/{_f(r['other_pct'], 2)}) | "
            f"{_f(r['decode_batch_mean'])} | {_f(r['ideal_ms'])} | {_f(r['efficiency'], 2)} | "
            f"{_f(r['peak_mem_mb'], 0)} ({_f(r['mem_ratio'], 2)}) | {_f(r['kv_used_peak_mb'], 1)} | "
            f"{_f(r.get('warmup_s', 0.0), 1)} |"
        )
    lines += ["", "| target | status | worst | at |", "|---|---|---|---|"]
    for t in doc["targets"]:
        lines.append(f"| {t['target']} | {t['status']} | {_f(t['worst'], 2)} | {t['at'] or '–'} |")
    if doc.get("action_path"):
        lines += ["", "| cameras | action path ms (prefill + denoise, p50) | warm-up s |", "|---|---|---|"]
        lines += [f"| {x['cameras']} | {_f(x['ms'], 2)} | {_f(x['warmup_s'], 1)} |" for x in doc["action_path"]]
    lines += compile_notes(doc["summary"])
    lines += limit_lines(doc.get("limits"))
    if doc.get("skipped"):
        lines += ["", f"Skipped (time budget): {', '.join(doc['skipped'])}"]
    return "\n".join(lines) + "\n"


def limit_lines(lim: dict[str, Any] | None) -> list[str]:
    """The "% of limit" table: each point's measured stages beside their roofline floors
    (``bench roofline``; floor ÷ measured, 100 % = at the device's limit)."""
    if not lim:
        return []
    if lim.get("device") is None:
        return ["", f"% of limit: {lim.get('note', 'no device figures')}"]
    lines = [
        "",
        f"% of limit on {lim['device']} ({lim['note']}; {lim['format']} weights): floor = max(bytes / bandwidth, "
        "FLOPs / peak), `bench roofline`",
        "",
        "| point | stage | batch | measured ms | floor ms | bound | % of limit |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, rows in lim["points"].items():
        for r in rows:
            lines.append(
                f"| {key} | {r['stage']} | {r['batch'] or '–'} | {_f(1e3 * r['measured_s'], 2)} | "
                f"{_f(1e3 * r['floor_s'], 2)} | {r['bound']} | {_f(r['pct_of_limit'], 1)} |"
            )
    return lines


def compile_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Lines on compiled points: the stages each mode ran compiled, and every recompile after
    warm-up or eager fallback (a compiled figure measured on eager code must say so)."""
    lines = []
    for r in rows:
        st = r.get("compile_state") or {}
        if not any(k.startswith("graphs_") for k in st):  # an eager point
            continue
        bad = [
            f"{k.split('_', 1)[1]} recompiled {v}x after warm-up" for k, v in st.items() if k.startswith("recompiles_")
        ]
        bad += [f"{k.split('_', 1)[1]} ran eager ({v})" for k, v in st.items() if k.startswith("fallback_")]
        lines.append(
            f"- {r['point']} / {r['mode']}: compiled stages {st.get('compiled_stages', 'none')}"
            + ("; **" + "; ".join(bad) + "**" if bad else "; no recompile after warm-up")
        )
    return ["", "Compiled stages:", *lines] if lines else []


def missing_fields(doc: dict[str, Any]) -> list[str]:
    """Names of required fields that are absent or not finite (empty list: the JSON is complete)."""
    miss = [k for k in ("environment", "settings", "points", "summary", "targets") if k not in doc]
    miss += [f"{p['point']['key']}/cost_model" for p in doc.get("points", []) if not p.get("cost_model")]
    for r in doc.get("summary", []):
        for k in SUMMARY_KEYS:
            v = r.get(k, "absent")
            if v == "absent" or (isinstance(v, float) and not math.isfinite(v)):
                miss.append(f"{r.get('point')}/{r.get('mode')}/{k}")
    return miss


__all__ = [
    "MODES",
    "STAGES",
    "SUMMARY_KEYS",
    "TARGETS",
    "summarize_mode",
    "add_ratios",
    "check_targets",
    "markdown",
    "missing_fields",
    "compile_notes",
]
