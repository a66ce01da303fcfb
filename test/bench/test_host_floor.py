"""``bench --host-floor`` and the action-path profile of ``bench --gpu``: their code paths run on
the CPU with a tiny model (no speed asserted) and give complete, positive figures."""

import json
import math

from oxygen_ros.bench import bench
from oxygen_ros.bench.host_floor import BATCHES, count_ops, floor_policy, host_floor, markdown
from oxygen_ros.core.policy import Pi05Policy


def test_host_floor_rows_are_complete():
    tiny = Pi05Policy.from_pretrained("pi05-tiny", device="cpu")
    doc = host_floor(["none"], steps=2, reps=1, policy=tiny)
    (row,) = doc["rows"]
    for k in (
        ["vision_ms", "prefill_ms", "denoise_ms", "ops_per_denoise_step", "warmup_frame_s"]
        + [f"decode_b{b}_ms" for b in BATCHES]
        + [f"frame_b{b}_ms" for b in BATCHES]
    ):
        assert isinstance(row[k], (int, float)) and math.isfinite(row[k]) and row[k] > 0, k
    assert row["floor_ratio_b8"] == 1.0 and row["ops_per_decode_step_b8"] > 50
    assert "| none |" in markdown(doc)
    env = doc["environment"]
    assert env["device"] == "cpu" and len(env["loadavg_end"]) == 3 and "load average" in markdown(doc)


def test_floor_policy_has_pi05_depth():
    c = floor_policy().cfg
    assert (c.vision.num_layers, c.vlm.depth, c.expert.depth) == (27, 18, 18)


def test_count_ops_counts_kernels_not_views():
    import torch

    x = torch.randn(4, 4)
    assert count_ops(lambda: (x + 1).view(16).t().sum()) == 2  # add, sum; view and t are metadata


def test_gpu_profile_code_path_on_cpu(tmp_path):
    out = tmp_path / "b"
    rc = bench.main(
        [
            "--preset",
            "pi05-tiny",
            "--device",
            "cpu",
            "--layouts",
            "libero",
            "--steps",
            "2",
            "--tokens",
            "4",
            "--k",
            "1",
            "--frames",
            "2",
            "--action-cameras",
            "--compile",
            "none",
            "--threads",
            "1",
            "--out",
            str(out),
            "--no-progress",
            "--no-plots",
            "--modes",
            "isolated",
            "unified",
        ]
    )
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert [x["cameras"] for x in doc["action_path"]] == [1, 2, 3]
    assert all(x["ms"] > 0 and x["warmup_s"] > 0 for x in doc["action_path"])
    assert all("warmup_s" in r for r in doc["summary"])
    assert "action path ms" in (out / "results.md").read_text()
