"""Gemma building blocks of the π0.5 Mixture-of-Transformers.

The RMSNorm, GeGLU MLP and rotary embedding are transformers' Gemma modules; the adaRMS norm (time
conditioning of the action expert) and the per-expert layer container are ours. Parameter names
match the checkpoint layout (``self_attn.q_proj``, ``mlp.gate_proj``, ``input_layernorm.dense`` …),
so weights load by name. Follows openpi ``models_pytorch/gemma_pytorch.py`` and its patched
``transformers_replace/models/gemma/modeling_gemma.py`` (adaRMS), π0.5 paper §3.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import GemmaConfig as HFGemmaConfig
from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm, GemmaRotaryEmbedding

from ..config import GemmaConfig


def hf_gemma_config(cfg: GemmaConfig, vocab_size: int = 1) -> HFGemmaConfig:
    """transformers ``GemmaConfig`` equivalent of our :class:`GemmaConfig` (tanh-GELU MLP)."""
    return HFGemmaConfig(  # type: ignore[call-arg]  # transformers: the @strict config's fields are not seen as __init__ arguments
        vocab_size=vocab_size,
        hidden_size=cfg.width,
        intermediate_size=cfg.mlp_dim,
        num_hidden_layers=cfg.depth,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="gelu_pytorch_tanh",
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
    )


class AdaRMSNorm(nn.Module):
    """Adaptive RMSNorm: ``y = rmsnorm(x) * (1 + scale) + shift`` and a residual ``gate``.

    ``(scale, shift, gate) = dense(cond)`` with a zero-initialised ``Linear(cond_dim, 3 * dim)``;
    there is no plain weight. Computed in fp32, returned in ``x``'s dtype.

    Shapes: x ``[B, T, dim]``, cond ``[B, cond_dim]`` → (y ``[B, T, dim]``, gate ``[B, 1, dim]``).
    Follows openpi's patched ``GemmaRMSNorm(cond_dim=…)``.
    """

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim, bias=True)
        nn.init.zeros_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x: Tensor, cond: Tensor) -> tuple[Tensor, Tensor]:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        mod = self.dense(cond.to(self.dense.weight.dtype)).unsqueeze(1)
        scale, shift, gate = mod.chunk(3, dim=-1)
        y = normed * (1.0 + scale.float()) + shift.float()
        return y.to(x.dtype), gate.to(x.dtype)


class PlainNorm(GemmaRMSNorm):
    """Gemma RMSNorm ``(1 + w)`` with the adaRMS calling convention (gate is ``None``)."""

    def forward(self, x: Tensor, cond: Tensor | None = None) -> tuple[Tensor, None]:
        return super().forward(x), None


class SelfAttentionProjections(nn.Module):
    """Per-expert Q/K/V/O projections (no bias), named as in Gemma checkpoints."""

    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.width, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.width, bias=False)

    def qkv(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """h ``[B, T, width]`` → q ``[B, T, H, D]``, k and v ``[B, T, KVH, D]``."""
        b, t, _ = h.shape
        q = self.q_proj(h).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(h).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(h).view(b, t, self.num_kv_heads, self.head_dim)
        return q, k, v


class MoTLayer(nn.Module):
    """One expert's half of a Mixture-of-Transformers layer: norms, projections and MLP.

    The attention itself is joint over all experts' tokens and lives in :mod:`.gemma`.
    ``cond_dim`` set → adaRMS norms (action expert), else plain Gemma RMSNorms (VLM).
    """

    def __init__(self, cfg: GemmaConfig, cond_dim: int | None = None) -> None:
        super().__init__()
        self.self_attn = SelfAttentionProjections(cfg)
        self.mlp = GemmaMLP(hf_gemma_config(cfg))
        if cond_dim is None:
            self.input_layernorm: nn.Module = PlainNorm(cfg.width, eps=cfg.rms_norm_eps)
            self.post_attention_layernorm: nn.Module = PlainNorm(cfg.width, eps=cfg.rms_norm_eps)
        else:
            self.input_layernorm = AdaRMSNorm(cfg.width, cond_dim, eps=cfg.rms_norm_eps)
            self.post_attention_layernorm = AdaRMSNorm(cfg.width, cond_dim, eps=cfg.rms_norm_eps)


def gated_residual(x: Tensor, y: Tensor, gate: Tensor | None) -> Tensor:
    """``x + y * gate`` (adaRMS) or ``x + y``."""
    return x + y if gate is None else x + y * gate


def make_rotary(cfg: GemmaConfig) -> GemmaRotaryEmbedding:
    """transformers' Gemma rotary embedding for ``cfg`` (fp32 cos/sin, rotate-half layout)."""
    return GemmaRotaryEmbedding(hf_gemma_config(cfg))
