"""The vision stage: it teaches the tower where a small object is, and touches nothing but the tower."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oxygen_ros.core.config import get_preset
from oxygen_ros.core.model.weights import random_pretrained
from oxygen_ros.train.vision_stage import train_vision_stage


def _frames(n: int, size: int, slots: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Grey frames with a red 6 px square in one quadrant of slot 0 (the label); other slots noise."""
    rng = np.random.default_rng(seed)
    images = np.full((n, slots, 3, size, size), 100, dtype=np.uint8)
    images[:, 1:] = rng.integers(0, 255, size=(n, slots - 1, 3, size, size), dtype=np.uint8)
    regions = rng.integers(0, 4, size=n)
    half = size // 2
    for i, r in enumerate(regions):
        y = int(rng.integers(0, half - 6)) + (half if r // 2 else 0)
        x = int(rng.integers(0, half - 6)) + (half if r % 2 else 0)
        images[i, 0, :, y : y + 6, x : x + 6] = np.array([220, 30, 30], dtype=np.uint8)[:, None, None]
    return images, regions.astype(np.int64)


def _stand_out(model, images: np.ndarray) -> float:
    """How far the object's token moves when the object is put in: the largest token change over the
    mean token norm of the empty frame, averaged over the frames."""
    empty = np.full_like(images, 100)
    with torch.no_grad():
        with_object = model.vision(torch.from_numpy(images).float() * (2 / 255) - 1)
        without = model.vision(torch.from_numpy(empty).float() * (2 / 255) - 1)
    change = (with_object - without).norm(dim=-1).max(1).values
    return float((change / without.norm(dim=-1).mean(1)).mean())


def test_the_vision_stage_makes_the_object_stand_out_and_touches_only_the_tower():
    torch.manual_seed(0)
    cfg = get_preset("pi05-tiny")
    model = random_pretrained(cfg, seed=0)
    images, regions = _frames(240, cfg.vision.image_size, len(cfg.image_slots), seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stand_out = _stand_out(model, images[200:, 0])
    done = train_vision_stage(model, images, regions, np.arange(200), 150, 32, 2e-3, np.random.default_rng(0))
    assert done.steps == 150 and done.accuracy >= 0.9, done
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith("vision.") for n in changed), sorted(changed)[:5]
    # on frames it never saw, the object's token now stands out from the rest (8x here)
    assert _stand_out(model, images[200:, 0]) > 3 * stand_out


def test_the_vision_stage_refuses_no_rows_or_no_steps():
    model = random_pretrained(get_preset("pi05-tiny"), seed=0)
    images, regions = _frames(4, 56, 3, seed=1)
    for rows, steps in ((np.arange(0), 5), (np.arange(4), 0)):
        with pytest.raises(ValueError, match="vision stage"):
            train_vision_stage(model, images, regions, rows, steps, 2, 1e-3, np.random.default_rng(0))
