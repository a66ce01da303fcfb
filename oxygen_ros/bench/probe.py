"""Measurement hooks of ``bench``: per-stage timers around the engine's model calls, and memory.

:class:`StageProbe` wraps a few *instance* methods (the engine code is not changed) so that a frame
splits into model work and everything else:

- ``preprocess`` — ``Pi05Policy.encode_observation`` (image resize, state binning, prompt tokens);
- ``vision`` / ``prefill`` — from every ``Runner.prefill`` call (isolated mode prefills per request);
- ``denoise`` — the engine's own ``FrameMetrics.denoise``;
- ``fwd_decode`` / ``fwd_start`` — ``Pi05Model.decode_step`` / ``logits`` (the forward passes)
  inside ``Runner.decode`` / ``Runner.start``;
- ``sample`` — ``Runner._sample`` (argmax / sampling and the per-row Python around it);
- ``build`` — the rest of ``Runner.decode`` / ``Runner.start``: slot lists, index tensors, masks;
- ``other`` — what is left of the frame: scheduler, block pool, request lifecycle, detokenizer,
  engine glue (and these wrappers, ≈1 µs per call).

``overhead = build + sample + other`` = frame time − preprocess − model forwards. On CUDA the model
wrappers synchronise the current stream so that device time is charged to the forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ..core.engine.engine import Engine
from ..core.policy import Pi05Policy

_Fn = Callable[..., Any]  # a wrapped method: any arguments, any result

TIMED = (
    "preprocess",
    "vision",
    "prefill",
    "fwd_decode",
    "fwd_start",
    "sample",
    "decode_call",
    "start_call",
    "prefill_call",
)


class StageProbe:
    """Accumulates stage times of the current frame for whichever engine is stepping."""

    def __init__(self, policy: Pi05Policy, wrap_model: bool = True) -> None:
        self.policy = policy
        self.cuda = policy.model.device.type == "cuda"
        self._installed: list[tuple[Any, str]] = []
        self._ctx = "other"
        self._depth = 0
        self.acc: dict[str, Any] = {}
        self.begin()
        self._wrap(policy, "encode_observation", self._timed("preprocess"))
        # Compiled engines: the forward is inside the compiled step (patching the model would make
        # dynamo recompile); its time then counts as ``build`` of the decode call.
        for name in ("decode_step", "logits") if wrap_model else ():
            self._wrap(policy.model, name, self._model_call)

    # ------------------------------------------------------------------ wrapping
    def _wrap(self, obj: Any, name: str, make: Callable[[_Fn], _Fn]) -> None:
        orig = getattr(obj, name)
        obj.__dict__[name] = make(orig)  # an instance attribute shadows the class method
        self._installed.append((obj, name))

    def _timed(self, key: str) -> Callable[[_Fn], _Fn]:
        def make(orig: _Fn) -> _Fn:
            def wrapper(*a: Any, **kw: Any) -> Any:
                t = time.perf_counter()
                try:
                    return orig(*a, **kw)
                finally:
                    self.acc[key] += time.perf_counter() - t

            return wrapper

        return make

    def _model_call(self, orig: _Fn) -> _Fn:
        def wrapper(*a: Any, **kw: Any) -> Any:
            if self._depth:
                return orig(*a, **kw)
            self._depth += 1
            t = time.perf_counter()
            try:
                out = orig(*a, **kw)
                if self.cuda:
                    torch.cuda.current_stream().synchronize()
                return out
            finally:
                self._depth -= 1
                self.acc["fwd_start" if self._ctx == "start" else "fwd_decode"] += time.perf_counter() - t

        return wrapper

    def _runner_call(self, ctx: str, runner: Any) -> Callable[[_Fn], _Fn]:
        def make(orig: _Fn) -> _Fn:
            def wrapper(reqs: list[Any]) -> Any:
                self._ctx = ctx
                t = time.perf_counter()
                try:
                    return orig(reqs)
                finally:
                    self.acc[f"{ctx}_call"] += time.perf_counter() - t
                    self._ctx = "other"
                    self.acc["batches" if ctx == "decode" else "starts"].append(len(reqs))
                    self.acc["kv_peak"] = max(self.acc["kv_peak"], runner.pool.blocks.num_in_use)

            return wrapper

        return make

    def _prefill(self, orig: _Fn) -> _Fn:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            out = orig(*a, **kw)
            self.acc["prefill_call"] += time.perf_counter() - t
            self.acc["vision"] += out.stage_times.get("vision", 0.0)
            self.acc["prefill"] += out.stage_times.get("prefill", 0.0)
            self.acc["n_prefills"] += 1
            return out

        return wrapper

    def attach(self, engine: Engine) -> None:
        """Instrument one engine's runner (the policy-level wrappers are shared)."""
        r = engine.runner
        self._wrap(r, "prefill", self._prefill)
        self._wrap(r, "decode", self._runner_call("decode", r))
        self._wrap(r, "start", self._runner_call("start", r))
        self._wrap(r, "_sample", self._timed("sample"))

    def detach(self) -> None:
        """Remove every wrapper (the policy is reused by later points)."""
        for obj, name in reversed(self._installed):
            obj.__dict__.pop(name, None)
        self._installed.clear()

    # ------------------------------------------------------------------ frames
    def begin(self) -> None:
        """Reset the accumulators before a ``step()``."""
        self.acc = {k: 0.0 for k in TIMED}
        self.acc.update(batches=[], starts=[], n_prefills=0, kv_peak=0)

    def frame(self, metrics: Any) -> dict[str, Any]:
        """Decompose the frame just stepped (``FrameMetrics``) into stages; times in seconds."""
        a = self.acc
        build = (
            a["decode_call"]
            + a["start_call"]
            - a["fwd_decode"]
            - a["fwd_start"]
            - a["sample"]
            + a["prefill_call"]
            - a["vision"]
            - a["prefill"]
        )
        model = a["vision"] + a["prefill"] + metrics.denoise + a["fwd_decode"] + a["fwd_start"]
        overhead = metrics.frame_time - a["preprocess"] - model
        return {
            "T": metrics.frame_time,
            "preprocess": a["preprocess"],
            "vision": a["vision"],
            "prefill": a["prefill"],
            "denoise": metrics.denoise,
            "fwd_decode": a["fwd_decode"],
            "fwd_start": a["fwd_start"],
            "build": build,
            "sample": a["sample"],
            "other": overhead - build - a["sample"],
            "overhead": overhead,
            "engine_bookkeeping": metrics.bookkeeping,
            "tokens": metrics.tokens_emitted,
            "decode_steps": metrics.decode_steps,
            "decode_batch": metrics.decode_batch,
            "batches": list(a["batches"]),
            "starts": list(a["starts"]),
            "n_prefills": a["n_prefills"],
            "blocks_in_use": metrics.blocks_in_use,
            "kv_peak_blocks": max(a["kv_peak"], metrics.blocks_in_use),
        }


