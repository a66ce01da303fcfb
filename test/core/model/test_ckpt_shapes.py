"""Loader errors and dimensions from tensor shapes (core/model/ckpt_shapes.py, ckpt_files.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from oxygen_ros.core.config import get_preset
from oxygen_ros.core.model.ckpt_files import checkpoint_folder
from oxygen_ros.core.model.ckpt_shapes import config_from_shapes
from oxygen_ros.core.model.keymap import CheckpointError
from oxygen_ros.core.model.weights import checkpoint_shapes, load_pretrained, random_pretrained, save_pretrained
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.tokenizer import build_tokenizer
from oxygen_ros.core.types import NormStats, Observation

TINY = get_preset("pi05-tiny")


def stats(dim: int = 3) -> dict[str, NormStats]:
    return {"state": NormStats.identity(dim), "actions": NormStats.identity(dim)}


@pytest.fixture(scope="module")
def model():
    return random_pretrained(TINY, seed=5)


def as_variant_folder(folder: Path) -> None:
    """What LeRobot writes for a non-standard size: config.json naming the standard variants."""
    (folder / "oxygen_config.json").unlink()
    raw = json.loads((folder / "config.json").read_text())
    raw["paligemma_variant"], raw["action_expert_variant"] = "gemma_2b", "gemma_300m"
    (folder / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("layout", ["openpi", "lerobot"])
def test_shapes_override_variant_names(tmp_path, model, layout):
    save_pretrained(model, tmp_path, stats(), layout=layout)
    as_variant_folder(tmp_path)
    with pytest.raises(CheckpointError) as e:
        load_pretrained(tmp_path)
    assert "vision.num_heads" in str(e.value) and len(str(e.value)) < 500
    (tmp_path / "oxygen_config.json").write_text('{"vision": {"num_heads": 2}}')
    loaded, cfg, _, info = load_pretrained(tmp_path)
    assert (cfg.vision, cfg.vlm, cfg.expert, cfg.vocab_size) == (TINY.vision, TINY.vlm, TINY.expert, TINY.vocab_size)
    assert info.config_source == "config.json+oxygen_config.json"
    assert (
        "vlm.width: 2048 -> 64" in info.derived_from_shapes and "vision.num_heads: 16 -> 2" in info.derived_from_shapes
    )
    sd = model.state_dict()
    assert all(torch.equal(v, sd[k]) for k, v in loaded.state_dict().items())


def test_shapes_of_the_full_model_change_nothing():
    full = get_preset("pi05")
    cfg, changes, unresolved = config_from_shapes(full, checkpoint_shapes(full, "lerobot"), "lerobot")
    assert cfg == full and changes == [] and unresolved == []


def test_partial_oxygen_config_unknown_key_named(tmp_path, model):
    save_pretrained(model, tmp_path, stats(), layout="lerobot")
    as_variant_folder(tmp_path)
    (tmp_path / "oxygen_config.json").write_text('{"vision": {"heads": 2}}')
    with pytest.raises(CheckpointError, match=r"oxygen_config.json.vision: unknown key 'heads'"):
        load_pretrained(tmp_path)


def test_nonexistent_path_says_so(tmp_path):
    missing = tmp_path / "no_such_ckpt"
    for call in (lambda: load_pretrained(missing), lambda: Pi05Policy.from_pretrained(str(missing), device="cpu")):
        with pytest.raises(CheckpointError, match="does not exist") as e:
            call()
        assert "unknown model preset" not in str(e.value)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="is a file"):
        checkpoint_folder(tmp_path / "file")
    assert checkpoint_folder("pi05-tiny") is None and checkpoint_folder(tmp_path) == tmp_path


@pytest.mark.parametrize(
    "layout, expected",
    [
        ("openpi", "assets/<asset_id>/norm_stats.json"),
        ("lerobot", "policy_postprocessor_step_0_unnormalizer_processor.safetensors"),
    ],
)
def test_missing_norm_stats_name_the_files(tmp_path, model, layout, expected):
    save_pretrained(model, tmp_path, {}, layout=layout, tokenizer=build_tokenizer(TINY.vocab_size))
    with pytest.raises(CheckpointError) as e:
        Pi05Policy.from_pretrained(tmp_path, device="cpu")
    msg = str(e.value)
    assert expected in msg and "state and actions" in msg and "norm_stats" in msg
    if layout == "lerobot":
        assert "policy_preprocessor.json" in msg


def test_bf16_keeps_siglip_embeddings_fp32(tmp_path, model):
    save_pretrained(model, tmp_path, stats(), layout="openpi", tokenizer=build_tokenizer(TINY.vocab_size))
    pol16 = Pi05Policy.from_pretrained(tmp_path, device="cpu", dtype=torch.bfloat16)
    pol32 = Pi05Policy.from_pretrained(tmp_path, device="cpu")
    dt = {n: p.dtype for n, p in pol16.model.named_parameters()}
    fp32 = [n for n, d in dt.items() if "embeddings." in n and d == torch.float32]
    assert any("patch_embedding.weight" in n for n in fp32) and any("position_embedding.weight" in n for n in fp32)
    assert dt[next(n for n in dt if "encoder.layers.0.self_attn.q_proj.weight" in n)] == torch.bfloat16
    rng = np.random.default_rng(0)
    obs = Observation(
        images={"base_0_rgb": rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)},
        state=np.zeros(3, np.float32),
        instruction="pick",
    )
    noise = torch.randn(1, TINY.action_horizon, TINY.action_dim, generator=torch.Generator().manual_seed(0))
    a16, a32 = pol16.sample_actions(obs, noise=noise), pol32.sample_actions(obs, noise=noise)
    assert np.isfinite(a16).all() and np.abs(a16 - a32).max() < 0.1
