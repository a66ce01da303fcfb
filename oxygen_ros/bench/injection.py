"""Fault injection into a live engine by wrapping its real stage functions (monkeypatching).

:class:`FaultInjector` replaces each stage function of one engine — vision, prefill, denoise,
the decode forward, sampling, detokenising — by a wrapper that calls the original unless a fault
is armed for that stage, in which case it raises the armed exception first (once). It can also
poison one row of the next LM-head output with NaN (a non-finite distribution). Nothing in the
engine knows about it: the exception travels the same path a real one (e.g. a CUDA out-of-memory
error) would. :meth:`FaultInjector.close` restores the originals.

Used by the chaos soak (:mod:`.soak`) and the fault-containment tests.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch

from oxygen_ros.core.detokenize import IncrementalDetokenizer
from oxygen_ros.core.engine import steps as steps_module
from oxygen_ros.core.engine.engine import Engine

STAGES = ("vision", "prefill", "denoise", "decode", "sampling", "detokenize")


def stage_targets(engine: Engine) -> dict[str, tuple[Any, str]]:
    """``stage -> (owner, attribute)`` of the function that implements it in ``engine``.

    ``vision`` / ``prefill`` / ``denoise`` are the runner's eager stage functions (the soak and
    tests run eager); ``decode`` is the VLM's causal forward (also used by a new request's prompt
    extension, which the engine reports as the ``start`` stage); ``sampling`` is the decode step's
    on-device sampler; ``detokenize`` is the incremental detokenizer's ``push`` (class-wide while
    installed).
    """
    r = engine.runner
    return {
        "vision": (r.vision, "eager"),
        "prefill": (r.prefill_stage, "eager"),
        "denoise": (r.denoise_stage, "eager"),
        "decode": (engine.policy.model, "decode_step"),
        "sampling": (steps_module, "sample_batch"),
        "detokenize": (IncrementalDetokenizer, "push"),
    }


class FaultInjector:
    """Arms one-shot faults in ``engine``'s stages (see module doc).

    Attributes:
        fired: ``(stage, description)`` of every fault that went off, in order.
        calls: how many times each stage function ran while installed.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.fired: list[tuple[str, str]] = []
        self.calls: collections.Counter[str] = collections.Counter()
        self._armed: dict[str, BaseException] = {}
        self._nan_row: int | None = None
        self._hooks: dict[str, Callable[[], None]] = {}
        self._restore: list[tuple[Any, str, Any, bool]] = []
        for stage, (owner, attr) in stage_targets(engine).items():
            self._wrap(owner, attr, stage)
        self._wrap_logits()

    def _wrap(self, owner: Any, attr: str, stage: str) -> None:
        in_dict = isinstance(owner, type) or attr in getattr(owner, "__dict__", {})
        original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.calls[stage] += 1
            hook = self._hooks.pop(stage, None)
            if hook is not None:
                hook()
            exc = self._armed.pop(stage, None)
            if exc is not None:
                self.fired.append((stage, f"{type(exc).__name__}: {exc}"))
                raise exc
            return original(*args, **kwargs)

        self._restore.append((owner, attr, original, in_dict))
        setattr(owner, attr, wrapped)

    def _wrap_logits(self) -> None:
        m = self.engine.policy.model
        original = m.logits

        def logits(hidden: torch.Tensor) -> torch.Tensor:
            out = original(hidden)
            row, self._nan_row = self._nan_row, None
            if row is not None and out.shape[0] > 0:
                out = out.clone()
                out[min(row, out.shape[0] - 1)] = float("nan")
                self.fired.append(("non_finite_logits", f"row {min(row, out.shape[0] - 1)} of {out.shape[0]}"))
            return out

        self._restore.append((m, "logits", original, "logits" in m.__dict__))
        m.__dict__["logits"] = logits  # an instance attribute shadows the class method (as in bench/probe.py)

    def arm(self, stage: str, exc: BaseException | None = None) -> None:
        """Make the next call of ``stage`` raise ``exc`` (default: a ``RuntimeError`` naming it)."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; known: {STAGES}")
        self._armed[stage] = exc if exc is not None else RuntimeError(f"injected fault in {stage}")

    def arm_nan_row(self, row: int) -> None:
        """Make row ``row`` (clamped to the batch) of the next LM-head output NaN."""
        self._nan_row = row

    def on_next_call(self, stage: str, hook: Callable[[], None]) -> None:
        """Run ``hook()`` when ``stage`` is next entered (e.g. a cancel arriving mid-step)."""
        self._hooks[stage] = hook

    @property
    def armed(self) -> bool:
        """Whether a fault is still waiting for its stage."""
        return bool(self._armed) or self._nan_row is not None

    def disarm(self) -> None:
        """Drop faults that have not fired."""
        self._armed.clear()
        self._nan_row = None
        self._hooks.clear()

    def close(self) -> None:
        """Restore every wrapped function."""
        for owner, attr, original, in_dict in reversed(self._restore):
            if in_dict:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)
        self._restore.clear()

    def __enter__(self) -> FaultInjector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["STAGES", "FaultInjector", "stage_targets"]
