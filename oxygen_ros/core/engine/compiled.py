"""Compiled engine stages: ``torch.compile`` of the step functions, with eager fallback.

``compile`` (engine option and node parameter) is one of:

* ``none`` — eager PyTorch;
* ``default`` — TorchInductor (fused kernels; C++/OpenMP on the CPU, Triton on CUDA);
* ``reduce-overhead`` — inductor + CUDA graphs: each stage shape is captured once and replayed
  (on the CPU this is the same as ``default``);
* ``max-autotune`` — inductor with kernel autotuning (and CUDA graphs on CUDA).

Every shape is static (``dynamic=False``): the prefix buckets, the decode batch buckets and the
fixed block-table width; the engine's warm-up runs each one once before it reports ready. If a
compiled stage ever yields non-finite values where the eager stage does not, that stage falls
back to eager for good and a diagnostic is recorded (OxyGen reports compiled text decode producing
non-finite values on Jetson Thor). Follows the ``torch.compile`` documentation
(https://pytorch.org/docs/stable/generated/torch.compile.html).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import numpy as np
import torch

from ..config import COMPILE_MODES
from ..types import Observation
log = logging.getLogger(__name__)


def _raise_recompile_limit(n: int) -> None:
    """Dynamo keeps at most ``recompile_limit`` graphs per function before silently running
    eagerly; a stage has one graph per bucket, so make room for all of them."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < n:
            setattr(cfg, name, n)


class Stage:
    """One engine stage (``vision``, ``prefill``, ``denoise``, ``decode``) — eager or compiled.

    Args:
        name: stage name used in diagnostics.
        fn: the eager step function.
        mode: one of :data:`COMPILE_MODES`.
        shapes: how many static shapes the stage will see (recompile budget).
        cuda: the stage runs on CUDA (CUDA graphs for ``reduce-overhead`` / ``max-autotune``).
    """

    def __init__(self, name: str, fn: Callable[..., Any], mode: str, shapes: int = 8, cuda: bool = False) -> None:
        if mode not in COMPILE_MODES:
            raise ValueError(f"compile={mode!r} must be one of {COMPILE_MODES}")
        self.name = name
        self.eager = fn
        self.mode = mode
        self.fallback_reason: str | None = None
        # CUDA graph trees (reduce-overhead / max-autotune on CUDA) reuse output memory on the next
        # replay: every call starts a new step, and callers copy what they keep (runner docs).
        self._graphs = cuda and mode in ("reduce-overhead", "max-autotune")
        if mode == "none":
            self._compiled = None
        else:
            _raise_recompile_limit(max(8, 2 * shapes))
            self._compiled = torch.compile(fn, mode=None if mode == "default" else mode, dynamic=False)

    @property
    def compiled(self) -> bool:
        """Whether calls run the compiled function (not ``none``, not fallen back)."""
        return self._compiled is not None and self.fallback_reason is None

    def __call__(self, *args: Any) -> Any:
        if self.compiled:
            if self._graphs:
                torch.compiler.cudagraph_mark_step_begin()
            return self._compiled(*args)
        return self.eager(*args)

    def fall_back(self, reason: str) -> None:
        """Switch this stage to eager for good and record why."""
        self.fallback_reason = reason
        log.warning("compiled %s stage falls back to eager: %s", self.name, reason)

    def checked(self, finite: Callable[[Any], bool], *args: Any) -> Any:
        """Run the stage; if the compiled result is not ``finite`` but the eager one is, fall back
        to eager (diagnostic recorded) and return the eager result. Stages must be idempotent
        (a decode step rewrites the same K/V slots)."""
        out = self(*args)
        if not self.compiled or finite(out):
            return out
        ref = self.eager(*args)
        if finite(ref):
            self.fall_back("compiled output was non-finite where eager was finite")
            return ref
        return out


def warmup_observations(policy: Any, frames: int, cameras: list[int] | None, static: bool) -> list[Observation]:
    """The engine warm-up's blank observations: one per camera count in ``cameras`` (default 1 …
    all slots; only the largest when shapes are not ``static``) — each count is its own vision /
    prefill / denoise shape — then ``frames - 1`` more of the largest. Images are black
    ``[S, S, 3]`` uint8 at the model's size, the state zeros, the instruction "warm up"."""
    slots = policy.cfg.image_slots
    size = policy.cfg.vision.image_size
    state = np.zeros(policy.normalizer.state_dim, np.float32)
    counts = cameras or list(range(1, len(slots) + 1))
    blanks = [{s: np.zeros((size, size, 3), np.uint8) for s in slots[:n]} for n in counts]
    if not static:
        blanks = blanks[-1:]
    return [Observation(images=images, state=state, instruction="warm up")
            for images in blanks + [blanks[-1]] * max(frames - 1, 0)]


class WarmupReport:
    """Warm-up bookkeeping: shapes compiled per stage and the time it took (seconds)."""

    def __init__(self) -> None:
        self.shapes: dict[str, list[Any]] = {}
        self.seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> "WarmupReport":
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds += time.perf_counter() - self._t0

    def add(self, stage: str, shape: Any) -> None:
        """Record that ``stage`` ran at ``shape``."""
        self.shapes.setdefault(stage, []).append(shape)
