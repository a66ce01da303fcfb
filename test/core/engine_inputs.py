"""Observations the engine tests share (two cameras of random 30x40 images, a random state)."""

from __future__ import annotations

import numpy as np

from oxygen_ros.core.types import Observation


def make_obs(i: int) -> Observation:
    rng = np.random.default_rng(300 + i)
    imgs = {
        "base_0_rgb": rng.integers(0, 256, (30, 40, 3), dtype=np.uint8),
        "left_wrist_0_rgb": rng.integers(0, 256, (30, 40, 3), dtype=np.uint8),
    }
    return Observation(
        images=imgs, state=rng.uniform(-1, 1, 14).astype(np.float32), instruction="pick up the cube", stamp=float(i)
    )
