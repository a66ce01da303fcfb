"""What :mod:`oxygen_ros.bench.gpu_check` reads back from each stage, and its Markdown summary for the README.

Each parser takes the stage's raw folder and returns ``summary`` (one line) and ``figures`` (the
numbers the table shows); a missing or partial result file raises, and the check records the stage
as ``error`` with that message. A parser may also return ``status: skipped`` when its stage ran but
checked nothing (``tests``: no test passed and none failed); a stage that exited 0 then reports
``skipped`` instead of ``passed``. Targets are the GPU issue's (H200): action path ≤ 25 ms with three
cameras, unified ≥ 4× isolated at N = 30, k = 1, ≥ 150 action Hz and ≥ 450 tok/s; and the
schedule's chunk interval with ÷ without language ≤ 1.15.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..report import compile_notes

#: (figure key, label, format, comparison, bound) of the targets table
TARGETS = (
    ("action_path_3cam_ms", "action path, 3 cameras (ms, p50)", "{:.1f}", "<=", 25.0),
    ("speedup_k1", "unified ÷ isolated, N = 30, k = 1", "{:.2f}×", ">=", 4.0),
    ("action_hz_k1", "action Hz, unified, k = 1", "{:.0f}", ">=", 150.0),
    ("tok_s_k1", "tok/s, unified, k = 1", "{:.0f}", ">=", 450.0),
    ("speedup_k5", "unified ÷ isolated, N = 30, k = 5", "{:.2f}×", None, None),
    ("action_hz_k5", "action Hz, unified, k = 5", "{:.0f}", None, None),
    ("tok_s_k5", "tok/s, unified, k = 5", "{:.0f}", None, None),
    ("action_path_1cam_ms", "action path, 1 camera (ms, p50)", "{:.1f}", None, None),
    ("action_path_2cam_ms", "action path, 2 cameras (ms, p50)", "{:.1f}", None, None),
    ("peak_mem_mb", "peak memory, unified (MB)", "{:.0f}", None, None),
    ("warmup_s", "warm-up, slowest engine (s)", "{:.1f}", None, None),
    ("concurrent_chunk_ratio", "chunk interval with ÷ without language (concurrent)", "{:.3f}", "<=", 1.15),
    ("serial_chunk_ratio", "chunk interval with ÷ without language (serial)", "{:.3f}", None, None),
)


def parse_env(raw: Path) -> dict[str, Any]:
    """``env``: the smoke test's JSON."""
    d = json.loads((raw / "env.json").read_text())
    env, runs = d["environment"], d["runs"]
    ok = sum(r["ok"] for r in runs)
    figs = {
        "device_name": env["device_name"],
        "torch": env["versions"]["torch"],
        "cuda": env.get("cuda_runtime"),
        "python": env["python"],
        "gpu_memory_gb": env.get("gpu_memory_gb"),
        "smoke_ok": ok,
        "smoke_runs": len(runs),
    }
    bad = [f"{r['mode']}/{r['schedule']}" for r in runs if not r["ok"]]
    summary = (
        f"{env['device_name']}, torch {figs['torch']}, CUDA {figs['cuda']}: {ok}/{len(runs)} engine runs ok"
        + (f" (failed: {', '.join(bad)})" if bad else "")
        + "; first frames "
        + ", ".join(f"{r['first_frame_ms']:.0f}" for r in runs)
        + " ms"
    )
    return {"summary": summary, "figures": figs}


