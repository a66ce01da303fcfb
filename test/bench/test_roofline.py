"""``bench roofline``: parameter groups counted from the model, floors that scale with the weight
format, the frame arithmetic, and a command line that answers before torch is imported.

Expected full-π0.5 counts (openpi ``gemma_2b`` / ``gemma_300m``, SigLIP So400m/14 at 224 px):

* VLM layers: Gemma 2B is 2.506 B parameters with a 256 000 × 2048 = 524 M embedding, so
  ≈ 1.98 B without it — per layer q/o 2048² each, k/v 2048 × 256 each, the GeGLU MLP
  3 × 2048 × 16384, two norms: 110.1 M × 18 layers + the final norm = 1 981 884 416;
* expert: "Gemma 300M" is per layer q/o 1024 × 2048, k/v 1024 × 256, MLP 3 × 1024 × 4096:
  17.3 M × 18 = 311.4 M; π0.5's adaRMS adds a ``Linear(1024, 3 · 1024)`` to each of the
  2 · 18 + 1 norms: 116.5 M more (427.9 M in all);
* vision: So400m is ≈ 400 M without its pooling head (412.4 M here) + the 1152 → 2048 projector.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from oxygen_ros.bench import bench
from oxygen_ros.bench.roofline import (
    DEVICES,
    FORMATS,
    DeviceSpec,
    Workload,
    budget,
    classify,
    frame,
    model_param_count,
    param_groups,
    stage_work,
    stages,
)
from oxygen_ros.core.config import get_preset

REPO = Path(__file__).resolve().parents[2]
PI05 = get_preset("pi05")


@pytest.mark.parametrize("preset", ["pi05-tiny", "pi05-small", "pi05"])
def test_groups_add_up_to_the_model(preset: str) -> None:
    cfg = get_preset(preset)
    p = param_groups(cfg)
    assert p.total == model_param_count(cfg)
    assert 0 < p.expert_modulation < p.expert_layers
    # the tied embedding / LM head is exactly vocab × VLM width
    assert p.embedding == cfg.vocab_size * cfg.vlm.width


def test_an_unknown_parameter_is_not_silently_dropped() -> None:
    with pytest.raises(ValueError, match="no roofline group"):
        classify("new_head.weight")


def test_full_pi05_counts_match_gemma_2b_and_300m() -> None:
    p = param_groups(PI05)
    gemma_2b, gemma_2b_embedding = 2_506_172_416, 256_000 * 2048
    assert p.vlm_layers == pytest.approx(gemma_2b - gemma_2b_embedding, rel=0.02)
    assert p.vlm_layers == 18 * (2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 16384 + 2 * 2048) + 2048
    dense_expert = p.expert_layers - p.expert_modulation
    assert dense_expert == pytest.approx(300e6, rel=0.05)
    assert dense_expert == 18 * (2 * 1024 * 2048 + 2 * 1024 * 256 + 3 * 1024 * 4096)
    assert p.expert_modulation == (2 * 18 + 1) * (1024 * 3 * 1024 + 3 * 1024)
    assert p.vision == pytest.approx(400e6, rel=0.05)
    assert p.projections < 3e6


def test_issue_arithmetic_13_gb_per_action_path_5_gb_per_decode_step() -> None:
    w = Workload(cameras=3, prompt_tokens=200, steps=10)
    work = stage_work(PI05, w, "bf16")
    action_bytes = work["vision"][1] + work["prefill"][1] + 10 * work["denoise"][1]
    assert 12.5e9 < action_bytes < 14.5e9
    assert 4.8e9 < work["decode_b1"][1] < 5.3e9
    thor = next(d for d in DEVICES if "Thor" in d.name)
    assert frame(PI05, w, thor, "bf16").decode_b1_s >= 0.018


def test_int4_halves_the_weight_bytes_and_the_memory_floor_of_fp8() -> None:
    memory_only = DeviceSpec("bandwidth only", 100e9, {"bf16": 1e30})
    w = Workload()
    p = param_groups(PI05)
    fp8 = {c.stage: c for c in stages(PI05, w, memory_only, "fp8")}
    int4 = {c.stage: c for c in stages(PI05, w, memory_only, "int4")}
    expert_weights = p.expert_layers + p.projections
    assert fp8["denoise"].bytes - int4["denoise"].bytes == pytest.approx(0.5 * expert_weights)
    for stage in ("denoise", "decode_b1", "prefill"):
        assert fp8[stage].bound == int4[stage].bound == "memory"
        assert fp8[stage].flops == int4[stage].flops  # weight-only: the work does not change
        ratio = int4[stage].floor_s / fp8[stage].floor_s
        assert 0.5 < ratio < 0.53, (stage, ratio)  # bf16 K/V keeps it just above one half


def test_compute_bound_floor_uses_the_native_peak_or_bf16() -> None:
    slow = DeviceSpec("compute only", 1e30, {"bf16": 1e12, "fp8": 2e12})
    w = Workload()
    bf16, fp8, int4 = (stages(PI05, w, slow, f)[1] for f in ("bf16", "fp8", "int4"))
    assert bf16.stage == "prefill" and bf16.bound == "compute"
    assert bf16.floor_s == pytest.approx(bf16.flops / 1e12)
    assert fp8.floor_s == pytest.approx(bf16.floor_s / 2)  # native fp8 path
    assert int4.floor_s == pytest.approx(bf16.floor_s)  # no int4 path: widened to bf16


def test_frame_arithmetic_and_the_70_hz_budget() -> None:
    w = Workload(horizon=10, steps=10, tokens=30)
    for device in DEVICES:
        for fmt in FORMATS:
            f = frame(PI05, w, device, fmt)
            s = {c.stage: c.floor_s for c in f.stages}
            assert f.action_path_s == pytest.approx(s["vision"] + s["prefill"] + 10 * s["denoise"])
            assert f.action_path_s < f.frame_k1_s < f.frame_k5_s
            assert f.hz_k1 == pytest.approx(10 / f.frame_k1_s)
            assert f.hz_k5 == pytest.approx(10 / f.frame_k5_s)
            # 70 Hz at H = 10: a frame of at most 1/7 s, less the decode steps
            assert f.budget_k1_s == pytest.approx(1 / 7 - (f.frame_k1_s - f.action_path_s))
            assert f.budget_k5_s == pytest.approx(1 / 7 - (f.frame_k5_s - f.action_path_s))
    assert budget(70, 10, 0.0, 1) == pytest.approx(1 / 7)
    assert budget(70, 10, 0.01, 5) == pytest.approx(1 / 7 - 0.05)


_RUN = """
import json, sys
from oxygen_ros.bench.bench import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print('RESULT ' + json.dumps({'code': code, 'torch': 'torch' in sys.modules}), file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--help"], ["--no-such-flag"], ["--cameras", "0"]])
def test_help_and_bad_flags_answer_before_torch(args: list[str]) -> None:
    r = subprocess.run(
        [sys.executable, "-c", _RUN, "roofline", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    got = json.loads(next(x for x in r.stderr.splitlines() if x.startswith("RESULT "))[len("RESULT ") :])
    assert got["torch"] is False, r.stderr[-1000:]
    if args == ["--help"]:
        assert got["code"] in (0, None) and r.stdout.startswith("usage: bench roofline")
    else:
        assert got["code"] == 2 and "bench roofline: error: " in r.stderr


def test_cli_writes_json_with_every_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "roofline.json"
    assert bench.main(["roofline", "--preset", "pi05-tiny", "--cameras", "2", "--cpu", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    names = [d.name for d in DEVICES] + ["this CPU"]
    assert list(doc["devices"]) == names
    got = {(r["device"], r["format"]) for r in doc["predictions"]}
    assert got == {(n, f) for n in names for f in FORMATS}
    cpu = doc["devices"]["this CPU"]
    assert cpu["bandwidth"] > 1e8 and cpu["peaks"]["bf16"] > 1e8
    assert doc["params"]["total"] == model_param_count(get_preset("pi05-tiny"))
    assert doc["prefix_tokens"] == 2 * get_preset("pi05-tiny").vision.num_tokens + 200
    table = capsys.readouterr().out
    assert all(f"| {n} | {f} |" in table for n in names for f in FORMATS)


def test_against_floor_puts_each_measured_stage_beside_its_floor():
    from oxygen_ros.bench.roofline import DEVICES, Workload, against_floor, decode_work, stage_work
    from oxygen_ros.core.config import get_preset

    cfg = get_preset("pi05-small")
    w = Workload(cameras=2, prompt_tokens=30, horizon=10, steps=10, tokens=30, context=600)
    h200 = next(d for d in DEVICES if d.name == "H200")
    measured = [
        {"stage": "vision", "batch": None, "median": 0.010},
        {"stage": "prefill", "batch": None, "median": 0.020},
        {"stage": "denoise", "batch": None, "median": 0.050},
        {"stage": "decode", "batch": 4, "median": 0.004},
        {"stage": "head", "batch": 4, "median": 0.001},
        {"stage": "preprocess", "batch": None, "median": 0.003},  # not a model stage: no floor
    ]
    rows = {(r["stage"], r["batch"]): r for r in against_floor(cfg, h200, "bf16", w, measured)}
    assert set(rows) == {("vision", None), ("prefill", None), ("denoise ×10", None), ("decode + head", 4)}
    f, b = stage_work(cfg, w, "bf16")["denoise"]
    assert rows[("denoise ×10", None)]["floor_s"] == pytest.approx(
        max(10 * b / h200.bandwidth, 10 * f / h200.peak("bf16"))
    )
    df, db = decode_work(cfg, w, "bf16", 4)
    dec = rows[("decode + head", 4)]
    assert dec["measured_s"] == pytest.approx(0.005)  # the decode forward and the LM head of the batch
    assert dec["floor_s"] == pytest.approx(max(db / h200.bandwidth, df / h200.peak("bf16")))
    assert dec["pct_of_limit"] == pytest.approx(100 * dec["floor_s"] / 0.005)
    # an fp32 model moves twice the bytes of bf16 weights and activations
    f32 = {(r["stage"], r["batch"]): r for r in against_floor(cfg, h200, "fp32", w, measured)}
    assert f32[("prefill", None)]["floor_s"] >= rows[("prefill", None)]["floor_s"]
