"""``gpu_check``: the project's prepared GPU check — five timed stages that one command runs.

GPU time for this project comes in short, rare slots, so the check is built to succeed at once and
to bring back whatever it finished. Each stage runs in its own process with its own timeout; when
it ends (passed, failed, timed out or crashed) its log and result are written to ``--out`` and one
summary line is printed, and the next stage starts regardless. At the end ``summary.md`` (the
table for the README) and ``summary.json`` hold everything.

Stages (names for ``--stages`` / ``--timeout``):

* ``env`` — environment and a few frames of pi05-tiny in every engine mode (:mod:`.smoke`);
* ``tests`` — the ``gpu``-marked tests (CUDA engine, compiled vs eager on CUDA, no recompile after
  warm-up on CUDA), through pytest;
* ``schedules`` — ``bench schedules``: the concurrent schedule's chunk interval with ÷ without
  language;
* ``quant`` — ``bench quant`` on pi05-small: the fp8, int8 and int4 weight formats against bf16,
  action error, greedy-token agreement and each stage's time, ratio and "% of limit";
* ``bench`` — ``bench --gpu``: full π0.5 in bf16 (random weights), H = 10, S = 10, N = 30,
  k ∈ {1, 5}: action Hz, tok/s, speedup over isolated, action path with 1 / 2 / 3 cameras, peak
  memory, warm-up time, and each stage's "% of limit" (:func:`~oxygen_ros.bench.roofline.against_floor`).

``--dry-run`` runs the same stages on the CPU with pi05-tiny and a handful of frames (CI runs it).
It needs nothing beyond the core's stack (torch, transformers, tokenizers, safetensors, numpy,
pytest): run it from the tree with ``PYTHONPATH=. python3 -m oxygen_ros.bench.gpu_check``.
Reading the stages' results back: :mod:`oxygen_ros.bench.gpu_check.report`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .report import PARSERS, markdown

ROOT = Path(__file__).resolve().parents[3]
STAGES = ("env", "tests", "schedules", "quant", "bench")
#: seconds per stage on the GPU (sum 480 s: the whole check fits in 8 minutes)
TIMEOUTS = {"env": 60, "tests": 120, "schedules": 60, "quant": 60, "bench": 180}
DRY_TIMEOUTS = {"env": 120, "tests": 300, "schedules": 120, "quant": 120, "bench": 240}


def stage_commands(dry: bool, raw: Path, timeouts: dict[str, int]) -> dict[str, list[str]]:
    """The command line of each stage (run with this interpreter, from the repository root)."""
    py = [sys.executable]
    device = "cpu" if dry else "cuda"
    bench_minutes = max(0.5, (timeouts["bench"] - 60) / 60)  # stop starting points in time to write
    if dry:
        bench = [
            "--preset",
            "pi05-tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--layouts",
            "libero",
            "--steps",
            "10",
            "--tokens",
            "30",
            "--k",
            "1",
            "5",
            "--arrivals",
            "uniform:1",
            "--frames",
            "3",
            "--compile",
            "none",
            "--action-cameras",
        ]
        sched = ["--preset", "pi05-tiny", "--device", "cpu", "--frames", "4", "--block", "2"]
        quant = ["--preset", "pi05-tiny", "--device", "cpu", "--formats", "fp32", "int8"]
        quant += ["--repeats", "1", "--warmup", "1", "--observations", "1", "--decode-steps", "4", "--threads", "1"]
    else:
        bench, sched = ["--gpu"], ["--device", "cuda", "--frames", "40", "--block", "10"]
        quant = ["--preset", "pi05-small", "--device", "cuda", "--formats", "bf16", "fp8", "int8", "int4"]
    return {
        "env": py
        + ["-m", "oxygen_ros.bench.gpu_check.smoke", "--device", device, "--json", str(raw / "env.json")]
        + ([] if dry else ["--dtype", "float32"]),
        "tests": py
        + [
            "-m",
            "pytest",
            "-m",
            "gpu",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            f"--junitxml={raw / 'tests.xml'}",
            "test/core",
        ],  # every gpu-marked test is there
        "schedules": py + ["-m", "oxygen_ros.bench.bench", "schedules", *sched, "--out", str(raw / "schedules")],
        "quant": py + ["-m", "oxygen_ros.bench.bench", "quant", *quant, "--out", str(raw / "quant")],
        "bench": py
        + [
            "-m",
            "oxygen_ros.bench.bench",
            *bench,
            "--max-minutes",
            f"{bench_minutes:.1f}",
            "--no-plots",
            "--no-progress",
            "--overwrite",
            "--out",
            str(raw / "bench"),
        ],  # gpu_check owns raw/
    }


def run_stage(
    name: str, cmd: list[str], timeout_s: float, out: Path, parse: Callable[[Path], dict[str, Any]], raw: Path
) -> dict[str, Any]:
    """Run one stage; its output goes to ``out/<name>.log``. Returns its result (never raises):
    ``status`` is ``passed``, ``skipped`` (exit 0, but its results say it checked nothing: a
    ``tests`` stage where every test was skipped), ``failed`` (non-zero exit), ``timeout`` or
    ``error`` (could not start, or its results could not be read), with ``seconds``, ``summary``
    and ``figures``."""
    log = out / f"{name}.log"
    t0 = time.perf_counter()
    res: dict[str, Any] = {"stage": name, "command": " ".join(cmd), "timeout_s": timeout_s}
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    try:
        with open(log, "w") as f:
            proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, env=env)
        res["status"] = "passed" if proc.returncode == 0 else "failed"
        res["returncode"] = proc.returncode
    except subprocess.TimeoutExpired:
        res["status"] = "timeout"
    except OSError as e:
        res["status"], res["error"] = "error", f"could not start: {e}"
    res["seconds"] = round(time.perf_counter() - t0, 1)
    try:
        parsed = parse(raw)
        verdict = parsed.pop("status", None)
        res.update(parsed)
        if verdict == "skipped" and res["status"] == "passed":  # ran, exited 0, checked nothing
            res["status"] = "skipped"
    except Exception as e:  # a stage that died early leaves partial or no results: say so, go on
        res.setdefault("summary", f"no results ({type(e).__name__}: {e})")
        res.setdefault("figures", {})
        if res["status"] == "passed":
            res["status"] = "error"
    if res["status"] not in ("passed", "skipped"):
        res["log_tail"] = _tail(log)
    return res


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="output folder (default out/gpu_check-<time>)")
    ap.add_argument("--dry-run", action="store_true", help="same stages on the CPU with pi05-tiny, few frames")
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES), help="run only these stages")
    ap.add_argument(
        "--timeout",
        action="append",
        default=[],
        metavar="STAGE=SECONDS",
        help=f"override a stage's timeout (GPU defaults {TIMEOUTS})",
    )
    a = ap.parse_args(argv)
    a.timeouts = dict(DRY_TIMEOUTS if a.dry_run else TIMEOUTS)
    for item in a.timeout:
        name, _, sec = item.partition("=")
        if name not in STAGES or not sec.replace(".", "", 1).isdigit():
            ap.error(f"--timeout {item!r}: expected STAGE=SECONDS with STAGE one of {', '.join(STAGES)}")
        a.timeouts[name] = float(sec)
    a.out = a.out or ROOT / "out" / f"gpu_check-{time.strftime('%Y%m%d-%H%M%S')}"
    return a


def main(argv: list[str] | None = None) -> int:
    """Run the stages; exit 0 when every stage passed or was skipped (ran and checked nothing: shown
    as ``skipped`` in the table), 1 otherwise (results are written either way)."""
    a = parse_args(argv)
    out = a.out
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    cmds = stage_commands(a.dry_run, raw, a.timeouts)
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    print(f"gpu_check{' --dry-run' if a.dry_run else ''}: stages {', '.join(a.stages)} -> {out}", flush=True)
    for name in [s for s in STAGES if s in a.stages]:
        res = run_stage(name, cmds[name], a.timeouts[name], out, PARSERS[name], raw)
        results.append(res)
        (out / "summary.json").write_text(json.dumps({"dry_run": a.dry_run, "stages": results}, indent=1, default=str))
        print(f"[{name}] {res['status']} in {res['seconds']:.0f} s: {res.get('summary', '')}", flush=True)
    table = markdown(results, a.dry_run, time.perf_counter() - t0)
    (out / "summary.md").write_text(table)
    print(table)
    return 0 if all(r["status"] in ("passed", "skipped") for r in results) else 1
