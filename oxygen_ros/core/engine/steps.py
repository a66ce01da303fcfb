"""The engine's hot-path step functions: pure functions of tensors (plus static Python values).

Each one is what :mod:`.compiled` hands to ``torch.compile`` (and what runs eagerly otherwise), so
they take the pool as its K/V tensors, never an object with bookkeeping, and every shape comes
from a static bucket. One function per stage:

* :func:`prefill_prefix` — VLM over a prefix padded to its bucket; pad tokens write the null block;
* :func:`denoise_actions` — gathers the prefix once into the denoise scratch, then all S Euler
  steps of the action expert with the precomputed time conditions (one region per frame);
  :func:`denoise_step` is one of those steps (the CPU's compiled region). Real-time chunking is
  tensor inputs of every step: zero prefix weights give the plain flow;
* :func:`decode_tokens` — one batched decode step over block tables (FlexAttention or gather)
  followed by on-device sampling; returns ``[B]`` token ids.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..cache.kv_pool import KVTensors
from ..cache.paged import BlockTableFlexView, BlockTableGatherView
from ..model.kv import DenoiseView, ViewBase, denoise_scratch
from ..model.pi05 import Pi05Model
from ..model.sampling import sample_batch
from ..rtc.guidance import guided_velocity


class _BucketPrefillView(ViewBase):
    """Prefill of one padded prefix ``[1, P]``: valid tokens ``[0, n)``, pads write the null slot."""

    def __init__(self, pool: KVTensors, slots: Tensor, n_valid: Tensor, padded: bool) -> None:
        self.pool = pool
        self._slots = slots.reshape(-1)
        p = slots.shape[1]
        ar = torch.arange(p, device=slots.device)
        self.positions = ar[None, :]
        self.allowed = (ar[None, None, :] < n_valid[:, None, None]).expand(1, p, p) if padded else None

    def attend_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.pool.write(layer, self._slots, k[0], v[0])
        return k, v


def prefill_prefix(
    model: Pi05Model,
    pool_k: Tensor,
    pool_v: Tensor,
    block_size: int,
    image_tokens: Tensor,
    token_ids: Tensor,
    slots: Tensor,
    n_valid: Tensor,
    padded: bool,
) -> Tensor:
    """Prefill ``[image tokens ‖ prompt embeddings]`` into ``slots`` ``[1, P]`` (pads: the null slot).

    Args:
        image_tokens: ``[1, C * N, W]`` tokens of the ``C`` present cameras (slot order).
        token_ids: ``[1, T]`` prompt ids, valid first (padding ids are embedded but masked).
        slots: ``[1, C * N + T]``; n_valid: ``[1]`` int64 valid tokens (images + valid prompt).
        padded: ``n_valid < P`` (a key mask is needed); positions of valid tokens are
            ``0 … n - 1`` (pads' positions are never seen).

    Returns:
        ``[1, W]`` final hidden state of the last valid token (where text decoding starts).
    """
    embeds = torch.cat([image_tokens, model.vlm.embed(token_ids).to(image_tokens.dtype)], dim=1)
    view = _BucketPrefillView(KVTensors(pool_k, pool_v, block_size), slots, n_valid, padded)
    h: Tensor = model.runner([model.vlm], [embeds], [None], view)[0]
    return h.index_select(1, (n_valid - 1).clamp_min(0))[:, 0]


def denoise_actions(
    model: Pi05Model,
    pool_k: Tensor,
    pool_v: Tensor,
    block_size: int,
    read: Tensor,
    lengths: Tensor,
    noise: Tensor,
    conds: Tensor,
    dt: Tensor,
    padded: bool,
    times: Tensor,
    gains: Tensor,
    target: Tensor,
    weights: Tensor,
) -> Tensor:
    """The whole action path after prefill: prefix K/V ``read`` ``[1, P]`` slots (pads: null slot,
    masked) copied once into the denoise scratch, then ``S = conds.shape[0]`` steps of
    :func:`denoise_step` (one compiled region per frame on CUDA).

    Returns:
        ``[1, H, action_dim]`` float32 normalised actions.
    """
    k, v = prefix_scratch(pool_k, pool_v, block_size, read, noise.shape[1])
    x = noise.to(torch.float32)
    for i in range(conds.shape[0]):
        x = denoise_step(model, k, v, lengths, x, conds[i], dt, padded, times[i], gains[i], target, weights)
    return x


def prefix_scratch(
    pool_k: Tensor, pool_v: Tensor, block_size: int, read: Tensor, horizon: int
) -> tuple[Tensor, Tensor]:
    """The denoise scratch ``[L, 1, P + H, KVH, D]`` with the prefix slots ``read`` copied in."""
    pool = KVTensors(pool_k, pool_v, block_size)
    ks, vs = zip(*(pool.gather(layer, read) for layer in range(pool.num_layers)))
    return denoise_scratch(list(ks), list(vs), horizon)


def denoise_step(
    model: Pi05Model,
    k: Tensor,
    v: Tensor,
    lengths: Tensor,
    x: Tensor,
    cond: Tensor,
    dt: Tensor,
    padded: bool,
    t: Tensor,
    g: Tensor,
    target: Tensor,
    weights: Tensor,
) -> Tensor:
    """One Euler step ``x + dt * v'`` over a denoise scratch, ``v'`` the velocity guided by
    real-time chunking toward ``target`` ``[1, H, D]`` with prefix weights ``weights`` ``[1, H, 1]``
    and guidance weight ``g`` at flow time ``t``
    (:func:`~oxygen_ros.core.rtc.guidance.guided_velocity`). With ``weights`` all zero ``v' = v``
    exactly: the plain flow (LeRobot ``modeling_pi05.py`` ``denoise_step`` + Euler update). The
    per-step compiled region on the CPU, where compiling the unrolled S-step loop costs far more
    than it saves."""
    view = DenoiseView(k, v, lengths, x.shape[1], padded)
    return x + dt * guided_velocity(x, model.denoise_step(view, x, None, cond), t, g, target, weights)


def decode_tokens(
    model: Pi05Model,
    pool_k: Tensor,
    pool_v: Tensor,
    block_size: int,
    flex: bool,
    ids: Tensor,
    tables: Tensor,
    num_blocks: Tensor,
    prefix_len: Tensor,
    aligned: Tensor,
    pos: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    keys: Tensor,
    counters: Tensor,
    kv_num: Tensor | None,
    kv_idx: Tensor | None,
    p2l: Tensor | None,
    meta: Tensor | None,
    top_k_cap: int,
    greedy_only: bool,
) -> Tensor:
    """One decode step of ``B`` rows (see :class:`~.step_buffers.DecodeBatch`) and sampling.

    Returns:
        ``[B]`` int64 next tokens (``-1``: non-finite distribution).
    """
    pool = KVTensors(pool_k, pool_v, block_size)
    view: ViewBase
    if flex:
        # StepBuffers builds the FlexAttention index whenever the step is flex.
        assert kv_num is not None and kv_idx is not None and p2l is not None and meta is not None
        view = BlockTableFlexView(pool, tables, (kv_num, kv_idx, p2l, meta), prefix_len, aligned, pos)
    else:
        view = BlockTableGatherView(pool, tables, prefix_len, aligned, pos)
    logits = model.decode_step(view, ids, None)
    return sample_batch(logits, temperature, top_k, keys, counters, top_k_cap, greedy_only)
