"""``bench rtc``: one run times the denoise loop (off / elementwise / vjp) and the chunk latency
(RTC off / on) with warm-up excluded, every RTC chunk after the first guided, and writes a complete
JSON and table; no speed is asserted."""

import json
import math

import pytest
import torch

from oxygen_ros.bench import bench
from oxygen_ros.bench.rtc import CHUNK, DENOISE

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


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def run_rtc(tmp_path, *args, repeats=3, warmup=1):
    out = tmp_path / "rtc"
    rc = bench.main(["rtc", "--repeats", str(repeats), "--warmup", str(warmup), "--out", str(out), *args])
    assert rc == 0
    return out, json.loads((out / "results.json").read_text())


def check_complete(out, doc, repeats, warmup, preset="pi05-tiny"):
    """Every sample, median and ratio is present and finite; the guide was active; chunks guided."""
    st = doc["settings"]
    assert doc["schema"] == "oxygen_ros.bench.rtc/1" and st["preset"] == preset
    assert ENV_KEYS <= set(doc["environment"])
    for n in DENOISE:
        samples = doc["denoise"][n]
        assert len(samples) == repeats + warmup and sum(s["warmup"] for s in samples) == warmup
        assert all(s["s"] > 0 for s in samples)
        assert all(math.isfinite(v) and v > 0 for v in doc["summary"]["denoise"][n].values())
    for n in CHUNK:
        assert len(doc["chunk"][n]) == repeats + warmup
        r = doc["summary"]["chunk"][n]
        assert r["chunks"] == repeats and r["errors"] == 0 and r["median_ms"] > 0 and r["step_median_ms"] > 0
    s = doc["summary"]
    assert s["chunk"]["off"]["guided"] == 0 and s["chunk"]["rtc"]["guided"] == repeats
    # the RTC engine: only its very first chunk is unguided (no previous chunk)
    assert doc["handover_counts"]["rtc"] == {"first": 1, "guided": repeats + warmup - 1}
    assert doc["handover_counts"]["off"] == {}
    for q in (s["ratios"], s["paired_ratios"]):
        assert set(q) == {"denoise_elementwise", "denoise_vjp", "chunk_latency_rtc"}
        assert all(math.isfinite(v) and v > 0 for v in q.values())
    # the guide was active: the first d rows follow the leftover, the plain flow's do not
    err = doc["frozen_rows_err"]
    assert err["elementwise"] < 0.2 * err["off"] and err["vjp"] < 0.2 * err["off"]
    assert doc["leftover_rows"] == st["horizon"] - st["gap"]
    md = (out / "results.md").read_text()
    assert "| denoise (S steps" in md and "| chunk latency (obs → chunk)" in md
    assert f"| {repeats}/{repeats} |" in md


def test_rtc_bench_writes_complete_results(tmp_path):
    out, doc = run_rtc(tmp_path, "--threads", "1", "--device", "cpu")
    check_complete(out, doc, 3, 1)
    assert doc["settings"]["compile"] == "none" and doc["settings"]["dtype"] == "float32"
    assert doc["settings"]["rtc"]["execution_horizon"] == doc["settings"]["horizon"] == 10


@pytest.mark.slow
def test_rtc_bench_compiled(tmp_path):
    out, doc = run_rtc(tmp_path, "--threads", "1", "--device", "cpu", "--compile", "default", "--steps", "3")
    check_complete(out, doc, 3, 1)
    st = doc["compile_state"]
    assert "denoise" in st["rtc"]["compiled_stages"] and "denoise" in st["off"]["compiled_stages"]
    assert not any(k.startswith(("recompiles_", "fallback_")) for c in st.values() for k in c)
    assert "Compiled stages" in (out / "results.md").read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rtc_bench_on_cuda(tmp_path):
    out, doc = run_rtc(tmp_path, "--device", "cuda")
    check_complete(out, doc, 3, 1)
    assert doc["settings"]["dtype"] == "bfloat16" and doc["environment"]["device"].startswith("cuda")


def test_cuda_fails_fast_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert bench.main(["rtc", "--device", "cuda"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_bad_arguments_are_rejected():
    for bad in (["--repeats", "0"], ["--delay", "-1"], ["--compile", "fast"], ["--horizon", "1"]):
        with pytest.raises(SystemExit):
            bench.main(["rtc", *bad])
