"""Tests for oxygen_ros.core.model.weights / keymap / ckpt_files (CPU, pi05-tiny unless stated)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from oxygen_ros.core.config import get_preset
from oxygen_ros.core.model import ckpt_config as cc
from oxygen_ros.core.model import ckpt_files as cf
from oxygen_ros.core.model.keymap import (
    EMBED_KEY,
    EXPERT_LM_HEAD_KEY,
    LM_HEAD_KEY,
    CheckpointError,
    ckpt_to_own,
    detect_layout,
    own_to_ckpt,
)
from oxygen_ros.core.model.kv import DenseKVCache
from oxygen_ros.core.model.pi05 import Pi05Model
from oxygen_ros.core.model.weights import (
    checkpoint_shapes,
    count_parameters,
    load_pretrained,
    plan_load,
    random_pretrained,
    save_pretrained,
)
from oxygen_ros.core.types import NormStats

CFG = get_preset("pi05-tiny")
VISION_PATCH = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight"


def stats() -> dict[str, NormStats]:
    return {
        "state": NormStats.from_dict({"mean": [0.1, 0.2], "std": [1.0, 2.0], "q01": [-1, 0], "q99": [1, 2]}),
        "actions": NormStats.from_dict({"q01": [-1, 0, 1], "q99": [1, 2, 3.5]}),
    }


def outputs(m: Pi05Model, seed: int = 0) -> list[torch.Tensor]:
    """A few numeric outputs: joint velocity, prefill logits, cached 3-step actions."""
    g = torch.Generator().manual_seed(seed)
    s = CFG.vision.image_size
    pix = torch.rand(2, 3, 3, s, s, generator=g) * 2 - 1
    im = torch.tensor([[True, False, True], [True, True, True]])
    tok = torch.randint(0, CFG.vocab_size, (2, 12), generator=g)
    tm = torch.ones(2, 12, dtype=torch.bool)
    tm[0, 9:] = False
    x = torch.randn(2, CFG.action_horizon, CFG.action_dim, generator=g)
    dev = m.device
    pix, im, tok, tm, x = (t.to(dev) for t in (pix, im, tok, tm, x))
    with torch.no_grad():
        emb, valid = m.embed_prefix(pix, im, tok, tm)
        v = m.forward_joint(emb, valid, x, torch.tensor([0.3, 0.9], device=dev))
        cache = DenseKVCache(
            CFG.vlm.depth, 2, valid.shape[1] + 4, CFG.vlm.num_kv_heads, CFG.vlm.head_dim, dtype=m.dtype, device=dev
        )
        logits = m.logits(m.prefill(emb, valid, cache.prefill_view(valid)))
        acts = m.sample_actions(cache.denoise_view(CFG.action_horizon), x, 3)
    return [v, logits, acts]


def same_state(a: Pi05Model, b: Pi05Model) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def rewrite(folder: Path, edit) -> None:
    """Apply ``edit(dict)`` to the folder's model.safetensors."""
    sd = load_file(str(folder / "model.safetensors"))
    edit(sd)
    save_file(sd, str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def model() -> Pi05Model:
    return random_pretrained(CFG, seed=3)


@pytest.fixture(params=["openpi", "lerobot"])
def saved(request, model, tmp_path) -> tuple[Path, str]:
    save_pretrained(model, tmp_path / "ckpt", stats(), layout=request.param)
    return tmp_path / "ckpt", request.param


@pytest.fixture
def saved_openpi(model, tmp_path) -> Path:
    """One layout is enough where the code path after key mapping is shared."""
    return save_pretrained(model, tmp_path / "ckpt", stats(), layout="openpi")


# ------------------------------------------------------------------------------------ round trip
def test_round_trip_exact(model, saved):
    folder, layout = saved
    loaded, cfg, ns, info = load_pretrained(folder)
    assert cfg == CFG and info.layout == layout and info.config_source == "oxygen_config.json"
    same_state(model, loaded)
    for a, b in zip(outputs(model), outputs(loaded)):
        assert torch.equal(a, b)
    for name, ref in stats().items():
        for s in ("mean", "std", "q01", "q99"):
            np.testing.assert_array_equal(getattr(ns[name], s), getattr(ref, s))
    assert not loaded.training
    # saving the loaded model again gives the same tensors
    save_pretrained(loaded, folder.parent / "again", ns, layout=layout)
    a = load_file(str(folder / "model.safetensors"))
    b = load_file(str(folder.parent / "again" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_file_layouts(saved):
    folder, layout = saved
    keys = set(load_file(str(folder / "model.safetensors")))
    pre = "model." if layout == "lerobot" else ""
    assert pre + EMBED_KEY in keys and pre + LM_HEAD_KEY not in keys  # tied head written once
    heads = ("action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out")
    for k in keys:
        rest = k[len(pre) :]
        assert k.startswith(pre) and (rest.startswith("paligemma_with_expert.") or rest.split(".")[0] in heads), k
    raw = json.loads((folder / "config.json").read_text())
    if layout == "openpi":
        assert (folder / "assets/robot/norm_stats.json").is_file()
        assert set(json.loads((folder / "assets/robot/norm_stats.json").read_text())["norm_stats"]) == {
            "state",
            "actions",
        }
        assert raw["action_horizon"] == CFG.action_horizon
    else:
        pre_cfg = json.loads((folder / "policy_preprocessor.json").read_text())
        assert pre_cfg["steps"][2]["registry_name"] == "normalizer_processor"
        flat = load_file(str(folder / pre_cfg["steps"][2]["state_file"]))
        assert {"observation.state.q01", "action.q99"} <= set(flat)
        assert raw["type"] == "pi05" and raw["chunk_size"] == CFG.action_horizon


def test_meta_load_equals_normal_build(model, saved_openpi):
    folder = saved_openpi
    normal = Pi05Model(CFG)
    normal.load_state_dict(model.state_dict())
    normal.eval()
    loaded = load_pretrained(folder)[0]
    assert torch.equal(loaded.runner.rotary.inv_freq, normal.runner.rotary.inv_freq)
    assert loaded.runner.rotary.inv_freq.dtype == torch.float32
    emb_l = (
        loaded.vision.tower.vision_model.embeddings
        if hasattr(loaded.vision.tower, "vision_model")
        else loaded.vision.tower.embeddings
    )
    emb_n = (
        normal.vision.tower.vision_model.embeddings
        if hasattr(normal.vision.tower, "vision_model")
        else normal.vision.tower.embeddings
    )
    assert torch.equal(emb_l.position_ids, emb_n.position_ids)
    assert not any(t.is_meta for t in [*loaded.parameters(), *loaded.buffers()])
    for a, b in zip(outputs(normal), outputs(loaded)):
        assert torch.equal(a, b)


def test_bf16_policy_keeps_norms_fp32_and_runs(model, saved_openpi):
    folder = saved_openpi
    loaded, _, _, info = load_pretrained(folder, dtype=torch.bfloat16)
    dt = {n: p.dtype for n, p in loaded.named_parameters()}
    assert dt["vlm.layers.0.self_attn.q_proj.weight"] == torch.bfloat16
    assert dt["vlm.layers.0.input_layernorm.weight"] == torch.float32
    assert dt["expert.layers.1.post_attention_layernorm.dense.weight"] == torch.float32
    assert dt["expert.norm.dense.bias"] == torch.float32 and dt["vlm.norm.weight"] == torch.float32
    assert set(info.dtypes) == {"torch.bfloat16", "torch.float32"}
    for a, b in zip(outputs(model), outputs(loaded)):
        assert torch.isfinite(b).all() and (a - b).abs().max() < 0.1


# ------------------------------------------------------------------------------------ strictness
def test_missing_key_named(saved):
    folder, layout = saved
    pre = "model." if layout == "lerobot" else ""
    key = pre + "paligemma_with_expert.gemma_expert.model.layers.1.mlp.up_proj.weight"
    rewrite(folder, lambda sd: sd.pop(key))
    with pytest.raises(CheckpointError, match=r"missing keys \(1\).*layers\.1\.mlp\.up_proj\.weight \[64, 32\]"):
        load_pretrained(folder)


def test_unexpected_key_named(saved):
    folder, layout = saved
    pre = "model." if layout == "lerobot" else ""
    rewrite(folder, lambda sd: sd.update({pre + "paligemma_with_expert.foo.bar": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"unexpected keys \(1\).*paligemma_with_expert\.foo\.bar \[3\]"):
        load_pretrained(folder)


def test_wrong_shape_named(saved):
    folder, layout = saved
    key = ("model." if layout == "lerobot" else "") + "action_in_proj.weight"
    rewrite(folder, lambda sd: sd.update({key: torch.zeros(32, 16)}))
    with pytest.raises(
        CheckpointError, match=r"wrong shapes.*action_in_proj\.weight: file \[32, 16\] vs model \[32, 32\]"
    ):
        load_pretrained(folder)


def test_foreign_prefix_rejected(tmp_path):
    save_file({"encoder.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="encoder.weight"):
        load_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_pretrained(tmp_path / "nope")


# ------------------------------------------------------------------------------------ tied / skipped
def test_tied_head_restores_embedding(model, saved):
    folder, layout = saved
    pre = "model." if layout == "lerobot" else ""
    rewrite(folder, lambda sd: sd.update({pre + LM_HEAD_KEY: sd.pop(pre + EMBED_KEY)}))
    loaded, _, _, info = load_pretrained(folder)
    assert info.restored_keys == ["vlm.embed_tokens.weight"]
    same_state(model, loaded)


def test_head_absent_and_both_present(model, saved):
    folder, layout = saved
    pre = "model." if layout == "lerobot" else ""
    rewrite(folder, lambda sd: sd.update({pre + LM_HEAD_KEY: sd[pre + EMBED_KEY].clone()}))
    loaded, _, _, info = load_pretrained(folder)  # both present and equal
    assert info.restored_keys == []
    same_state(model, loaded)
    rewrite(folder, lambda sd: sd.update({pre + LM_HEAD_KEY: sd[pre + LM_HEAD_KEY] + 1}))
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        load_pretrained(folder)
    rewrite(folder, lambda sd: [sd.pop(pre + LM_HEAD_KEY), sd.pop(pre + EMBED_KEY)])
    with pytest.raises(CheckpointError, match="missing keys.*embed_tokens.weight"):
        load_pretrained(folder)


def test_expert_lm_head_skipped(model, saved):
    folder, layout = saved
    pre = "model." if layout == "lerobot" else ""
    head = torch.zeros(CFG.vocab_size, CFG.expert.width)
    rewrite(folder, lambda sd: sd.update({pre + EXPERT_LM_HEAD_KEY: head}))
    loaded, _, _, info = load_pretrained(folder)
    assert info.skipped_keys == [pre + EXPERT_LM_HEAD_KEY]
    same_state(model, loaded)


# ------------------------------------------------------------------------------------ vision level, shards
def test_vision_level_mapping_both_ways():
    ck = VISION_PATCH
    assert ckpt_to_own(ck, "openpi", True) == "vision.tower.vision_model.embeddings.patch_embedding.weight"
    assert ckpt_to_own(ck, "openpi", False) == "vision.tower.embeddings.patch_embedding.weight"
    stripped = ck.replace("vision_model.", "")
    assert ckpt_to_own(stripped, "openpi", False) == "vision.tower.embeddings.patch_embedding.weight"
    assert ckpt_to_own("model." + ck, "lerobot", True).startswith("vision.tower.vision_model.")
    assert own_to_ckpt("vision.tower.embeddings.patch_embedding.weight") == ck
    assert own_to_ckpt("vision.tower.vision_model.embeddings.patch_embedding.weight", "lerobot") == "model." + ck
    # a model without the level plans the same checkpoint
    expected = {
        k.replace("vision.tower.vision_model.", "vision.tower."): tuple(v.shape)
        for k, v in Pi05Model(CFG).state_dict().items()
    }
    found = {own_to_ckpt(k): s for k, s in expected.items()}
    plan = plan_load(expected, found, "openpi")[0]
    assert plan["vision.tower.embeddings.patch_embedding.weight"] == ck


def test_checkpoint_without_vision_level_loads(model, tmp_path):
    save_pretrained(model, tmp_path, {}, layout="openpi")
    rewrite(
        tmp_path,
        lambda sd: sd.update(
            {
                k.replace("vision_tower.vision_model.", "vision_tower."): sd.pop(k)
                for k in list(sd)
                if "vision_tower." in k
            }
        ),
    )
    same_state(model, load_pretrained(tmp_path)[0])


def test_sharded_index(model, tmp_path):
    save_pretrained(model, tmp_path, stats(), layout="lerobot")
    sd = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    keys = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, ks in shards.items():
        save_file({k: sd[k] for k in ks}, str(tmp_path / name))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: n for n, ks in shards.items() for k in ks}})
    )
    same_state(model, load_pretrained(tmp_path)[0])


# ------------------------------------------------------------------------------------ configs / stats
def test_config_derived_from_layout_json(tmp_path, model):
    save_pretrained(model, tmp_path, stats(), layout="openpi")
    (tmp_path / "oxygen_config.json").unlink()
    with pytest.raises(CheckpointError, match="paligemma_variant='oxygen:pi05-tiny'"):
        load_pretrained(tmp_path)
    full = get_preset("pi05")
    raw = cc.openpi_config_json(full.replace(action_horizon=10), "bfloat16")
    assert raw["paligemma_variant"] == "gemma_2b" and raw["action_expert_variant"] == "gemma_300m"
    assert cc.config_from_openpi(raw) == full.replace(action_horizon=10)
    lr = cc.lerobot_config_json(
        full.replace(action_horizon=16, num_denoise_steps=5, max_token_len=48), stats(), "float32"
    )
    assert (lr["chunk_size"], lr["num_inference_steps"], lr["tokenizer_max_length"]) == (16, 5, 48)
    assert cc.config_from_lerobot(lr) == full.replace(action_horizon=16, num_denoise_steps=5, max_token_len=48)
    assert lr["input_features"]["observation.state"]["shape"] == [2]
    assert lr["output_features"]["action"]["shape"] == [3]
    with pytest.raises(CheckpointError, match="type='act'"):
        cc.config_from_lerobot({"type": "act"})
    with pytest.raises(CheckpointError, match="pi05=false"):
        cc.config_from_openpi({"pi05": False})


def test_lerobot_stats_extra_entries_ignored(tmp_path, model):
    save_pretrained(model, tmp_path, stats(), layout="lerobot")
    path = tmp_path / cf.PRE_STATS
    flat = load_file(str(path))
    flat.update(
        {
            "observation.state.min": torch.zeros(2),
            "observation.state.count": torch.tensor([5.0]),
            "observation.images.base_0_rgb.mean": torch.zeros(3, 1, 1),
        }
    )
    save_file(flat, str(path))
    _, _, ns, info = load_pretrained(tmp_path)
    assert set(ns) == {"state", "actions"} and ns["state"].dim == 2
    assert info.norm_info["norm_map"]["STATE"] == "QUANTILES"
    # declared state file missing -> error naming it
    path.unlink()
    with pytest.raises(CheckpointError, match="normalizer_processor state_file"):
        load_pretrained(tmp_path)


def test_openpi_asset_selection(tmp_path, model):
    save_pretrained(model, tmp_path, stats(), layout="openpi", asset_id="org/task_a")
    _, _, ns, info = load_pretrained(tmp_path)
    assert info.asset_id == "org/task_a" and set(ns) == {"state", "actions"}
    cf.write_openpi_stats(tmp_path, stats(), "other")
    with pytest.raises(CheckpointError, match="several norm stats"):
        load_pretrained(tmp_path)
    assert load_pretrained(tmp_path, asset_id="other")[3].asset_id == "other"
    with pytest.raises(CheckpointError, match="asset_id='nope'"):
        load_pretrained(tmp_path, asset_id="nope")


def test_base_checkpoint_without_stats(tmp_path, model):
    save_pretrained(model, tmp_path, {}, layout="lerobot")
    assert load_pretrained(tmp_path)[2] == {}


def test_tokenizer_saved(tmp_path, model):
    class Tok:
        def save_pretrained(self, folder: str) -> None:
            Path(folder, "tokenizer.model").write_bytes(b"x")

    save_pretrained(model, tmp_path, {}, tokenizer=Tok())
    assert (tmp_path / "tokenizer.model").is_file()


# ------------------------------------------------------------------------------------ random weights
def test_random_pretrained_deterministic_and_time_conditioned():
    a, b, c = random_pretrained(CFG, 7), random_pretrained(CFG, 7), random_pretrained(CFG, 8)
    same_state(a, b)
    assert not torch.equal(a.vlm.layers[0].mlp.up_proj.weight, c.vlm.layers[0].mlp.up_proj.weight)
    assert a.expert.layers[0].input_layernorm.dense.weight.abs().sum() > 0
    assert a.expert.norm.dense.bias.abs().sum() > 0 and a.vlm.norm.weight.abs().sum() > 0
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(1, 5, CFG.vlm.width, generator=g)
    x = torch.randn(1, CFG.action_horizon, CFG.action_dim, generator=g)
    valid = torch.ones(1, 5, dtype=torch.bool)
    with torch.no_grad():
        v1 = a.forward_joint(emb, valid, x, torch.tensor([0.2]))
        v2 = a.forward_joint(emb, valid, x, torch.tensor([0.8]))
    assert (v1 - v2).abs().max() > 1e-4  # the expert sees flow time through adaRMS


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_default_policy(model, saved_openpi):
    loaded, _, _, info = load_pretrained(saved_openpi, device="cuda")
    assert loaded.device.type == "cuda" and loaded.dtype == torch.bfloat16
    assert loaded.runner.rotary.inv_freq.device.type == "cuda"
    assert loaded.runner.rotary.inv_freq.dtype == torch.float32
    assert loaded.vlm.norm.weight.dtype == torch.float32
    for a, b in zip(outputs(model), outputs(loaded)):
        assert torch.isfinite(b).all() and (a - b.cpu()).abs().max() < 0.1


# ------------------------------------------------------------------------------------ full size
def test_full_pi05_on_meta_matches_lerobot_layout():
    cfg = get_preset("pi05")
    with torch.device("meta"):
        m = Pi05Model(cfg)
    n = count_parameters(m)
    print(f"pi05 parameters: {n / 1e9:.3f} B (openpi/LeRobot also hold a 0.263 B unused expert lm_head)")
    assert 3.2e9 < n < 3.8e9
    assert all(p.is_meta for p in m.parameters())
    shapes = checkpoint_shapes(cfg, "lerobot")
    p = "model.paligemma_with_expert."
    vlm, exp = p + "paligemma.model.language_model.", p + "gemma_expert.model."
    want = {
        vlm + "layers.0.self_attn.q_proj.weight": (2048, 2048),
        vlm + "layers.17.self_attn.k_proj.weight": (256, 2048),
        vlm + "layers.3.mlp.gate_proj.weight": (16384, 2048),
        vlm + "embed_tokens.weight": (257152, 2048),
        vlm + "norm.weight": (2048,),
        exp + "layers.0.self_attn.q_proj.weight": (2048, 1024),
        exp + "layers.0.self_attn.o_proj.weight": (1024, 2048),
        exp + "layers.5.input_layernorm.dense.weight": (3072, 1024),
        exp + "norm.dense.weight": (3072, 1024),
        exp + "norm.dense.bias": (3072,),
        "model." + VISION_PATCH: (1152, 3, 14, 14),
        p + "paligemma.model.vision_tower.vision_model.embeddings.position_embedding.weight": (256, 1152),
        p + "paligemma.model.vision_tower.vision_model.encoder.layers.26.mlp.fc1.weight": (4304, 1152),
        p + "paligemma.model.vision_tower.vision_model.post_layernorm.weight": (1152,),
        p + "paligemma.model.multi_modal_projector.linear.weight": (2048, 1152),
        "model.action_in_proj.weight": (1024, 32),
        "model.action_out_proj.weight": (32, 1024),
        "model.time_mlp_in.weight": (1024, 1024),
        "model.time_mlp_out.bias": (1024,),
    }
    for k, s in want.items():
        assert shapes[k] == s, k
    assert not any("encoder.layers.27." in k or "language_model.layers.18." in k for k in shapes)
    assert sum(np.prod(s) for s in shapes.values()) == n
    assert detect_layout(set(shapes)) == "lerobot"
    assert len(shapes) == len(set(shapes))
