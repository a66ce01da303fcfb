"""``bench``: the quick profile writes a complete JSON (no speed is asserted anywhere), the
workload generators are deterministic and honour their rates, and ``--gpu`` fails fast without CUDA.

CI runs the ``--quick`` sweep (N = 30, k ∈ {1, 5}, LIBERO, S = 10, 50 measured frames) on the
``pi05-tiny`` preset; the same sweep on the default ``pi05-small`` preset takes about two minutes
on two cores and runs only with ``OXYGEN_BENCH_FULL_QUICK=1``.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from oxygen_ros.bench import bench
from oxygen_ros.bench.report import STAGES, SUMMARY_KEYS
from oxygen_ros.bench.workload import BenchPoint, arrival_schedule, divisors, paper_sweep, parse_arrival

FRAME_KEYS = {
    "T",
    "preprocess",
    "vision",
    "prefill",
    "denoise",
    "fwd_decode",
    "fwd_start",
    "build",
    "sample",
    "other",
    "overhead",
    "engine_bookkeeping",
    "tokens",
    "decode_steps",
    "decode_batch",
    "batches",
    "starts",
    "n_prefills",
    "blocks_in_use",
    "kv_peak_blocks",
    "frame",
    "warmup",
    "transient",
    "running",
    "queued",
    "arrivals",
    "latencies",
    "ideal",
}
ENV_KEYS = {
    "device",
    "dtype",
    "device_name",
    "torch_threads",
    "versions",
    "python",
    "cpu_count",
    "loadavg_start",
    "loadavg_end",
    "git_commit",
}


def run_bench(tmp_path, *args):
    out = tmp_path / "bench"
    # eager points only: compiled points are the same code with compile (covered, bounded, by
    # test/core/engine/test_compiled.py); compiling every bucket here would take minutes on 2 cores
    extra = ["--compile", "none"] if "--quick" in args and "--compile" not in args else []
    rc = bench.main([*args, *extra, "--threads", "1", "--out", str(out), "--no-progress"])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    return out, doc


def check_complete(doc, expected_points, frames):
    """Everything the issue asks for is in the JSON, finite, for every point and mode."""
    assert doc["missing"] == []
    assert ENV_KEYS <= set(doc["environment"])
    assert {p["point"]["key"] for p in doc["points"]} == set(expected_points)
    for p in doc["points"]:
        assert p["cost_model"]["costs"], "no cost-model samples"
        assert set(p["modes"]) == {"isolated", "shared_kv", "unified"}
        for mode, run in p["modes"].items():
            measured = [f for f in run["frames"] if not f["warmup"]]
            assert len(measured) == frames, mode
            warm = [f for f in run["frames"] if f["warmup"]]
            assert len(warm) == (p["point"]["warmup"] if mode == "unified" else 2)
            for f in run["frames"]:
                assert FRAME_KEYS <= set(f), FRAME_KEYS - set(f)
                parts = sum(f[s] for s in STAGES)
                assert math.isclose(parts, f["T"], rel_tol=1e-9, abs_tol=1e-9)  # stages add up to the frame
            assert all(f["ideal"] is not None and f["ideal"] > 0 for f in measured)
            assert run["rejected"] == 0 and run["errors"] == 0
            assert max(f["queued"] for f in measured) == 0  # pools sized so that nothing waits
    rows = doc["summary"]
    assert len(rows) == 3 * len(expected_points)
    for r in rows:
        assert set(SUMMARY_KEYS) <= set(r)
        for k in (
            "frame_time_ms",
            "action_hz",
            "tok_s",
            "speedup",
            "overhead_pct",
            "efficiency",
            "peak_mem_mb",
            "mem_ratio",
            "ideal_ms",
        ):
            assert isinstance(r[k], float) and math.isfinite(r[k]) and (r[k] >= 0 or k == "overhead_pct"), k
        assert set(r["stages_ms"]) == set(STAGES)
    assert {t["target"] for t in doc["targets"]} and all(t["status"] for t in doc["targets"])


def test_quick_profile_writes_complete_json_table_and_plots(tmp_path):
    out, doc = run_bench(tmp_path, "--quick", "--preset", "pi05-tiny")
    assert doc["profile"] == "quick" and doc["settings"]["horizon"] == 10
    check_complete(doc, ["libero S10 N30 k1 uniform:1", "libero S10 N30 k5 uniform:1"], frames=50)
    unified = [r for r in doc["summary"] if r["mode"] == "unified"]
    assert {round(r["decode_batch_mean"]) for r in unified} >= {29}  # N/k frames of requests in flight at k=1
    md = (out / "results.md").read_text()
    assert "| point | mode |" in md and "unified" in md and "| target |" in md
    assert sorted(doc["plots"]) == ["hz_vs_toks.png", "speedup_vs_n.png", "stages.png"]
    for name in doc["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # every measured stage beside its roofline floor on this (probed) CPU: the "% of limit"
    lim = doc["limits"]
    assert lim["device"] == "this CPU" and lim["format"] == "fp32"
    for key in ("libero S10 N30 k1 uniform:1", "libero S10 N30 k5 uniform:1"):
        stages = {r["stage"] for r in lim["points"][key]}
        assert {"vision", "prefill", "denoise ×10", "decode + head"} <= stages, stages
        for r in lim["points"][key]:
            assert r["floor_s"] > 0 and r["measured_s"] > 0 and r["bound"] in ("memory", "compute")
            assert r["pct_of_limit"] == pytest.approx(100 * r["floor_s"] / r["measured_s"])
    assert "% of limit on this CPU" in md and "| point | stage | batch | measured ms | floor ms |" in md


def test_arrival_patterns_and_layouts_are_complete(tmp_path):
    args = [
        "--preset",
        "pi05-tiny",
        "--layouts",
        "droid",
        "aloha",
        "--tokens",
        "4",
        "--k",
        "2",
        "--frames",
        "3",
        "--arrivals",
        "poisson:1.5",
        "mix:1",
        "uniform:0.5",
        "--no-plots",
        "--steps",
        "2",
    ]
    _, doc = run_bench(tmp_path, *args)
    keys = [f"{lay} S2 N4 k2 {a}" for lay in ("droid", "aloha") for a in ("poisson:1.5", "mix:1", "uniform:0.5")]
    check_complete(doc, keys, frames=3)
    assert doc["plots"] == []


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("OXYGEN_BENCH_FULL_QUICK") != "1", reason="set OXYGEN_BENCH_FULL_QUICK=1")
def test_quick_profile_default_preset(tmp_path):
    _, doc = run_bench(tmp_path, "--quick")
    assert doc["settings"]["preset"] == "pi05-small"
    check_complete(doc, ["libero S10 N30 k1 uniform:1", "libero S10 N30 k5 uniform:1"], frames=50)


def test_gpu_profile_fails_fast_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert bench.main(["--gpu", "--no-progress"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_arrival_schedules_are_seeded_and_honour_their_rates():
    assert arrival_schedule("uniform:0.25", 30, 8, 0) == [[], [], [], [30], [], [], [], [30]]
    assert arrival_schedule("uniform:2", 5, 3, 0) == [[5, 5]] * 3
    pois = arrival_schedule("poisson:1.5", 10, 4000, 3)
    assert pois == arrival_schedule("poisson:1.5", 10, 4000, 3)
    assert abs(sum(map(len, pois)) / 4000 - 1.5) < 0.1
    mix = [n for frame in arrival_schedule("mix:1", 30, 2000, 1) for n in frame]
    assert len(mix) == 2000 and min(mix) >= 15 and max(mix) <= 45 and abs(sum(mix) / len(mix) - 30) < 1.0
    for bad in ("burst:1", "uniform:0", "poisson:-1", "uniform:x"):
        with pytest.raises(ValueError):
            parse_arrival(bad)


def test_sweep_definitions():
    assert divisors(30) == [1, 2, 3, 5, 6, 10, 15, 30]
    pts = paper_sweep(horizon=10, frames=50, seed=0)
    nk = {(p.tokens, p.k) for p in pts if (p.layout, p.steps, p.arrival) == ("libero", 10, "uniform:1")}
    assert nk == {(n, k) for n in (5, 10, 15, 20, 30) for k in divisors(n)}
    assert {p.layout for p in pts} == {"libero", "droid", "aloha"} and {p.steps for p in pts} == {5, 10, 15, 20}
    assert {p.arrival.split(":")[0] for p in pts} == {"uniform", "poisson", "mix"}
    assert BenchPoint("libero", 10, 30, 1, "uniform:1", 10, 50).warmup == 30
    assert BenchPoint("libero", 10, 30, 5, "mix:1", 10, 50).warmup == 9


def test_compiled_points_leave_the_bookkeeping_split_and_efficiency_unmeasured():
    """A compiled step hides the decode forward from the probe (its time would count as
    bookkeeping) and the cost model prices eager forwards: those columns are '–' there and
    the bookkeeping / efficiency targets judge eager points only."""
    from oxygen_ros.bench.report import check_targets, markdown, summarize_mode

    frame = {
        "warmup": False,
        "T": 0.2,
        "tokens": 30,
        "overhead": 0.01,
        "build": 0.005,
        "sample": 0.002,
        "other": 0.003,
        "engine_bookkeeping": 0.004,
        "batches": [29],
        "latencies": [1.0],
        "ideal": 0.19,
        "transient": 0,
        "kv_peak_blocks": 4,
        "queued": 0,
        "decode_steps": 1,
        **{s: 0.01 for s in STAGES},
    }
    run = {"frames": [frame] * 3, "pool_bytes": 10, "rejected": 0, "errors": 0}
    rows, points = [], {}
    for comp in ("none", "default"):
        p = BenchPoint("libero", 10, 30, 1, "uniform:1", 10, 3, compile=comp).to_dict()
        points[p["key"]] = p
        rows.append(summarize_mode(p, "unified", run, 0, 1))
    eager, compiled = rows
    assert math.isclose(eager["overhead_pct"], 5.0) and math.isclose(eager["efficiency"], 0.95)
    assert compiled["overhead_pct"] is None and compiled["build_pct"] is None and compiled["efficiency"] is None
    assert compiled["ideal_ms"] is None and math.isclose(eager["ideal_ms"], 190.0)
    assert compiled["engine_bookkeeping_pct"] == eager["engine_bookkeeping_pct"]
    assert compiled["stages_ms"]["build"] == 0.0 and math.isclose(compiled["stages_ms"]["fwd_decode"], 20.0)
    assert math.isclose(eager["stages_ms"]["build"], 10.0) and math.isclose(eager["stages_ms"]["fwd_decode"], 10.0)
    targets = {t["target"]: t for t in check_targets(rows, points, gpu=False)}
    assert targets["bookkeeping <= 2 % of a frame at k = 1"]["at"] == eager["point"]
    assert targets["efficiency vs cost model >= 0.9 (unified)"]["at"] == eager["point"]
    doc = {
        "environment": {"device_name": "cpu", "torch_threads": 1, "loadavg_start": None},
        "frames_total": 6,
        "duration_s": 1.0,
        "settings": {"preset": "x", "dtype": "float32", "horizon": 10},
        "summary": rows,
        "targets": list(targets.values()),
    }
    assert "| – (–/–/–) |" in markdown(doc)


def test_compiled_points_say_which_stages_ran_compiled_and_every_recompile_or_fallback():
    """Under the table: each compiled (point, mode) lists its compiled stages, and a recompile after
    warm-up or an eager fallback is spelled out — a compiled figure measured on eager code says so."""
    from oxygen_ros.bench.report import compile_notes

    ok = {
        "point": "p compile:default",
        "mode": "unified",
        "compile_state": {"compiled_stages": "vision,prefill,denoise,decode", "graphs_decode": 3},
    }
    bad = {
        "point": "p compile:default",
        "mode": "isolated",
        "compile_state": {
            "compiled_stages": "vision,prefill,denoise",
            "graphs_decode": 5,
            "recompiles_decode": 3,
            "fallback_decode": "5 graphs exceed the budget of 4",
        },
    }
    eager = {"point": "p", "mode": "unified", "compile_state": {"compiled_stages": "none"}}
    lines = compile_notes([ok, bad, eager])
    assert lines[:2] == ["", "Compiled stages:"] and len(lines) == 4
    assert lines[2].endswith("compiled stages vision,prefill,denoise,decode; no recompile after warm-up")
    assert "decode recompiled 3x after warm-up" in lines[3] and "decode ran eager (5 graphs exceed" in lines[3]
    assert compile_notes([eager]) == []


def test_into_a_pipe_bench_draws_no_progress_bar(tmp_path):
    """stderr a pipe (a log, CI) and no --no-progress: the report, but not one tqdm frame."""
    out = tmp_path / "bench"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "oxygen_ros.bench.bench",
            "--preset",
            "pi05-tiny",
            "--layouts",
            "libero",
            "--tokens",
            "2",
            "--k",
            "2",
            "--steps",
            "1",
            "--frames",
            "1",
            "--modes",
            "unified",
            "--compile",
            "none",
            "--threads",
            "1",
            "--no-plots",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "results.json").is_file() and "bench: wrote " in r.stdout
    assert "\r" not in r.stderr and "frame/s" not in r.stderr and "it/s" not in r.stderr, r.stderr[-2000:]


def test_an_out_folder_with_files_is_refused_without_overwrite(tmp_path, capsys):
    out = tmp_path / "earlier"
    out.mkdir()
    (out / "results.json").write_text("{}")
    with pytest.raises(SystemExit) as done:
        bench.main(["--quick", "--out", str(out)])
    assert done.value.code == 2 and (out / "results.json").read_text() == "{}"
    err = capsys.readouterr().err
    assert f"bench: error: --out {out} already holds files" in err and "pass --overwrite" in err, err
    assert bench.parse_args(["--out", str(out), "--overwrite"]).overwrite
    (tmp_path / "empty").mkdir()
    assert bench.parse_args(["--out", str(tmp_path / "empty")]).out == tmp_path / "empty"  # new or empty: fine


def test_bench_overhead_times_the_engine_against_the_policy_path(tmp_path):
    from oxygen_ros.bench import overhead

    out = tmp_path / "overhead"
    assert overhead.main(["--preset", "pi05-tiny", "--repeats", "2", "--warmup", "1", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert len(res["samples"]["policy"]) == len(res["samples"]["engine"]) == 2 and res["ratio_engine_over_policy"] > 0
    assert {"vision_prefill", "denoise", "other", "total"} <= set(res["median_s"]["engine"])
    assert "engine ÷ policy" in (out / "results.md").read_text()
    padded = overhead.parse_args(["-p", "static_shapes=true"])
    assert padded.params == ["static_shapes=true"]
    with pytest.raises(SystemExit):
        overhead.parse_args(["-p", "no_such_field=1"])
    with pytest.raises(SystemExit):  # an earlier run's results are never overwritten silently
        overhead.parse_args(["--out", str(out)])


def test_weights_int8_runs_and_its_limits_use_int8_weight_bytes(tmp_path):
    args = ["--preset", "pi05-tiny", "--layouts", "libero", "--tokens", "2", "--k", "2", "--frames", "2"]
    args += ["--arrivals", "uniform:1", "--no-plots", "--steps", "2", "--modes", "unified", "--weights", "int8"]
    _, doc = run_bench(tmp_path, *args)
    assert doc["settings"]["weights"] == "int8" and doc["settings"]["dtype"] == "float32"
    assert doc["limits"]["format"] == "int8"
    assert all(r["action_hz"] > 0 for r in doc["summary"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--weights", "fp8", "--device", "cpu"], "weights='fp8' needs a CUDA device"),
        (["--weights", "bf16", "--dtype", "float32", "--device", "cpu"], "stores torch.bfloat16 weights"),
    ],
)
def test_weights_the_device_or_dtype_cannot_run_fail_fast(capsys, argv, message):
    assert bench.main([*argv, "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_weight_format_of_a_run():
    assert bench.weight_format("", True) == "fp32" and bench.weight_format("", False) == "bf16"
    assert bench.weight_format("bf16", False) == "bf16" and bench.weight_format("fp32", True) == "fp32"
    assert [bench.weight_format(f, True) for f in ("int8", "fp8", "int4")] == ["int8", "fp8", "int4"]
