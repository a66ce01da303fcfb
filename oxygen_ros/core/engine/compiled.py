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

Recompiles. Dynamo keeps its graphs, and counts them against ``recompile_limit``, per *code
object*; past the limit it runs the function eagerly without a word. Every :class:`Stage` therefore
compiles its own copy of the step function's code: the graphs of one engine never count against
another's (several engines in one process — the bench's modes, a node's configure / cleanup cycles
with other pool sizes — each keep their compiled stages), and they are freed with the engine. After
warm-up (:meth:`Stage.seal`) every new graph is a recompile: it is counted, logged with the input
shapes, and past the stage's budget the stage falls back to eager on purpose, with the reason in
the diagnostics — a stage never reports "compiled" while dynamo runs it eagerly.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from ..config import COMPILE_MODES
from ..types import Observation

T = TypeVar("T")
log = logging.getLogger(__name__)


RECOMPILE_ALLOWANCE = 2  # graphs a stage may add after warm-up before it falls back to eager


def _raise_recompile_limit(n: int) -> None:
    """Dynamo keeps at most ``recompile_limit`` graphs per code object before it silently runs
    eagerly; make room for a stage's budget plus one, so the budget check always fires first."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < n:
            setattr(cfg, name, n)


def _own_code(fn: Callable[..., Any], name: str) -> types.FunctionType:
    """``fn`` with a code object of its own (named ``name``): dynamo's graph cache and recompile
    count are per code object, so each stage gets its own (see the module docstring)."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _graph_count(code: types.CodeType) -> int | None:
    """Graphs dynamo holds for ``code`` (``None`` where this torch has no way to tell)."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:  # pragma: no cover - every torch this package supports has it
        return None
    return len(_debug_get_cache_entry_list(code))


def _graphs_compiled() -> int | None:
    """Graphs dynamo compiled in this process so far (a cheap global counter: a stage recounts its
    own graphs only when this moved)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - every torch this package supports has it
        return None
    return counters["stats"]["unique_graphs"]


def _describe(args: tuple[Any, ...]) -> str:
    """Short description of a call's inputs for a recompile log line: tensor shapes and flags."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(f"{a.dtype}{list(a.shape)}".replace("torch.", ""))
        elif isinstance(a, (bool, int, float)) or a is None:
            out.append(repr(a))
    return "(" + ", ".join(out) + ")"


class Stage:
    """One engine stage (``vision``, ``prefill``, ``denoise``, ``decode``) — eager or compiled.

    Args:
        name: stage name used in diagnostics.
        fn: the eager step function.
        mode: one of :data:`COMPILE_MODES`.
        shapes: how many static shapes the stage will see (warm-up compiles one graph each); after
            warm-up it may add :data:`RECOMPILE_ALLOWANCE` more before it falls back to eager.
        cuda: the stage runs on CUDA (CUDA graphs for ``reduce-overhead`` / ``max-autotune``).

    Raises:
        ValueError: ``mode`` is not one of :data:`COMPILE_MODES`.
    """

    def __init__(self, name: str, fn: Callable[..., Any], mode: str, shapes: int = 8, cuda: bool = False) -> None:
        if mode not in COMPILE_MODES:
            raise ValueError(f"compile={mode!r} must be one of {COMPILE_MODES}")
        self.name = name
        self.eager = fn
        self.mode = mode
        self.fallback_reason: str | None = None
        self.budget = max(1, shapes) + RECOMPILE_ALLOWANCE
        self.recompiles = 0  # graphs compiled after seal()
        self.graph_inputs: list[str] = []  # the inputs (shapes, flags) of each graph, in compile order
        self._seen = 0  # graphs seen so far
        self._total: int | None = None  # dynamo's process-wide graph count at the last look
        self._sealed = False
        # CUDA graph trees (reduce-overhead / max-autotune on CUDA) reuse output memory on the next
        # replay: every call starts a new step, and callers copy what they keep (runner docs).
        self._graphs = cuda and mode in ("reduce-overhead", "max-autotune")
        self._compiled: Callable[..., Any] | None
        self._code: types.CodeType | None
        if mode == "none":
            self._compiled = None
            self._code = None
        else:
            own = _own_code(fn, f"{name}_stage")
            self._code = own.__code__
            _raise_recompile_limit(self.budget + 1)
            self._compiled = torch.compile(own, mode=None if mode == "default" else mode, dynamic=False)

    @property
    def compiled(self) -> bool:
        """Whether calls run the compiled function (not ``none``, not fallen back)."""
        return self._compiled is not None and self.fallback_reason is None

    @property
    def graphs(self) -> int:
        """Graphs dynamo holds for this stage (0 when eager)."""
        return (_graph_count(self._code) or 0) if self._code is not None else 0

    def seal(self) -> None:
        """Mark the end of warm-up: from now on every new graph counts as a recompile."""
        self._seen = self.graphs
        self._sealed = True

    def __call__(self, *args: Any) -> Any:
        if not self.compiled:
            return self.eager(*args)
        assert self._compiled is not None  # self.compiled
        if self._graphs:
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]  # torch: unannotated
        out = self._compiled(*args)
        self._watch(args)
        return out

    def _watch(self, args: tuple[Any, ...]) -> None:
        """Count graphs added since the last call: after :meth:`seal` each is a recompile (logged
        with the inputs); past the budget the stage falls back to eager for good, before dynamo's
        own limit would make it run eagerly unannounced."""
        total = _graphs_compiled()
        if total is not None and total == self._total:
            return  # nothing compiled anywhere since the last look
        self._total = total
        n = self.graphs
        if n <= self._seen:
            return
        self.graph_inputs.append(_describe(args))
        if self._sealed:
            self.recompiles += n - self._seen
            log.warning(
                "compiled %s stage compiled a new graph after warm-up (recompile %d; inputs %s): an "
                "input shape warm-up did not cover",
                self.name,
                self.recompiles,
                _describe(args),
            )
        self._seen = n
        if n > self.budget:
            self.fall_back(
                f"{n} graphs exceed the budget of {self.budget} ({self.recompiles} recompiles "
                "after warm-up: input shapes warm-up did not cover)"
            )

    def fall_back(self, reason: str) -> None:
        """Switch this stage to eager for good and record why."""
        self.fallback_reason = reason
        log.warning("compiled %s stage falls back to eager: %s", self.name, reason)

    def checked(self, run: Callable[[Callable[..., Any]], T], bad: Callable[[T], int]) -> T:
        """``run(self)`` — the one non-finite check of every stage. If the compiled result has
        ``bad`` entries (``bad(out) > 0``: a non-finite chunk, rows with non-finite logits) and
        ``run(self.eager)`` has fewer, the stage falls back to eager for good (diagnostic recorded)
        and the eager result is returned. ``run`` must be idempotent (a decode step rewrites the
        same K/V slots)."""
        out = run(self)
        if not self.compiled:
            return out
        n = bad(out)
        if n == 0:
            return out
        ref = run(self.eager)
        if bad(ref) < n:
            self.fall_back(f"compiled output was non-finite ({n}) where eager was not ({bad(ref)})")
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
    blanks: list[dict[str, np.ndarray | None]] = [
        {s: np.zeros((size, size, 3), np.uint8) for s in slots[:n]} for n in counts
    ]
    if not static:
        blanks = blanks[-1:]
    return [
        Observation(images=images, state=state, instruction="warm up")
        for images in blanks + [blanks[-1]] * max(frames - 1, 0)
    ]
