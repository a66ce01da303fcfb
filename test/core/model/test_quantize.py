"""The ``weights`` load option (``core.model.quantize``): which layers torchao converts, what stays
float, how close a quantized π0.5 stays to the fp32 one, and the errors for formats a device cannot run.

Tolerances (pi05-tiny, random weights, one observation, fixed flow noise): int8 per-row weights keep the
normalised actions within 2e-3 of fp32 (measured 8e-5) and the LM-head logits within 5e-2 (measured
4e-3 on logits of magnitude ~7); the greedy tokens of a 12-token decode are the same.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from oxygen_ros.core.config import WEIGHT_FORMATS, ConfigError, EngineConfig, TaskConfig, get_preset
from oxygen_ros.core.loops.schedules import make_engine
from oxygen_ros.core.model.quantize import (
    INT4_GROUP_SIZE,
    WeightFormatError,
    is_quantized,
    quantizable_linears,
    quantize_weights,
    resolve_dtype,
)
from oxygen_ros.core.model.weights import random_pretrained
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.types import Observation

INT8_ACTION_ATOL = 2e-3
INT8_LOGIT_ATOL = 5e-2
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _observation(policy: Pi05Policy, seed: int = 0) -> Observation:
    rng = np.random.default_rng(seed)
    return Observation(
        images={s: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for s in policy.cfg.image_slots},
        state=rng.uniform(-1, 1, policy.normalizer.state_dim).astype(np.float32),
        instruction="pick up the red cube",
        stamp=0.0,
    )


def _noise(policy: Pi05Policy) -> torch.Tensor:
    return torch.randn(1, policy.cfg.action_horizon, policy.cfg.action_dim, generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def fp32() -> Pi05Policy:
    return Pi05Policy.from_pretrained("pi05-tiny", device="cpu")


@pytest.fixture(scope="module")
def int8() -> Pi05Policy:
    return Pi05Policy.from_pretrained("pi05-tiny", device="cpu", weights="int8")


def test_quantizable_layers_are_the_gemma_projections_only():
    model = random_pretrained(get_preset("pi05-tiny"))
    names = quantizable_linears(model)
    cfg = model.cfg
    assert len(names) == len(PROJECTIONS) * (cfg.vlm.depth + cfg.expert.depth)
    assert {n.split(".")[0] for n in names} == {"vlm", "expert"}
    assert {n.rsplit(".", 1)[1] for n in names} == set(PROJECTIONS)
    kept = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in names]
    for must_stay in ("action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out", "vision.projector"):
        assert must_stay in kept
    assert any(n.endswith("input_layernorm.dense") for n in kept)  # adaRMS norms of the expert
    assert any(n.startswith("vision.tower.") for n in kept)  # SigLIP stays float


def test_int8_converts_exactly_those_layers(int8):
    model = int8.model
    names = set(quantizable_linears(model))
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            assert is_quantized(mod) == (name in names), name
    assert type(model.vlm.embed_tokens.weight) is nn.Parameter  # embedding = tied LM head, float
    assert model.vlm.embed_tokens.weight.dtype == torch.float32
    assert model.dtype == torch.float32  # activations and the K/V cache keep the model dtype
    assert type(model.vlm.layer(0).self_attn.q_proj.weight).__name__ == "Int8Tensor"


def test_int8_actions_and_logits_close_to_fp32(fp32, int8):
    obs, noise = _observation(fp32), _noise(fp32)
    a32 = fp32.sample_actions(obs, noise=noise.clone(), normalized=True)
    a8 = int8.sample_actions(obs, noise=noise.clone(), normalized=True)
    assert np.isfinite(a8).all()
    err = float(np.abs(a8 - a32).max())
    assert 0 < err <= INT8_ACTION_ATOL  # changed (the weights are int8) but close
    enc = fp32.encode_observation(obs)
    with torch.inference_mode():
        l32 = fp32.model.logits(fp32.prefill(enc)[1])
        l8 = int8.model.logits(int8.prefill(enc)[1])
    assert torch.isfinite(l8).all()
    assert float((l8 - l32).abs().max()) <= INT8_LOGIT_ATOL
    assert fp32.generate_text(obs, max_new_tokens=12).token_ids == int8.generate_text(obs, max_new_tokens=12).token_ids


def _engine_chunks(policy: Pi05Policy, compile_mode: str, frames: int) -> list[np.ndarray]:
    task = TaskConfig("conversation", "Q: {text} A: ", max_new_tokens=4)
    cfg = EngineConfig(tasks=(task,), tokens_per_frame=2, num_denoise_steps=3, compile=compile_mode)
    eng = make_engine(policy, cfg)
    chunks = []
    try:
        eng.submit_request("conversation", "what do you see?")
        for f in range(frames):
            eng.submit_observation(_observation(policy, f))
            r = eng.step()
            assert not r.error, r.error
            chunks.append(r.action.actions)
        eng.check_invariants()
    finally:
        eng.close()
    return chunks


def test_int8_runs_in_the_engine_eagerly(int8):
    chunks = _engine_chunks(int8, "none", 4)
    assert len(chunks) == 4 and all(np.isfinite(c).all() for c in chunks)


@pytest.mark.slow
def test_int8_compiled_matches_int8_eager(int8):
    """torch.compile (``compile: default``) traces torchao's Int8Tensor: same chunks as eager."""
    eager = _engine_chunks(int8, "none", 2)
    compiled = _engine_chunks(int8, "default", 2)
    for a, b in zip(eager, compiled):
        np.testing.assert_allclose(b, a, atol=1e-3, rtol=0)