class MemoryMeter:
    """Peak memory per mode while three engines share one process.

    Estimate of a process running one mode alone = ``base`` (weights and runtime, measured before
    any engine exists) + that engine's K/V pool bytes + the largest transient growth seen during
    one of its steps. CUDA: ``memory_allocated`` / ``max_memory_allocated`` (exact). CPU: RSS, with
    the kernel's high-water mark reset before each step through ``/proc/self/clear_refs`` (an
    estimate: allocator caching can hide growth); without it the transient is reported as 0.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.method = "cuda max_memory_allocated" if self.cuda else "rss (VmHWM reset per step)"
        if not self.cuda and not self._reset_hwm():
            self.method = "rss (no per-step peak: /proc/self/clear_refs not writable)"
        self.base = self.current()
        self._before = 0

    @staticmethod
    def _status(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def current(self) -> int:
        """Bytes in use now (allocated on CUDA, RSS on CPU)."""
        if self.cuda:
            return int(torch.cuda.memory_allocated())
        try:
            return self._status("VmRSS")
        except OSError:
            return 0

    def before_step(self) -> None:
        """Reset the peak counter and remember the current usage."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        elif "VmHWM" in self.method:
            self._reset_hwm()
        self._before = self.current()

    def after_step(self) -> int:
        """Transient growth (bytes) during the step just run."""
        if self.cuda:
            return max(0, int(torch.cuda.max_memory_allocated()) - self._before)
        if "VmHWM" not in self.method:
            return 0
        return max(0, self._status("VmHWM") - self._before)


__all__ = ["StageProbe", "MemoryMeter"]
