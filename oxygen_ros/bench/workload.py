"""Synthetic workload of ``bench``: camera layouts, observations, request arrivals, sweep points.

Everything here is deterministic from a seed, so the three engine modes of one point see the same
observations and the same request arrival schedule.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

import numpy as np

from ..core.types import Observation

#: Camera layouts: slot -> (height, width) of the raw camera image, ``None`` = masked slot.
#: LIBERO: agent view + wrist at 256×256, no right wrist; DROID: exterior + wrist at 180×320, no
#: right wrist; ALOHA: top + two wrists at 480×640.
LAYOUTS: dict[str, dict[str, tuple[int, int] | None]] = {
    "libero": {"base_0_rgb": (256, 256), "left_wrist_0_rgb": (256, 256), "right_wrist_0_rgb": None},
    "droid": {"base_0_rgb": (180, 320), "left_wrist_0_rgb": (180, 320), "right_wrist_0_rgb": None},
    "aloha": {"base_0_rgb": (480, 640), "left_wrist_0_rgb": (480, 640), "right_wrist_0_rgb": (480, 640)},
}
INSTRUCTIONS = {
    "libero": "put the black bowl on the plate",
    "droid": "put the marker in the cup",
    "aloha": "transfer the cube to the other arm",
}
ARRIVAL_KINDS = ("uniform", "poisson", "mix")
STATE_DIM = 14  # one random-weight policy serves every layout (identity stats of this dimension)


def observations(layout: str, count: int, seed: int) -> list[Observation]:
    """``count`` distinct synthetic observations of ``layout`` (random uint8 images and state).

    Raises:
        KeyError: unknown layout.
    """
    slots = LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        imgs = {s: None if hw is None else rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for s, hw in slots.items()}
        out.append(
            Observation(
                images=imgs,
                state=rng.uniform(-1, 1, STATE_DIM).astype(np.float32),
                instruction=INSTRUCTIONS[layout],
                stamp=float(i),
            )
        )
    return out


def parse_arrival(spec: str) -> tuple[str, float]:
    """``"uniform:1"`` → ("uniform", 1.0).

    ``uniform:r`` r requests per frame spread evenly (0.25 → one every 4 frames); ``poisson:λ``
    Poisson(λ) requests per frame; ``mix:r`` uniform arrivals whose lengths are drawn uniformly
    from [⌈N/2⌉, ⌊3N/2⌋] (mean N).

    Raises:
        ValueError: unknown kind or a rate that is not a positive number.
    """
    kind, _, rate = spec.partition(":")
    try:
        r = float(rate or "1")
    except ValueError:
        r = float("nan")
    if kind not in ARRIVAL_KINDS or not (0 < r < 1e3):
        raise ValueError(f"bad arrival spec {spec!r}: use uniform:R, poisson:LAMBDA or mix:R with a rate > 0")
    return kind, r


def arrival_schedule(spec: str, tokens: int, frames: int, seed: int) -> list[list[int]]:
    """Per frame, the token budgets (max_new_tokens) of the requests submitted before that frame."""
    kind, rate = parse_arrival(spec)
    rng = np.random.default_rng(seed)
    out: list[list[int]] = []
    for f in range(frames):
        n = int(rng.poisson(rate)) if kind == "poisson" else math.floor((f + 1) * rate) - math.floor(f * rate)
        if kind == "mix":
            lo, hi = max(1, math.ceil(tokens / 2)), max(1, (3 * tokens) // 2)
            out.append([int(x) for x in rng.integers(lo, hi + 1, n)])
        else:
            out.append([tokens] * n)
    return out


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class BenchPoint:
    """One configuration of the sweep; every mode runs it on identical inputs."""

    layout: str
    steps: int  # S denoise steps
    tokens: int  # N tokens per request (mean N for ``mix``)
    k: int  # decode steps per frame in unified mode
    arrival: str  # e.g. "uniform:1"
    horizon: int  # H actions per chunk
    frames: int  # measured frames
    seed: int = 0
    compile: str = "none"  # engine.compile of every mode at this point

    @property
    def warmup(self) -> int:
        """Frames excluded first: the longest request's frame span (N/k; 1.5·N/k for ``mix``), >= 2."""
        longest = (3 * self.tokens) // 2 if self.arrival.startswith("mix") else self.tokens
        return max(2, math.ceil(longest / self.k))

    @property
    def key(self) -> str:
        """Short label, e.g. ``libero S10 N30 k1 uniform:1``."""
        tail = "" if self.compile == "none" else f" compile:{self.compile}"
        return f"{self.layout} S{self.steps} N{self.tokens} k{self.k} {self.arrival}{tail}"

    def to_dict(self) -> dict[str, Any]:
        """JSON form (with the derived warm-up)."""
        return {**asdict(self), "warmup": self.warmup, "key": self.key}


def product_points(
    layouts: Sequence[str],
    steps: Sequence[int],
    tokens: Sequence[int],
    ks: Sequence[int] | None,
    arrivals: Sequence[str],
    horizon: int,
    frames: int,
    seed: int,
    compiles: Sequence[str] = ("none",),
) -> list[BenchPoint]:
    """Cartesian product of the axes; ``ks=None`` → every divisor of N, else those in ``ks`` dividing N.
    Compile modes vary slowest, so eager and compiled points of one run share its conditions."""
    pts = []
    for c, lay, s, n, arr in itertools.product(compiles, layouts, steps, tokens, arrivals):
        for k in divisors(n) if ks is None else [k for k in ks if n % k == 0]:
            pts.append(BenchPoint(lay, s, n, k, arr, horizon, frames, seed, c))
    return pts


class _Around(TypedDict):
    """The axes :func:`paper_sweep` holds fixed while it varies one other."""

    tokens: list[int]
    ks: list[int]
    horizon: int
    frames: int
    seed: int


def paper_sweep(horizon: int, frames: int, seed: int) -> list[BenchPoint]:
    """The default sweep: every (N, k | N) at the paper's point (LIBERO, S 10, one request per frame),
    then one axis at a time around N = 30, k ∈ {1, 5}: layouts, denoise steps, arrival patterns."""
    pts = product_points(["libero"], [10], [5, 10, 15, 20, 30], None, ["uniform:1"], horizon, frames, seed)
    around = _Around(tokens=[30], ks=[1, 5], horizon=horizon, frames=frames, seed=seed)
    pts += product_points(["droid", "aloha"], [10], arrivals=["uniform:1"], **around)
    pts += product_points(["libero"], [5, 15, 20], arrivals=["uniform:1"], **around)
    pts += product_points(
        ["libero"],
        [10],
        arrivals=[
            "uniform:0.25",
            "uniform:0.5",
            "uniform:2",
            "uniform:4",
            "poisson:0.5",
            "poisson:1",
            "poisson:2",
            "mix:1",
        ],
        **around,
    )
    return pts


__all__ = [
    "LAYOUTS",
    "ARRIVAL_KINDS",
    "observations",
    "parse_arrival",
    "arrival_schedule",
    "divisors",
    "BenchPoint",
    "product_points",
    "paper_sweep",
]
