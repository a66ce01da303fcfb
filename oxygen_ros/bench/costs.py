"""Cost model of ``bench``: every model stage measured on its own, and the ideal frame time.

The ideal time of a frame is what its model work costs when nothing else happens: preprocessing +
(vision + prefill) per prefill it ran + S denoise steps + one batched decode forward per decode
step at the batch size that step had (+ the LM head per batch of newly started requests).
Efficiency = ideal / measured; the gap is bookkeeping, sampling and interference between stages.

Stage costs are sampled *during* the run (:meth:`CostModel.tick`, one sample between frames) so
that they see the same machine load as the frames they are compared with; a cost is the median of
its samples. Decode samples use a distinct copy of the prefix per row, as unified mode's rows
continue different frames' prefixes (a shared prefix would be cache-friendlier than reality).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ..core.cache.block_pool import BlockTable
from ..core.cache.kv_pool import KVPool, PagedExtendView
from ..core.engine.runner import FramePrefix, Runner
from ..core.engine.streams import DeviceStreams
from ..core.policy import Pi05Policy, frame_noise
from ..core.types import Observation

MIN_SAMPLES = 3
#: A sample's stage, with the decode / head batch size: ``("prefill",)``, ``("decode", 4)``.
CostKey = tuple[str] | tuple[str, int]


class CostModel:
    """Samples of stage costs for one (layout, S) at a time; see the module doc."""

    def __init__(self, policy: Pi05Policy, block_size: int = 16, min_samples: int = MIN_SAMPLES) -> None:
        self.policy = policy
        self.model = policy.model
        self.block_size = block_size
        self.min_samples = max(1, min_samples)
        self.streams = DeviceStreams(policy.model.device)
        self.samples: dict[CostKey, list[float]] = {}
        self._tick = 0
        self._ctx: dict[str, Any] = {}

    # ------------------------------------------------------------------ context
    def begin_point(self, layout: str, obs: Observation, steps: int, own: int) -> None:
        """Start a point: forget previous samples, keep (or build) the private pool for ``layout``."""
        self.layout, self.obs, self.steps, self.own = layout, obs, steps, own
        self.samples, self._tick = {}, 0
        if self._ctx.get("layout") != layout:
            self._build(rows=1)

    def _build(self, rows: int) -> None:
        """Private pool: the prefix, room for one more prefill, ``rows`` rows = prefix copy + own tokens + 1."""
        self._ctx = {}  # drop the old pool first
        c, bs = self.model.cfg, self.block_size
        pmax = -(-c.max_prefix_len // bs)
        own_blocks = -(-(self.own + 2) // bs)
        pool = KVPool(
            c.vlm.depth,
            2 * pmax + rows * (pmax + own_blocks),
            bs,
            c.vlm.num_kv_heads,
            c.vlm.head_dim,
            self.model.dtype,
            self.model.device,
        )
        runner = Runner(self.policy, pool, self.streams)
        with torch.inference_mode():
            enc = self.policy.encode_observation(self.obs)
            prefix = runner.prefill(enc, 0, BlockTable(pool.blocks))
            src = torch.as_tensor(prefix.slots, device=pool.device)
            past, new = [], []
            for _ in range(rows):
                dst = BlockTable(pool.blocks).append(prefix.length)
                d = torch.as_tensor(dst, device=pool.device)
                pool.k[:, d] = pool.k[:, src]
                pool.v[:, d] = pool.v[:, src]
                own = BlockTable(pool.blocks)
                past.append(dst + own.append(self.own))
                new.append(own.append(1))
        self._ctx = {
            "layout": self.layout,
            "own": self.own,
            "rows": rows,
            "runner": runner,
            "prefix": prefix,
            "enc": enc,
            "past": past,
            "new": new,
            "views": {},
        }

    def _view(self, batch: int) -> tuple[PagedExtendView, torch.Tensor, torch.Tensor]:
        ctx = self._ctx
        if ctx["rows"] < batch or ctx["own"] != self.own:
            self._build(rows=max(batch, 2 * ctx["rows"]))
            ctx = self._ctx
        if batch not in ctx["views"]:
            valid = torch.ones(batch, 1, dtype=torch.bool)
            view = PagedExtendView.from_lists(ctx["runner"].pool, ctx["past"][:batch], ctx["new"][:batch], valid)
            ctx["views"][batch] = (view, torch.ones(batch, 1, dtype=torch.long), valid.to(self.model.device))
            self._timed(lambda: self.model.decode_step(*ctx["views"][batch]))  # first call: untimed warm-up
        cached: tuple[PagedExtendView, torch.Tensor, torch.Tensor] = ctx["views"][batch]
        return cached

    # ------------------------------------------------------------------ sampling
    def _timed(self, fn: Callable[[], Any]) -> float:
        self.streams.sync()
        t = time.perf_counter()
        fn()
        self.streams.sync()
        return time.perf_counter() - t

    def _add(self, key: CostKey, seconds: float) -> None:
        self.samples.setdefault(key, []).append(seconds)

    @torch.inference_mode()
    def sample(self, kind: str, batch: int = 1) -> None:
        """Take one sample of ``prefix`` (preprocess + vision + prefill), ``denoise``, ``decode``
        (at ``batch`` rows) or ``head`` (LM head over ``batch`` rows)."""
        ctx = self._ctx
        runner: Runner = ctx["runner"]
        if kind == "prefix":
            self._add(("preprocess",), self._timed(lambda: self.policy.encode_observation(self.obs)))
            p: FramePrefix = runner.prefill(ctx["enc"], 1, BlockTable(runner.pool.blocks))
            runner.pool.blocks.free(p.blocks)
            self._add(("vision",), p.stage_times["vision"])
            self._add(("prefill",), p.stage_times["prefill"])
        elif kind == "denoise":
            c = self.model.cfg
            noise = frame_noise(0, self._tick, c.action_horizon, c.action_dim)
            self._add(("denoise",), self._timed(lambda: runner.actions_normalized(ctx["prefix"], noise, self.steps)))
        elif kind == "decode":
            view = self._view(batch)
            self._add(("decode", batch), self._timed(lambda: self.model.decode_step(*view)))
        elif kind == "head":
            h = ctx["prefix"].last_hidden.expand(batch, -1).contiguous()
            self._add(("head", batch), self._timed(lambda: self.model.logits(h)))
        else:
            raise ValueError(f"unknown cost sample kind {kind!r}")

    def tick(self, batches_seen: set[int]) -> None:
        """One sample between frames: prefix, denoise and the decode batch size with the fewest
        samples so far, in turn."""
        kinds = ["prefix", "denoise"] + (["decode"] if batches_seen else [])
        kind = kinds[self._tick % len(kinds)]
        self._tick += 1
        batch = (
            min(sorted(batches_seen), key=lambda b: len(self.samples.get(("decode", b), []))) if kind == "decode" else 1
        )
        self.sample(kind, batch)

    def cost(self, key: CostKey) -> float:
        """Median of the samples of ``key`` (topped up to ``min_samples`` first)."""
        kind = {"preprocess": "prefix", "vision": "prefix", "prefill": "prefix"}.get(key[0], key[0])
        while len(self.samples.get(key, [])) < self.min_samples:
            self.sample(kind, key[1] if len(key) > 1 else 1)
        return statistics.median(self.samples[key])

    def ideal(self, frame: dict[str, Any]) -> float:
        """Ideal time (seconds) of one measured frame record of the current point."""
        t: float = self.cost(("preprocess",)) + frame["n_prefills"] * (self.cost(("vision",)) + self.cost(("prefill",)))
        t += self.cost(("denoise",)) + sum(self.cost(("decode", b)) for b in frame["batches"])
        return t + sum(self.cost(("head", n)) for n in frame["starts"])

    def to_dict(self) -> dict[str, Any]:
        """This point's samples and medians (seconds), JSON-ready."""
        return {
            "own_tokens": self.own,
            "costs": [
                {"stage": k[0], "batch": k[1] if len(k) > 1 else None, "median": statistics.median(v), "samples": v}
                for k, v in sorted(self.samples.items(), key=lambda kv: (kv[0][0], kv[0][1:]))
            ],
        }


__all__ = ["CostModel"]
