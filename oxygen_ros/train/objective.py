"""π0.5's training objective: flow matching on the action chunk plus cross-entropy on language
targets, in one forward through the shared prefix.

Follows openpi ``models_pytorch/pi0_pytorch.py`` (``forward``: ``t ~ Beta(1.5, 1) * 0.999 + 0.001``,
``x_t = t * noise + (1 - t) * actions``, target velocity ``u = noise - actions``, MSE) and the
π0.5 paper's co-training (section IV: the VLM's text loss and the expert's flow loss on the same
prefix). One joint Mixture-of-Transformers forward per batch runs three token groups:

- the prefix ``[images ‖ prompt]`` (bidirectional among its valid tokens, sees nothing else) — the
  tokens a frame prefills at inference;
- a text continuation (``template + answer + EOS``, causal, sees the valid prefix) — what a
  language task decodes after the prefix;
- the ``H`` noisy action tokens (the expert; see the valid prefix and each other, never the text) —
  a denoise step over the prefix cache.

Positions follow inference: the prefix ``0 … n-1``, the text and the action chunk both from ``n``.
So every masked attention pattern equals one the engine runs (prefill, extend, denoise view).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from oxygen_ros.core.model.kv import SelfView, prefix_positions
from oxygen_ros.core.model.pi05 import Pi05Model

__all__ = ["Batch", "LossParts", "co_training_loss", "sample_flow_time"]


@dataclass
class Batch:
    """One training batch (``B`` rows).

    Attributes:
        pixels: ``[B, S, 3, size, size]`` float in [-1, 1]; image_masks: ``[B, S]`` bool.
        tokens / token_masks: ``[B, L]`` prompt ids (BOS first) and their mask.
        actions: ``[B, H, action_dim]`` normalised target chunk (zero-padded past the robot's dims).
        action_dims: robot action dims the flow loss counts (a prefix of ``action_dim``).
        text: ``[B, T]`` continuation ids (template, answer, EOS; padded with 0).
        text_valid: ``[B, T]`` bool; text_target: ``[B, T]`` bool, True where the token is an
            answer token the loss predicts (from the token before it).
    """

    pixels: Tensor
    image_masks: Tensor
    tokens: Tensor
    token_masks: Tensor
    actions: Tensor
    action_dims: int
    text: Tensor
    text_valid: Tensor
    text_target: Tensor


@dataclass
class LossParts:
    """The loss and its parts (float tensors; ``loss`` carries the graph)."""

    loss: Tensor
    flow: Tensor
    text: Tensor
    text_accuracy: Tensor


def sample_flow_time(batch: int, generator: torch.Generator | None = None) -> Tensor:
    """openpi's flow time ``[B]``: ``Beta(1.5, 1) * 0.999 + 0.001`` (more weight near t = 1, the
    noisy end). Sampled as the ratio of two Gamma variables so a ``generator`` seeds it."""
    a = torch._standard_gamma(torch.full((batch,), 1.5), generator=generator)
    b = torch._standard_gamma(torch.full((batch,), 1.0), generator=generator)
    return (a / (a + b)) * 0.999 + 0.001


def _attention(prefix_valid: Tensor, text_valid: Tensor, horizon: int) -> tuple[Tensor, Tensor]:
    """Positions ``[B, L]`` and allowed ``[B, L, L]`` of ``[prefix ‖ text ‖ actions]``."""
    b, p = prefix_valid.shape
    t = text_valid.shape[1]
    dev = prefix_valid.device
    n = prefix_valid.long().sum(-1)
    positions = torch.cat(
        [
            prefix_positions(prefix_valid),
            n[:, None] + torch.arange(t, device=dev)[None],
            n[:, None] + torch.arange(horizon, device=dev)[None],
        ],
        dim=1,
    )
    group = torch.cat(
        [torch.zeros(p, dtype=torch.long), torch.ones(t, dtype=torch.long), torch.full((horizon,), 2)]
    ).to(dev)
    index = torch.cat([torch.arange(p), torch.arange(t), torch.arange(horizon)]).to(dev)
    keys = torch.cat([prefix_valid, text_valid, torch.ones(b, horizon, dtype=torch.bool, device=dev)], dim=1)
    q_group, k_group = group[:, None], group[None, :]
    allowed = (k_group == 0) | ((q_group == 1) & (k_group == 1) & (index[None, :] <= index[:, None]))
    allowed = allowed | ((q_group == 2) & (k_group == 2))
    return positions, keys[:, None, :] & allowed[None]


def co_training_loss(
    model: Pi05Model,
    batch: Batch,
    noise: Tensor,
    t: Tensor,
    text_weight: float = 1.0,
    flow_weight: float = 1.0,
) -> LossParts:
    """``flow_weight`` × flow-matching loss of the chunk plus ``text_weight`` × cross-entropy of
    the answers (``flow_weight`` 0: the answers alone, as a first stage that trains the VLM).

    Args:
        model: the π0.5 model (train mode, any dtype; losses in float32).
        batch: see :class:`Batch`.
        noise: ``[B, H, action_dim]`` standard normal; t: ``[B]`` flow time in (0, 1].

    Returns:
        :class:`LossParts`: ``flow`` (MSE of the velocity over the robot's dims), ``text`` (mean
        cross-entropy over answer tokens; 0 without any), ``text_accuracy`` (greedy next-token
        accuracy on them), ``loss = flow_weight * flow + text_weight * text``.

    Raises:
        ValueError: shapes that do not match the model.
    """
    dev = model.device
    actions = batch.actions.to(dev)
    if actions.shape[1:] != (model.cfg.action_horizon, model.cfg.action_dim) or noise.shape != actions.shape:
        raise ValueError(
            f"actions/noise must be [B, {model.cfg.action_horizon}, {model.cfg.action_dim}], "
            f"got {list(actions.shape)} and {list(noise.shape)}"
        )
    emb, valid = model.embed_prefix(batch.pixels, batch.image_masks, batch.tokens, batch.token_masks)
    text = batch.text.to(dev)
    text_emb = model.vlm.embed(text).to(model.dtype)
    t = t.to(dev)
    x_t = t[:, None, None] * noise.to(dev) + (1.0 - t[:, None, None]) * actions
    w = model.action_in_proj.weight
    act_emb = model.action_in_proj(x_t.to(w.dtype))
    positions, allowed = _attention(valid, batch.text_valid.to(dev), actions.shape[1])
    h_vlm, h_act = model.runner(
        [model.vlm, model.expert],
        [torch.cat([emb, text_emb], dim=1), act_emb],
        [None, model.time_condition(t)],
        SelfView(positions, allowed),
    )
    velocity = model.action_out_proj(h_act.to(model.action_out_proj.weight.dtype)).float()
    d = batch.action_dims
    target_v = noise.to(dev) - actions
    flow = F.mse_loss(velocity[..., :d], target_v[..., :d])

    p = emb.shape[1]
    target = batch.text_target.to(dev)[:, 1:]
    if bool(target.any()):
        logits = model.logits(h_vlm[:, p : p + text.shape[1] - 1][target])
        labels = text[:, 1:][target]
        text_loss = F.cross_entropy(logits, labels)
        accuracy = (logits.argmax(-1) == labels).float().mean()
    else:
        text_loss = accuracy = torch.zeros((), device=dev)
    loss = flow_weight * flow + text_weight * text_loss
    return LossParts(loss, flow.detach(), text_loss.detach(), accuracy.detach())
