"""The π0.5 model as separate, batched calls over explicit K/V views.

* :meth:`Pi05Model.embed_prefix` — SigLIP image tokens ‖ prompt token embeddings, packed so that
  masked camera slots and prompt padding are dropped (their tokens are excluded by the attention
  mask in openpi anyway; dropping them gives the same valid-token outputs for less compute);
* :meth:`Pi05Model.prefill` — VLM over the prefix, K/V written through the view, returns the final
  hidden state of the last valid prefix token (where text decoding starts);
* :meth:`Pi05Model.denoise_step` / :meth:`Pi05Model.sample_actions` — action expert over the
  read-only prefix K/V (adaRMS time conditioning, Euler flow);
* :meth:`Pi05Model.decode_step` — causal VLM step(s) appending K/V, returning LM-head logits.

Follows openpi ``models_pytorch/pi0_pytorch.py`` (``PI0Pytorch`` with ``pi05=True``) and LeRobot
``policies/pi05/modeling_pi05.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from .flow import euler_integrate, euler_times, sinusoidal_time_embedding
from .gemma import GemmaStack, MoTRunner
from .kv import AttentionView, SelfView, prefix_positions
from .siglip import VisionEncoder


def pack_valid(x: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Move each row's valid tokens to the front (order kept) and trim to the longest row.

    Args:
        x: ``[B, P, W]``; valid: ``[B, P]`` bool.

    Returns:
        (``[B, P', W]``, ``[B, P']`` bool) with ``P' = max_b valid[b].sum()``.
    """
    counts = valid.sum(-1)
    width = int(counts.max()) if counts.numel() else 0
    order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)[:, :width]
    packed = x.gather(1, order[:, :, None].expand(-1, -1, x.shape[-1]))
    new_valid = torch.arange(width, device=x.device)[None, :] < counts[:, None]
    return packed, new_valid


