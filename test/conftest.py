"""Shared pieces of the model-core tests: the pi05-tiny model and an uncached LM reference."""

from __future__ import annotations

import pytest
import torch

from oxygen_ros.core.config import get_preset
from oxygen_ros.core.model.kv import SelfView
from oxygen_ros.core.model.weights import random_pretrained

TINY = get_preset("pi05-tiny")


@pytest.fixture(scope="session")
def tiny_model():
    """Random-weight pi05-tiny (seed 0), fp32 CPU, eval. Shared: tests must not modify it."""
    return random_pretrained(TINY, seed=0)


def uncached_lm_logits(
    model, prefix_embeds: torch.Tensor, prefix_valid: torch.Tensor, new_ids: torch.Tensor
) -> torch.Tensor:
    """Reference without any cache: ONE VLM forward over ``[prefix ‖ new tokens]``.

    The prefix (``[B, P]``, valid tokens anywhere, e.g. openpi's unpacked layout) is bidirectional
    among its valid tokens and never sees the new tokens; new token ``j`` sees every valid prefix
    token and new tokens ``<= j``. Positions count valid tokens only (openpi ``cumsum(mask) - 1``),
    new tokens continue at ``n_valid + j``. Written independently of ``kv.py``.

    Returns:
        ``[B, vocab]`` float32 LM-head logits of the last new token, or of each row's last valid
        prefix token when ``new_ids`` has no columns.
    """
    b, p = prefix_valid.shape
    t = new_ids.shape[1]
    n = prefix_valid.long().sum(-1)
    pos = torch.cat([(prefix_valid.long().cumsum(-1) - 1).clamp_min(0), n[:, None] + torch.arange(t)[None, :]], dim=1)
    emb = torch.cat([prefix_embeds, model.vlm.embed(new_ids)], dim=1)
    q = torch.arange(p + t)
    sees = (q[None, :] <= q[:, None]) | (q[None, :] < p)  # [query, key]: all prefix keys, causal new keys
    keys = torch.cat([prefix_valid, torch.ones(b, t, dtype=torch.bool)], dim=1)
    h = model.runner([model.vlm], [emb], [None], SelfView(pos, keys[:, None, :] & sees[None]))[0]
    if t:
        return model.logits(h[:, -1])
    last = torch.stack([torch.nonzero(prefix_valid[i])[-1, 0] for i in range(b)])
    return model.logits(h[torch.arange(b), last])


@pytest.fixture(scope="session")
def lm_reference():
    """:func:`uncached_lm_logits` (as a fixture, so both test modules can use it)."""
    return uncached_lm_logits