def test_default_and_fp32_are_bit_identical_to_the_unquantized_build(fp32):
    """``weights`` unset / ``""`` / ``fp32`` on a CPU: the same tensors and the same actions as the
    construction before the option existed (random weights, fp32, no torchao)."""
    cfg = get_preset("pi05-tiny")
    before = Pi05Policy(random_pretrained(cfg), fp32.tokenizer, fp32.norm_stats)
    again = Pi05Policy.from_pretrained("pi05-tiny", device="cpu", weights="fp32")
    for policy in (fp32, again):
        ref = before.model.state_dict()
        got = policy.model.state_dict()
        assert ref.keys() == got.keys()
        assert all(type(got[k]) is torch.Tensor and torch.equal(got[k], ref[k]) for k in ref)
    obs, noise = _observation(fp32), _noise(fp32)
    want = before.sample_actions(obs, noise=noise.clone())
    assert np.array_equal(fp32.sample_actions(obs, noise=noise.clone()), want)
    assert np.array_equal(again.sample_actions(obs, noise=noise.clone()), want)


def test_bf16_is_an_unquantized_bf16_model():
    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cpu", weights="bf16")
    assert policy.model.dtype == torch.bfloat16
    assert not any(is_quantized(m) for m in policy.model.modules())
    a = policy.sample_actions(_observation(policy), noise=_noise(policy))
    assert np.isfinite(a).all()


@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_cuda_only_formats_refuse_the_cpu_clearly(fmt):
    with pytest.raises(WeightFormatError, match=f"weights='{fmt}' needs a CUDA device.*on a CPU use int8") as e:
        Pi05Policy.from_pretrained("pi05-tiny", device="cpu", weights=fmt)
    assert isinstance(e.value, ConfigError)
    with pytest.raises(WeightFormatError, match="needs a CUDA device"):
        quantize_weights(random_pretrained(get_preset("pi05-tiny")), fmt)


@pytest.mark.parametrize("fmt", ["int3", "INT8", "float8", "none"])
def test_unknown_format_names_the_allowed_values(fmt):
    with pytest.raises(WeightFormatError, match="allowed: " + ", ".join(WEIGHT_FORMATS)):
        Pi05Policy.from_pretrained("pi05-tiny", device="cpu", weights=fmt)


def test_resolve_dtype():
    cpu = torch.device("cpu")
    assert resolve_dtype("", None, cpu) is None
    assert resolve_dtype("int8", None, cpu) is None
    assert resolve_dtype("int8", torch.bfloat16, cpu) is torch.bfloat16
    assert resolve_dtype("bf16", None, cpu) is torch.bfloat16
    assert resolve_dtype("fp32", torch.float32, cpu) is torch.float32
    with pytest.raises(WeightFormatError, match="stores torch.bfloat16 weights but dtype is torch.float32"):
        resolve_dtype("bf16", torch.float32, cpu)
    assert resolve_dtype("int4", None, "cuda") is torch.bfloat16
    with pytest.raises(WeightFormatError, match="int4"):
        resolve_dtype("int4", torch.float32, "cuda")


def test_float_formats_change_nothing_in_place():
    model = random_pretrained(get_preset("pi05-tiny"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert quantize_weights(model, "fp32") == [] and quantize_weights(model, "") == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_cuda_formats_close_to_bf16(fmt):
    """fp8 (Float8Tensor, per-row e4m3), int8 and int4 (tinygemm, groups of 128) on pi05-small in bf16:
    the converted layers, finite actions within 0.25 of the bf16 model's normalised actions."""
    ref = Pi05Policy.from_pretrained("pi05-small", device="cuda")
    q = Pi05Policy.from_pretrained("pi05-small", device="cuda", weights=fmt)
    names = set(quantizable_linears(q.model))
    assert all(is_quantized(m) == (n in names) for n, m in q.model.named_modules() if isinstance(m, nn.Linear))
    obs, noise = _observation(ref), _noise(ref)
    a_ref = ref.sample_actions(obs, noise=noise.clone(), normalized=True)
    a_q = q.sample_actions(obs, noise=noise.clone(), normalized=True)
    assert np.isfinite(a_q).all()
    assert float(np.abs(a_q - a_ref).max()) <= 0.25


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_int4_refuses_widths_that_do_not_divide_by_the_group():
    with pytest.raises(WeightFormatError, match=f"groups {INT4_GROUP_SIZE} input features"):
        Pi05Policy.from_pretrained("pi05-tiny", device="cuda", weights="int4")  # widths 64 / 32