class Pi05Model(nn.Module):
    """π0.5: SigLIP + Gemma VLM + Gemma action expert (Mixture-of-Transformers), flow matching."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        we = cfg.expert.width
        self.vision = VisionEncoder(cfg.vision, cfg.vlm.width)
        self.vlm = GemmaStack(cfg.vlm, vocab_size=cfg.vocab_size)
        self.expert = GemmaStack(cfg.expert, cond_dim=we)
        self.runner = MoTRunner(cfg.vlm)
        self.action_in_proj = nn.Linear(cfg.action_dim, we)
        self.action_out_proj = nn.Linear(we, cfg.action_dim)
        self.time_mlp_in = nn.Linear(we, we)
        self.time_mlp_out = nn.Linear(we, we)

    # ------------------------------------------------------------------ helpers
    @property
    def dtype(self) -> torch.dtype:
        """Compute dtype (that of the VLM projections)."""
        return self.vlm.layer(0).self_attn.q_proj.weight.dtype

    @property
    def device(self) -> torch.device:
        """Device of the parameters."""
        return self.vlm.layer(0).self_attn.q_proj.weight.device

    # ------------------------------------------------------------------ prefix
    def embed_images(self, pixels: Tensor, image_masks: Tensor) -> Tensor:
        """Image tokens of every slot; masked slots are not run through SigLIP (zeros).

        Args:
            pixels: ``[B, S, 3, H, W]`` float in [-1, 1]; image_masks: ``[B, S]`` bool.

        Returns:
            ``[B, S * N, vlm_width]`` with ``N`` tokens per image.
        """
        b, s = image_masks.shape
        n = self.cfg.vision.num_tokens
        out = torch.zeros(b, s, n, self.cfg.vlm.width, dtype=self.dtype, device=self.device)
        if bool(image_masks.any()):
            flat = pixels[image_masks].to(self.device)
            out[image_masks] = self.vision(flat).to(self.dtype)
        return out.reshape(b, s * n, -1)

    def embed_prefix(
        self,
        pixels: Tensor,
        image_masks: Tensor,
        tokens: Tensor,
        token_masks: Tensor,
        image_embeds: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Prefix embeddings ``[images ‖ prompt]``, packed to valid tokens.

        Args:
            pixels: ``[B, S, 3, H, W]``; image_masks: ``[B, S]`` bool.
            tokens: ``[B, T]`` int64 prompt ids; token_masks: ``[B, T]`` bool.
            image_embeds: precomputed :meth:`embed_images` output (skips the vision tower).

        Returns:
            (embeddings ``[B, P, vlm_width]``, valid ``[B, P]`` bool), valid tokens first per row.
        """
        img = self.embed_images(pixels, image_masks) if image_embeds is None else image_embeds
        img_valid = image_masks.to(self.device).repeat_interleave(self.cfg.vision.num_tokens, dim=1)
        txt = self.vlm.embed(tokens.to(self.device)).to(self.dtype)
        emb = torch.cat([img, txt], dim=1)
        valid = torch.cat([img_valid, token_masks.to(self.device)], dim=1)
        return pack_valid(emb, valid)

    def prefill(self, embeds: Tensor, valid: Tensor, view: AttentionView) -> Tensor:
        """Run the VLM over a prefix, writing its K/V through ``view``.

        Args:
            embeds: ``[B, P, W]``; valid: ``[B, P]`` bool (valid tokens first).
            view: a prefill view (bidirectional among valid tokens).

        Returns:
            ``[B, W]`` final-norm hidden state of each row's last valid token.
        """
        h: Tensor = self.runner([self.vlm], [embeds], [None], view)[0]
        last = (valid.long().sum(-1) - 1).clamp_min(0)
        return h[torch.arange(h.shape[0], device=h.device), last]

    def logits(self, hidden: Tensor) -> Tensor:
        """Tied LM head: ``[..., W]`` → ``[..., vocab]`` float32 logits."""
        assert self.vlm.embed_tokens is not None  # the VLM stack has the (tied) token embedding
        w = self.vlm.embed_tokens.weight
        return F.linear(hidden.to(w.dtype), w).float()

    # ------------------------------------------------------------------ actions
    def time_condition(self, t: Tensor) -> Tensor:
        """adaRMS condition from flow time: ``[B]`` → ``[B, expert_width]`` (swish MLP)."""
        emb = sinusoidal_time_embedding(t, self.cfg.expert.width, self.cfg.time_min_period, self.cfg.time_max_period)
        w = self.time_mlp_in.weight
        h = F.silu(self.time_mlp_in(emb.to(device=w.device, dtype=w.dtype)))
        return F.silu(self.time_mlp_out(h))

    def denoise_step(self, view: AttentionView, x_t: Tensor, t: Tensor | None, cond: Tensor | None = None) -> Tensor:
        """Velocity ``v(x_t, t)`` of the action expert over the read-only prefix in ``view``.

        Args:
            view: a denoise view (``H`` suffix tokens over the prefix).
            x_t: ``[B, H, action_dim]`` noisy actions; t: ``[B]`` flow time.
            cond: precomputed :meth:`time_condition` of ``t`` ``[B, expert_width]`` (then ``t`` is
                unused) — a frame constant when the S flow times are fixed.

        Returns:
            ``[B, H, action_dim]`` float32 velocity.
        """
        w = self.action_in_proj.weight
        emb = self.action_in_proj(x_t.to(device=w.device, dtype=w.dtype))
        if cond is None:
            assert t is not None, "denoise_step needs t when no cond is given"
            cond = self.time_condition(t)
        out = self.runner([self.expert], [emb], [cond], view)[0]
        velocity: Tensor = self.action_out_proj(out.to(self.action_out_proj.weight.dtype)).float()
        return velocity

    def sample_actions(self, view: AttentionView, noise: Tensor, num_steps: int) -> Tensor:
        """Euler-integrate the flow from ``noise`` ``[B, H, action_dim]`` over ``num_steps``
        denoise steps; returns ``[B, H, action_dim]`` float32 normalised actions."""
        return euler_integrate(lambda x, t: self.denoise_step(view, x, t), noise, num_steps)

    def time_conditions(self, num_steps: int, batch: int) -> tuple[Tensor, Tensor]:
        """Frame constants of the S denoise steps: adaRMS conditions ``[S, B, expert_width]`` of
        the flow times :func:`~.flow.euler_times` and ``dt`` (0-d float32)."""
        times, dt = euler_times(num_steps, self.device)
        return torch.stack([self.time_condition(t.expand(batch)) for t in times]), dt

    # ------------------------------------------------------------------ text
    def decode_step(self, view: AttentionView, token_ids: Tensor, valid: Tensor | None) -> Tensor:
        """Causal VLM forward of ``[B, T]`` new tokens appended through ``view``.

        Args:
            view: an extend view for these tokens; token_ids: ``[B, T]`` int64; valid ``[B, T]``
                bool (valid tokens first in each row), or ``None`` when every token is valid.

        Returns:
            ``[B, vocab]`` float32 logits at each row's last valid new token.
        """
        emb = self.vlm.embed(token_ids.to(self.device)).to(self.dtype)
        h = self.runner([self.vlm], [emb], [None], view)[0]
        if valid is None:
            return self.logits(h[:, -1])
        last = (valid.long().sum(-1) - 1).clamp_min(0)
        return self.logits(h[torch.arange(h.shape[0], device=h.device), last])

    # ------------------------------------------------------------------ references
    def forward_joint(self, prefix_embeds: Tensor, prefix_valid: Tensor, x_t: Tensor, t: Tensor) -> Tensor:
        """Uncached reference: one joint MoT forward of ``[prefix ‖ suffix]``.

        The prefix is bidirectional among valid tokens and never sees the suffix; the action chunk is
        one block seeing the valid prefix and itself (openpi ``make_att_2d_masks``).

        Returns:
            ``[B, H, action_dim]`` float32 velocity.
        """
        b, p = prefix_valid.shape
        horizon = x_t.shape[1]
        dev = prefix_embeds.device
        n = prefix_valid.long().sum(-1)
        positions = torch.cat(
            [prefix_positions(prefix_valid), n[:, None] + torch.arange(horizon, device=dev)[None]], dim=1
        )
        keys = torch.cat([prefix_valid, torch.ones(b, horizon, dtype=torch.bool, device=dev)], dim=1)
        is_suffix_q = torch.arange(p + horizon, device=dev) >= p
        allowed = keys[:, None, :] & (is_suffix_q[None, :, None] | ~is_suffix_q[None, None, :])
        w = self.action_in_proj.weight
        emb = self.action_in_proj(x_t.to(device=w.device, dtype=w.dtype))
        out = self.runner(
            [self.vlm, self.expert], [prefix_embeds, emb], [None, self.time_condition(t)], SelfView(positions, allowed)
        )[1]
        velocity: Tensor = self.action_out_proj(out.to(self.action_out_proj.weight.dtype)).float()
        return velocity
