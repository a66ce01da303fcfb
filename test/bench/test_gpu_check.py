"""``gpu_check``: the dry run of every stage on the CPU, on a bare PyTorch stack, and a stage that
fails or times out never stops the next one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oxygen_ros.bench import gpu_check
from oxygen_ros.bench.gpu_check.report import PARSERS, markdown

REPO = Path(__file__).resolve().parents[2]
BARE = ("cv2", "psutil", "matplotlib")  # installed here, absent on the GPU machine's stack


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``python -m oxygen_ros.bench.gpu_check`` in a process (and its stages' processes) where
    OpenCV, psutil and matplotlib look not installed (a ``sitecustomize`` on PYTHONPATH)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nfor n in {BARE!r}:\n    sys.modules[n] = None\n")
    out = tmp_path / "gc"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    proc = subprocess.run(
        [sys.executable, "-m", "oxygen_ros.bench.gpu_check", "--out", str(out), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return proc, out


@pytest.mark.slow
def test_the_dry_run_runs_every_stage_on_a_bare_stack(tmp_path):
    """Every stage passes on the CPU with pi05-tiny (the ``gpu`` tests are ``skipped`` without
    CUDA: they ran none); one summary line per stage on stdout, its log and the summary written;
    the Markdown table holds every stage and the bench / schedule figures."""
    import torch

    proc, out = _run(tmp_path, "--dry-run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "summary.json").read_text())
    assert doc["dry_run"] is True
    want = {n: "passed" for n in gpu_check.STAGES}
    if not torch.cuda.is_available():
        want["tests"] = "skipped"
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == list(want.items())
    for name in gpu_check.STAGES:
        assert (out / f"{name}.log").stat().st_size > 0
        assert sum(line.startswith(f"[{name}] {want[name]} in ") for line in proc.stdout.splitlines()) == 1
    figs = {k: v for s in doc["stages"] for k, v in s["figures"].items()}
    assert figs["smoke_ok"] == figs["smoke_runs"] == 4
    assert figs["failed"] == 0 and figs["passed"] + figs["skipped"] >= 1
    for key in (
        "speedup_k1",
        "speedup_k5",
        "action_hz_k1",
        "tok_s_k1",
        "action_path_1cam_ms",
        "action_path_3cam_ms",
        "peak_mem_mb",
        "concurrent_chunk_ratio",
    ):
        assert figs[key] > 0, key
    md = (out / "summary.md").read_text()
    assert md.startswith("### gpu_check --dry-run (CPU, pi05-tiny)")
    assert all(f"| {n} | {want[n]} |" in md for n in gpu_check.STAGES)
    assert "| action path, 3 cameras (ms, p50) |" in md and "GPU target; n/a on the CPU" in md


@pytest.mark.slow
def test_a_stage_that_times_out_is_recorded_and_the_next_still_runs(tmp_path):
    proc, out = _run(tmp_path, "--dry-run", "--stages", "env", "schedules", "--timeout", "env=0.5")
    assert proc.returncode == 1
    doc = json.loads((out / "summary.json").read_text())
    env, sched = doc["stages"]
    assert env["status"] == "timeout" and "no results" in env["summary"]
    assert sched["status"] == "passed" and sched["figures"]["concurrent_chunk_ratio"] > 0
    assert "| env | timeout |" in (out / "summary.md").read_text()


def test_a_stage_without_results_is_an_error_with_the_reason(tmp_path):
    """A stage that exits 0 but leaves no result file is not "passed"."""
    res = gpu_check.run_stage(
        "bench", [sys.executable, "-c", "print('hello')"], 30, tmp_path, PARSERS["bench"], tmp_path
    )
    assert res["status"] == "error" and "FileNotFoundError" in res["summary"] and "hello" in res["log_tail"]
    res = gpu_check.run_stage(
        "tests", [sys.executable, "-c", "raise SystemExit(3)"], 30, tmp_path, PARSERS["tests"], tmp_path
    )
    assert res["status"] == "failed" and res["returncode"] == 3
    assert "| bench | error |" in markdown([res | {"stage": "bench", "status": "error"}], False, 1.0)


def _junit(folder: Path, tests: int, failures: int = 0, skipped: int = 0) -> None:
    """A pytest JUnit XML in ``folder/tests.xml`` with these counts (what ``--junitxml`` writes)."""
    cases = "".join(
        f'<testcase classname="test.core.test_x" name="test_{i}">'
        + (
            "<failure message='boom'/>"
            if i < failures
            else "<skipped message='no CUDA'/>"
            if i < failures + skipped
            else ""
        )
        + "</testcase>"
        for i in range(tests)
    )
    (folder / "tests.xml").write_text(
        f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" '
        f'failures="{failures}" skipped="{skipped}" tests="{tests}">{cases}</testsuite></testsuites>'
    )


@pytest.mark.parametrize(
    "tests, failures, skipped, status",
    [
        (12, 0, 12, "skipped"),  # every test skipped (no CUDA): nothing was checked
        (0, 0, 0, "skipped"),  # nothing collected at all
        (12, 0, 11, None),  # one test ran and passed
        (12, 1, 11, None),  # one ran and failed: a failure, never hidden as skipped
    ],
)
def test_the_tests_parser_says_skipped_when_no_test_passed_or_failed(tmp_path, tests, failures, skipped, status):
    _junit(tmp_path, tests, failures, skipped)
    res = PARSERS["tests"](tmp_path)
    assert res.get("status") == status
    figs = res["figures"]
    assert (figs["passed"], figs["failed"], figs["skipped"]) == (tests - failures - skipped, failures, skipped)
    assert res["summary"].startswith(f"{tests - failures - skipped} passed, {failures} failed, {skipped} skipped")


def test_a_tests_stage_that_ran_no_test_reports_skipped_with_its_summary(tmp_path):
    """Exit 0 with every test skipped is ``skipped`` (with pytest's counts); the same results with a
    non-zero exit stay ``failed``; a stage with a passing test stays ``passed``."""
    _junit(tmp_path, 12, skipped=12)
    res = gpu_check.run_stage("tests", [sys.executable, "-c", "pass"], 30, tmp_path, PARSERS["tests"], tmp_path)
    assert res["status"] == "skipped" and res["summary"] == "0 passed, 0 failed, 12 skipped"
    assert "log_tail" not in res
    assert "| tests | skipped |" in markdown([res], False, 1.0)
    res = gpu_check.run_stage(
        "tests", [sys.executable, "-c", "raise SystemExit(1)"], 30, tmp_path, PARSERS["tests"], tmp_path
    )
    assert res["status"] == "failed" and res["summary"] == "0 passed, 0 failed, 12 skipped"
    _junit(tmp_path, 12, skipped=11)
    res = gpu_check.run_stage("tests", [sys.executable, "-c", "pass"], 30, tmp_path, PARSERS["tests"], tmp_path)
    assert res["status"] == "passed" and res["summary"] == "1 passed, 0 failed, 11 skipped"


def test_bad_timeout_flags_are_rejected():
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--timeout", "gpu=10"])
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--timeout", "bench=soon"])
    a = gpu_check.parse_args(["--timeout", "bench=100"])
    assert a.timeouts["bench"] == 100 and a.timeouts["env"] == gpu_check.TIMEOUTS["env"]
    assert sum(gpu_check.TIMEOUTS.values()) <= 8 * 60  # the whole check fits in 8 minutes


def _quant_results(folder: Path) -> None:
    """``bench quant``'s results.json as the CUDA run writes it: bf16 reference, fp8 measured,
    int4 refused (here: widths that do not divide by its group)."""
    speed = {
        "ref_s": {"vision": 0.004, "prefill": 0.003, "denoise": 0.010, "decode": 0.0005},
        "s": {"vision": 0.004, "prefill": 0.0024, "denoise": 0.008, "decode": 0.0003},
        "ratio": {"vision": 1.0, "prefill": 0.8, "denoise": 0.8, "decode": 0.6},
    }
    acc = {"actions": {"max_abs": 0.0123, "mean_abs": 0.002}, "tokens": {"agreement": 0.75}}
    rows = [
        {"weights": "fp8", "parity": acc, "preset": acc, "speed": speed, "pct_of_limit": {"decode": 41.5}},
        {"weights": "int4", "error": "weights='int4' groups 128 input features"},
    ]
    doc = {"settings": {"preset": "pi05-small", "reference": "bf16"}, "rows": rows}
    (folder / "quant").mkdir()
    (folder / "quant" / "results.json").write_text(json.dumps(doc))


def test_quant_stage_parses_and_prints_times_ratios_and_percent_of_limit(tmp_path):
    _quant_results(tmp_path)
    res = PARSERS["quant"](tmp_path)
    assert res["summary"] == "pi05-small vs bf16: fp8 err 1.2e-02, decode ×0.60; int4 n/a"
    md = markdown([{"stage": "quant", "status": "passed", "seconds": 30.0, **res}], False, 30.0)
    assert "Weight formats (bench quant, against bf16): stage ms (× reference; % of limit)" in md
    assert "| fp8 | 1.23e-02 | 75 % | 4.00 (×1.00; – ) |" not in md  # a missing % is a dash, not a blank
    assert (
        "| fp8 | 1.23e-02 | 75 % | 4.00 (×1.00; –) | 2.40 (×0.80; –) | 8.00 (×0.80; –) | 0.30 (×0.60; 41.5 %) |" in md
    )
    assert "| int4 | n/a: weights='int4' groups 128 input features |" in md


def test_bench_stage_prints_percent_of_limit_beside_stage_times(tmp_path):
    rows = [
        {
            "stage": "prefill",
            "batch": None,
            "measured_s": 0.004,
            "floor_s": 0.001,
            "bound": "compute",
            "pct_of_limit": 25.0,
        },
        {
            "stage": "decode + head",
            "batch": 6,
            "measured_s": 0.002,
            "floor_s": 0.0015,
            "bound": "memory",
            "pct_of_limit": 75.0,
        },
    ]
    lim = {"device": "H200", "note": "datasheet", "format": "bf16", "points": {"libero S10 N30 k1": rows}}
    doc = {"settings": {"preset": "pi05", "dtype": "bfloat16"}, "summary": [], "limits": lim}
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "results.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="no point"):  # a bench that measured nothing is an error ...
        PARSERS["bench"](tmp_path)
    figs = {"bench_limits": lim}
    md = markdown([{"stage": "bench", "status": "passed", "seconds": 1.0, "figures": figs}], False, 1.0)
    assert "Stage times and % of limit (bench, H200, bf16 weights" in md
    assert "| libero S10 N30 k1 | prefill | – | 4.00 | 1.00 | compute | 25.0 % |" in md
    assert "| libero S10 N30 k1 | decode + head | 6 | 2.00 | 1.50 | memory | 75.0 % |" in md
    no_dev = markdown(
        [
            {
                "stage": "bench",
                "status": "passed",
                "seconds": 1.0,
                "figures": {"bench_limits": {"device": None, "note": "X is not in the table"}},
            }
        ],
        False,
        1.0,
    )
    assert "% of limit (bench): X is not in the table" in no_dev