def parse_tests(raw: Path) -> dict[str, Any]:
    """``tests``: pytest's JUnit XML."""
    root = ET.parse(raw / "tests.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError("tests.xml holds no <testsuite>")
    n, fail, err, skip = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    failed = [
        f"{c.get('classname')}.{c.get('name')}"
        for c in suite.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ]
    figs = {"passed": n - fail - err - skip, "failed": fail + err, "skipped": skip, "failed_tests": failed}
    summary = f"{figs['passed']} passed, {figs['failed']} failed, {skip} skipped"
    res = {"summary": summary + (f" ({', '.join(failed[:5])})" if failed else ""), "figures": figs}
    if ran_no_test(figs):
        res["status"] = "skipped"
    return res


def ran_no_test(figures: dict[str, Any]) -> bool:
    """Whether a pytest run checked nothing: no test passed and none failed (every one skipped,
    e.g. the ``gpu`` tests on a machine without CUDA). Such a stage is ``skipped``, not ``passed``."""
    return bool(figures.get("passed", 0) == 0 and figures.get("failed", 0) == 0)


def parse_schedules(raw: Path) -> dict[str, Any]:
    """``schedules``: ``bench schedules``' results.json."""
    d = json.loads((raw / "schedules" / "results.json").read_text())
    r, rows = d["ratios"], d["rows"]
    figs = {
        "concurrent_chunk_ratio": r["concurrent_chunk_ratio"],
        "serial_chunk_ratio": r["serial_chunk_ratio"],
        "chunk_interval_ms": {k: v["chunk_interval_ms"] for k, v in rows.items()},
        "tok_s_concurrent_over_serial": r["tok_s_concurrent_over_serial"],
    }
    ci = figs["chunk_interval_ms"]
    summary = (
        f"chunk interval concurrent {ci.get('concurrent', float('nan')):.1f} ms, +language "
        f"{ci.get('concurrent+language', float('nan')):.1f} ms (ratio {figs['concurrent_chunk_ratio']:.3f}); "
        f"serial ratio {figs['serial_chunk_ratio']:.3f}"
    )
    return {"summary": summary, "figures": figs}


def parse_bench(raw: Path) -> dict[str, Any]:
    """``bench``: ``bench``'s results.json (summary rows, action path per camera count)."""
    d = json.loads((raw / "bench" / "results.json").read_text())
    figs: dict[str, Any] = {"preset": d["settings"]["preset"], "dtype": d["settings"]["dtype"]}
    for row in d["summary"]:
        k = next((p.split("k", 1)[1] for p in row["point"].split() if p.startswith("k")), "?")
        if row["mode"] == "unified":
            figs.update(
                {f"speedup_k{k}": row["speedup"], f"action_hz_k{k}": row["action_hz"], f"tok_s_k{k}": row["tok_s"]}
            )
            figs["peak_mem_mb"] = max(figs.get("peak_mem_mb", 0.0), row["peak_mem_mb"])
        figs["warmup_s"] = max(figs.get("warmup_s", 0.0), row.get("warmup_s") or 0.0)
    for x in d.get("action_path", []):
        figs[f"action_path_{x['cameras']}cam_ms"] = x["ms"]
    figs["compile_notes"] = compile_notes(d["summary"])[2:]
    figs["bench_limits"] = d.get("limits")
    if not d["summary"]:
        raise ValueError("bench measured no point")
    parts = [f"{d['settings']['preset']} {d['settings']['dtype']}"]
    for k in ("1", "5"):
        if f"speedup_k{k}" in figs:
            parts.append(
                f"k={k}: {figs[f'action_hz_k{k}']:.0f} action Hz, {figs[f'tok_s_k{k}']:.0f} tok/s, "
                f"{figs[f'speedup_k{k}']:.2f}x isolated"
            )
    if "action_path_3cam_ms" in figs:
        parts.append(f"action path 3 cams {figs['action_path_3cam_ms']:.1f} ms")
    return {"summary": "; ".join(parts), "figures": figs}


def parse_quant(raw: Path) -> dict[str, Any]:
    """``quant``: ``bench quant``'s results.json (per weight format: action error, greedy-token
    agreement, stage times, ratios to the reference and "% of limit")."""
    d = json.loads((raw / "quant" / "results.json").read_text())
    rows = d["rows"]
    if not rows:
        raise ValueError("bench quant measured no weight format")
    parts = []
    for r in rows:
        if "error" in r:
            parts.append(f"{r['weights']} n/a")
        else:
            e = r["preset"]["actions"]["max_abs"]
            dec = r.get("speed", {}).get("ratio", {}).get("decode")
            parts.append(f"{r['weights']} err {e:.1e}" + (f", decode ×{dec:.2f}" if dec is not None else ""))
    figs = {"quant_reference": d["settings"]["reference"], "quant_preset": d["settings"]["preset"], "quant_rows": rows}
    summary = f"{d['settings']['preset']} vs {d['settings']['reference']}: " + "; ".join(parts)
    return {"summary": summary, "figures": figs}


PARSERS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "env": parse_env,
    "tests": parse_tests,
    "schedules": parse_schedules,
    "quant": parse_quant,
    "bench": parse_bench,
}


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{1e3 * x:.2f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} %"


