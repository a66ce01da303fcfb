"""``bench schedules``: one run measures all four engines (serial / concurrent × with / without
language) with warm-up excluded and writes a complete JSON and table; no speed is asserted."""

import json
import math

import pytest
import torch

from oxygen_ros.bench import bench
from oxygen_ros.bench.schedule import ENGINES, ratios


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_schedules_bench_writes_complete_results(tmp_path):
    out = tmp_path / "s"
    rc = bench.main(
        ["schedules", "--preset", "pi05-tiny", "--tokens", "6", "--frames", "6", "--block", "3", "--out", str(out)]
    )
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    names = ["serial", "serial+language", "concurrent", "concurrent+language"]
    assert list(doc["rows"]) == names and len(ENGINES) == 4
    for n in names:
        frames = doc["frames"][n]
        assert sum(not f["warmup"] for f in frames) >= 6 and sum(f["warmup"] for f in frames) == 6 + 5
        r = doc["rows"][n]
        assert r["frames"] >= 6 and all(
            math.isfinite(r[k]) and r[k] > 0 for k in ("chunk_interval_ms", "chunk_latency_ms", "action_hz")
        )
        if n.endswith("+language"):
            # steady state: one request of N tokens per frame, k = 1 -> N tokens per frame
            assert r["tok_s"] > 0 and abs(r["tokens_per_frame"] - 6) < 1.5 and r["batcher_busy"] > 0
        else:
            assert r["tok_s"] == 0 and r["tokens_per_frame"] == 0
    q = doc["ratios"]
    assert set(q) >= {
        "serial_chunk_ratio",
        "concurrent_chunk_ratio",
        "tok_s_concurrent_over_serial",
        "target_chunk_ratio_met",
        "target_tok_s_met",
    }
    assert "chunk interval with ÷ without language" in (out / "results.md").read_text()
    assert doc["environment"]["loadavg_start"] is not None


def test_ratio_targets():
    rows = {n: {"chunk_interval_ms": 10.0, "chunk_latency_ms": 9.0, "tok_s": 0.0} for n in ("serial", "concurrent")}
    rows["serial+language"] = {"chunk_interval_ms": 13.0, "chunk_latency_ms": 9.0, "tok_s": 100.0}
    rows["concurrent+language"] = {"chunk_interval_ms": 11.0, "chunk_latency_ms": 10.0, "tok_s": 120.0}
    q = ratios(rows)
    assert q["concurrent_chunk_ratio"] == pytest.approx(1.1) and q["target_chunk_ratio_met"]
    assert q["tok_s_concurrent_over_serial"] == pytest.approx(1.2) and q["target_tok_s_met"]
    rows["concurrent+language"]["chunk_interval_ms"] = 12.0
    assert not ratios(rows)["target_chunk_ratio_met"]


def test_bad_arguments_are_rejected():
    with pytest.raises(SystemExit):
        bench.main(["schedules", "--k", "0"])
