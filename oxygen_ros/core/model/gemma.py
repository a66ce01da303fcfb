"""Gemma stacks and the joint Mixture-of-Transformers forward over an attention view.

Each layer runs ONE attention over the concatenated tokens of every active expert (VLM prefix
tokens, action-expert suffix tokens); each expert has its own norms, projections and MLP. With a
single active expert this is an ordinary Gemma forward (prefill, text decode) or the action expert
over a cached prefix (denoise). Follows openpi ``models_pytorch/gemma_pytorch.py``
(``PaliGemmaWithExpertModel.forward``) and the π0 paper §3 (MoT with blockwise attention).
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import Tensor, nn
from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb

from ..config import GemmaConfig
from .kv import AttentionView
from .layers import AdaRMSNorm, MoTLayer, PlainNorm, gated_residual, make_rotary


class GemmaStack(nn.Module):
    """One expert: optional token embedding, ``depth`` :class:`MoTLayer` and the final norm.

    ``vocab_size`` set → token embedding (VLM; also the tied LM head). ``cond_dim`` set → adaRMS
    norms (action expert).
    """

    def __init__(self, cfg: GemmaConfig, vocab_size: int | None = None, cond_dim: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(vocab_size, cfg.width) if vocab_size else None
        self.layers = nn.ModuleList(MoTLayer(cfg, cond_dim) for _ in range(cfg.depth))
        self.norm: nn.Module = (
            PlainNorm(cfg.width, eps=cfg.rms_norm_eps)
            if cond_dim is None
            else AdaRMSNorm(cfg.width, cond_dim, eps=cfg.rms_norm_eps)
        )

    def embed(self, token_ids: Tensor) -> Tensor:
        """Token ids ``[B, T]`` → embeddings ``[B, T, width]`` scaled by ``sqrt(width)`` (Gemma)."""
        assert self.embed_tokens is not None, "this stack has no token embedding"
        e: Tensor = self.embed_tokens(token_ids)
        return e * torch.tensor(math.sqrt(self.cfg.width), dtype=e.dtype)

    def layer(self, i: int) -> MoTLayer:
        """Layer ``i`` (``layers`` is a ``ModuleList``: its items are typed ``Module``)."""
        return cast(MoTLayer, self.layers[i])


class MoTRunner(nn.Module):
    """Runs the joint layers of several :class:`GemmaStack` over one :class:`AttentionView`."""

    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__()
        self.rotary = make_rotary(cfg)
        self.scaling = cfg.head_dim**-0.5

    def forward(
        self, stacks: list[GemmaStack], hiddens: list[Tensor], conds: list[Tensor | None], view: AttentionView
    ) -> list[Tensor]:
        """Joint forward.

        Args:
            stacks: active experts, in token order (e.g. ``[vlm]``, ``[expert]`` or ``[vlm, expert]``).
            hiddens: per expert ``[B, T_i, width_i]`` input embeddings.
            conds: per expert adaRMS condition ``[B, cond_dim]`` or ``None``.
            view: attention view over ``T = sum(T_i)`` new tokens (positions, mask, K/V storage).

        Returns:
            Per expert ``[B, T_i, width_i]`` hidden states after the final norm.
        """
        lens = [h.shape[1] for h in hiddens]
        cos, sin = view.rope(self.rotary, hiddens[0])
        depth = len(stacks[0].layers)
        for li in range(depth):
            qs, ks, vs, gates, resid = [], [], [], [], []
            for stack, h, c in zip(stacks, hiddens, conds):
                layer = stack.layer(li)
                n, g = layer.input_layernorm(h, c)
                q, k, v = layer.self_attn.qkv(n)
                qs.append(q)
                ks.append(k)
                vs.append(v)
                gates.append(g)
                resid.append(h)
            q = torch.cat(qs, 1) if len(qs) > 1 else qs[0]
            k = torch.cat(ks, 1) if len(ks) > 1 else ks[0]
            v = torch.cat(vs, 1) if len(vs) > 1 else vs[0]
            q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
            out = view.attend(li, q, k, v, self.scaling).flatten(2)
            new_hiddens = []
            start = 0
            for stack, c, g, h0, n_tok in zip(stacks, conds, gates, resid, lens):
                layer = stack.layer(li)
                a = out[:, start : start + n_tok].to(layer.self_attn.o_proj.weight.dtype)
                start += n_tok
                h = gated_residual(h0, layer.self_attn.o_proj(a), g)
                n, g2 = layer.post_attention_layernorm(h, c)
                h = gated_residual(h, layer.mlp(n.to(layer.mlp.up_proj.weight.dtype)), g2)
                new_hiddens.append(h)
            hiddens = new_hiddens
        return [stack.norm(h, c)[0] for stack, h, c in zip(stacks, hiddens, conds)]