def bench_limit_lines(lim: dict[str, Any] | None) -> list[str]:
    """``bench``'s stage times with "% of limit" beside them (floor ÷ measured on the detected
    device, :func:`~oxygen_ros.bench.roofline.against_floor`), one table for every point."""
    if not lim:
        return []
    if lim.get("device") is None:
        return ["", f"% of limit (bench): {lim.get('note', 'no device figures')}"]
    lines = [
        "",
        f"Stage times and % of limit (bench, {lim['device']}, {lim['format']} weights; floor = max(bytes / "
        "bandwidth, FLOPs / peak)):",
        "",
        "| point | stage | batch | ms | floor ms | bound | % of limit |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, rows in lim.get("points", {}).items():
        for r in rows:
            lines.append(
                f"| {key} | {r['stage']} | {r['batch'] or '–'} | {_ms(r['measured_s'])} | {_ms(r['floor_s'])} | "
                f"{r['bound']} | {_pct(r['pct_of_limit'])} |"
            )
    return lines


def quant_lines(rows: list[dict[str, Any]] | None, reference: str = "") -> list[str]:
    """``bench quant``'s rows: per weight format, the action error and each stage's time with its
    ratio to the reference and its "% of limit"; a format the device cannot run says why."""
    if not rows:
        return []
    stages = ("vision", "prefill", "denoise", "decode")
    lines = [
        "",
        f"Weight formats (bench quant, against {reference or 'the reference'}): stage ms (× reference; % of limit)",
        "",
        "| weights | action max abs err | greedy tokens equal | " + " | ".join(stages) + " |",
        "|---|---|---|" + "---|" * len(stages),
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['weights']} | n/a: {r['error']} |" + " |" * (len(stages) + 1))
            continue
        acc = r["preset"]
        sp, pct = r.get("speed"), r.get("pct_of_limit") or {}
        cells = [
            r["weights"],
            f"{acc['actions']['max_abs']:.2e}",
            f"{100 * acc['tokens']['agreement']:.0f} %",
        ]
        for s in stages:
            cells.append("–" if sp is None else f"{_ms(sp['s'][s])} (×{sp['ratio'][s]:.2f}; {_pct(pct.get(s))})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _met(value: float, op: str | None, bound: float | None, dry: bool) -> str:
    if op is None or bound is None:
        return ""
    want = f"{'≤' if op == '<=' else '≥'} {bound:g}"
    if dry:
        return f"{want} (GPU target; n/a on the CPU)"
    ok = value <= bound if op == "<=" else value >= bound
    return f"{want}: {'met' if ok else 'MISSED'}"


def markdown(results: list[dict[str, Any]], dry: bool, seconds: float) -> str:
    """The README table: one row per stage, then the figures with their targets."""
    figs: dict[str, Any] = {}
    for r in results:
        figs.update(r.get("figures", {}))
    where = f"{figs.get('device_name', '?')}, torch {figs.get('torch', '?')}, CUDA {figs.get('cuda', '?')}"
    title = f"### gpu_check{' --dry-run (CPU, pi05-tiny)' if dry else ''} — {where}, {seconds:.0f} s"
    lines = [title, "", "| stage | status | time s | result |", "|---|---|---|---|"]
    lines += [f"| {r['stage']} | {r['status']} | {r['seconds']:.0f} | {r.get('summary', '')} |" for r in results]
    rows = [
        (label, fmt.format(figs[key]), _met(figs[key], op, bound, dry))
        for key, label, fmt, op, bound in TARGETS
        if isinstance(figs.get(key), (int, float))
    ]
    if rows:
        model = f"{figs.get('preset', '?')} {figs.get('dtype', '')}".strip()
        lines += ["", f"| figure ({model}) | value | target |", "|---|---|---|"]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if figs.get("compile_notes"):
        lines += ["", "Compiled stages (bench):", *figs["compile_notes"]]
    lines += bench_limit_lines(figs.get("bench_limits"))
    lines += quant_lines(figs.get("quant_rows"), figs.get("quant_reference", ""))
    return "\n".join(lines) + "\n"


__all__ = ["PARSERS", "TARGETS", "bench_limit_lines", "markdown", "quant_lines", "ran_no_test"]
