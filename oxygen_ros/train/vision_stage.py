"""A first stage for the vision tower, before any token reaches the VLM: name the cube's region
from the base camera's image tokens through a linear head over all of them (the head is then
discarded).

Why: ``pi05-sim`` starts from random weights, where π0.5 starts from a pretrained SigLIP. From
random weights a cube of a few pixels changes the VLM's answer state by about 0.1 % (its one
image token among ~170, under near-uniform attention), and the answer loss alone does not find it
within an hour on 2 CPU cores. A linear head sees every token's position directly: the tower learns
to make the cube's token stand out in about a minute, after which the answer loss through the VLM
does find it. Labels are the sim's true regions (``CUBE_REGIONS``), frames the start frames at the
reset (:mod:`oxygen_ros.train.start_frames`), where only the cube differs between placements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from oxygen_ros.core.model.pi05 import Pi05Model

__all__ = ["VisionStageResult", "train_vision_stage"]


@dataclass
class VisionStageResult:
    """What the stage did: ``steps`` optimizer steps; ``accuracy`` of the head on the stage's last
    ``batch_size`` × 10 rows (a training-set figure: how far the tower got, not a test)."""

    steps: int
    accuracy: float


def train_vision_stage(
    model: Pi05Model,
    images: np.ndarray,
    regions: np.ndarray,
    rows: np.ndarray,
    steps: int,
    batch_size: int,
    lr: float,
    rng: np.random.Generator,
) -> VisionStageResult:
    """Train ``model.vision`` (in place) to name the region from slot 0's tokens.

    Args:
        model: the π0.5 model; only its vision tower (and projector) is updated.
        images: ``[N, S, 3, size, size]`` uint8 frames (model slot order; slot 0 the base camera).
        regions: ``[N]`` int64 region index per frame.
        rows: frames to train on (indices into ``images``).
        steps / batch_size / lr: AdamW steps, rows per step, constant learning rate.
        rng: draws the batches.

    Returns:
        :class:`VisionStageResult`.

    Raises:
        ValueError: no rows, or ``steps`` < 1.
    """
    if len(rows) == 0 or steps < 1:
        raise ValueError(f"vision stage: need rows and steps >= 1, got {len(rows)} rows and {steps} steps")
    cfg = model.cfg
    head = nn.Linear(cfg.vision.num_tokens * cfg.vlm.width, int(regions.max()) + 1).to(model.device)
    params = [*model.vision.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=1e-4)
    was_training = model.vision.training
    model.vision.train()
    right = seen = 0
    for step in range(steps):
        batch = rng.choice(rows, size=batch_size)
        pixels = torch.from_numpy(images[batch, 0]).float().to(model.device) * (2.0 / 255.0) - 1.0
        target = torch.from_numpy(regions[batch]).to(model.device)
        logits = head(model.vision(pixels).float().flatten(1))
        loss = F.cross_entropy(logits, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step >= steps - 10:
            right += int((logits.argmax(-1) == target).sum())
            seen += len(batch)
    model.vision.train(was_training)
    return VisionStageResult(steps, right / seen)
