"""``bench quant``: per weight format, the action error against fp32, greedy-token agreement and
paired stage times on the CPU (pi05-tiny, one repeat: a smoke run of the real code path)."""

from __future__ import annotations

import json

from oxygen_ros.bench import quant


def test_quant_on_the_cpu_measures_int8_and_refuses_fp8(tmp_path):
    argv = ["--preset", "pi05-tiny", "--device", "cpu", "--formats", "fp32", "int8", "fp8"]
    argv += ["--threads", "1", "--repeats", "1", "--warmup", "1", "--observations", "1", "--decode-steps", "4"]
    assert quant.main([*argv, "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    rows = {r["weights"]: r for r in doc["rows"]}
    assert list(rows) == ["fp32", "int8", "fp8"]  # the reference first
    assert doc["settings"]["reference"] == "fp32" and doc["settings"]["threads"] == 1
    ref, int8 = rows["fp32"], rows["int8"]
    for src in ("parity", "preset"):
        assert ref[src]["actions"]["max_abs"] == 0.0 and ref[src]["tokens"]["agreement"] == 1.0
        err = int8[src]["actions"]
        assert err["finite"] and 0.0 < err["mean_abs"] <= err["max_abs"] < 0.05
        assert int8[src]["tokens"]["steps"] == 4
    assert int8["weight_mb"] < ref["weight_mb"]  # int8 projections: a quarter of their fp32 bytes
    for stage in quant.STAGES:
        assert int8["speed"]["s"][stage] > 0 and int8["speed"]["ratio"][stage] > 0
        pct = int8["pct_of_limit"][stage]
        assert pct is not None and pct > 0
    assert "needs a CUDA device" not in rows["fp8"]["error"] and "float8" in rows["fp8"]["error"]
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("### bench quant — cpu") and "| fp8 | n/a: " in md and "| int8 | " in md
