"""``bench --host-floor``: the host-side floor of one frame at π0.5 depth, eager vs compiled; and
the action-path latency per camera count that ``bench --gpu`` prints.

The model has π0.5's depth (27 SigLIP, 18 VLM, 18 expert layers) and pi05-tiny's widths, so the
arithmetic is negligible and what remains is what every GPU frame pays on the host before its
kernels run: Python, dispatcher and kernel-launch overhead. Stages are timed through the engine's
own runner (vision, prefill, the S denoise steps, one decode step at each batch size), every
compile mode in one run, frames interleaved across the modes, warm-up (compilation) reported apart. Operator counts
come from the
PyTorch profiler: top-level non-view ``aten::`` calls plus inductor's fused C++ kernels
(``cpp.enable_kernel_profile``) — on a GPU each is about one kernel launch.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from ..core.cache.block_pool import BlockTable
from ..core.config import EngineConfig, TaskConfig, get_preset
from ..core.engine.engine import Engine
from ..core.engine.requests import LanguageRequest
from ..core.policy import Pi05Policy, frame_noise
from ..core.types import Observation
from .env import environment, finish_environment

# metadata-only operators (no kernel): excluded from the operator counts
VIEW_OPS = {
    "aten::view",
    "aten::expand",
    "aten::as_strided",
    "aten::transpose",
    "aten::permute",
    "aten::slice",
    "aten::select",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::reshape",
    "aten::alias",
    "aten::t",
    "aten::unflatten",
    "aten::split",
    "aten::chunk",
    "aten::narrow",
    "aten::detach",
    "aten::_reshape_alias",
    "aten::unbind",
    "aten::flatten",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::lift_fresh",
    "aten::empty",
    "aten::empty_strided",
    "aten::_unsafe_view",
    "aten::expand_as",
    "aten::view_as",
    "aten::contiguous",
    "aten::split_with_sizes",
    "aten::empty_like",
    "aten::result_type",
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::is_nonzero",
    "aten::dim",
    "aten::size",
    "aten::stride",
}
BATCHES = (8, 16, 30)


def floor_policy(device: str = "cpu") -> Pi05Policy:
    """pi05-tiny widths at π0.5 depth (27 / 18 / 18 layers), three cameras, random weights."""
    t = get_preset("pi05-tiny")
    over = {
        "vision": dataclasses.replace(t.vision, num_layers=27),
        "vlm": dataclasses.replace(t.vlm, depth=18),
        "expert": dataclasses.replace(t.expert, depth=18),
    }
    return Pi05Policy.from_pretrained("pi05-tiny", device=device, config_overrides=over)


def count_ops(fn: Callable[[], object]) -> int:
    """Kernel-level operator calls of ``fn()``: top-level non-view aten ops + fused inductor kernels."""
    import torch._inductor.config as ic

    ic.cpp.enable_kernel_profile = True
    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
    n = 0
    for e in p.events():
        if "cpp_fused" in e.name:
            n += 1
        elif e.name.startswith("aten::") and e.name not in VIEW_OPS:
            parent = e.cpu_parent
            while parent is not None and not parent.name.startswith("aten::"):
                parent = parent.cpu_parent
            n += parent is None
    return n


class _ModeFloor:
    """One compile mode's engine, warmed up, with its stage timings (seconds) accumulated."""

    def __init__(self, policy: Pi05Policy, compile_mode: str, steps: int) -> None:
        self.task = TaskConfig("floor", "", max_new_tokens=200)
        self.eng = Engine(
            policy,
            EngineConfig(
                compile=compile_mode,
                max_running_requests=max(BATCHES),
                tokens_per_frame=1,
                num_denoise_steps=steps,
                tasks=(self.task,),
                max_request_tokens=256,
            ),
        )
        self.run, self.pool, self.steps = self.eng.runner, self.eng.pool, steps
        cfg = policy.cfg
        rng = np.random.default_rng(0)
        size = cfg.vision.image_size
        self.obs = Observation(
            {s: rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for s in cfg.image_slots},
            rng.uniform(-1, 1, policy.normalizer.state_dim).astype(np.float32),
            "pick up the cube",
        )
        self.enc = policy.encode_observation(self.obs)
        self.noise = frame_noise(0, 0, cfg.action_horizon, cfg.action_dim)
        self.res: dict[str, Any] = {"compile": compile_mode}
        self.times: dict[str, list[float]] = {"vision": [], "prefill": [], "denoise": []}
        self.batch: list[LanguageRequest] = []
        t0 = time.perf_counter()
        self.frame()  # compiles vision / prefill / denoise for this shape
        self.res["warmup_frame_s"] = time.perf_counter() - t0
        for v in self.times.values():
            v.clear()

    def frame(self) -> None:
        """Vision + prefill + the S denoise steps of one frame (times recorded)."""
        prefix = self.run.prefill(self.enc, 0, BlockTable(self.pool.blocks))
        t = time.perf_counter()
        self.run.actions_normalized(prefix, self.noise, self.steps)
        self.times["denoise"].append(time.perf_counter() - t)
        self.times["vision"].append(prefix.stage_times["vision"])
        self.times["prefill"].append(prefix.stage_times["prefill"])
        self.pool.blocks.free(prefix.blocks)

    def count_frame_ops(self) -> None:
        prefix = self.run.prefill(self.enc, 0, BlockTable(self.pool.blocks))
        n = count_ops(lambda: self.run.actions_normalized(prefix, self.noise, self.steps))
        self.res["ops_per_denoise_step"] = n / self.steps
        self.pool.blocks.free(prefix.blocks)

    def start_batch(self, b: int) -> None:
        """Admit ``b`` requests (one engine step, which compiles this decode bucket)."""
        eng = self.eng
        eng.submit_observation(self.obs)
        for _ in range(b):
            eng.submit_request(self.task.name, "", 200)
        t = time.perf_counter()
        eng.step()
        self.res["warmup_decode_s"] = self.res.get("warmup_decode_s", 0.0) + time.perf_counter() - t
        self.batch = eng.scheduler.decode_batch()
        assert len(self.batch) == b, (len(self.batch), b)
        self.times[f"decode_b{b}"] = []
        with torch.inference_mode():
            self.res[f"ops_per_decode_step_b{b}"] = count_ops(lambda: self.run.decode(self.batch))

    def decode(self, b: int) -> None:
        """One timed decode step of the current batch of ``b`` requests."""
        with torch.inference_mode():
            t = time.perf_counter()
            self.run.decode(self.batch)
            self.times[f"decode_b{b}"].append(time.perf_counter() - t)

    def finish(self) -> dict[str, Any]:
        """Median ms of every stage, frame totals per batch size, compiled stages."""
        res = self.res
        for k, v in self.times.items():
            res[f"{k}_ms"] = 1e3 * statistics.median(v)
        res["compiled_stages"] = [s.name for s in self.run.stages if s.compiled]
        for b in BATCHES:
            res[f"frame_b{b}_ms"] = res["vision_ms"] + res["prefill_ms"] + res["denoise_ms"] + res[f"decode_b{b}_ms"]
        return res


def host_floor(modes: list[str], steps: int = 10, reps: int = 11, policy: Pi05Policy | None = None) -> dict[str, Any]:
    """Every compile mode in one run on one policy (default :func:`floor_policy`); ratios against
    the first mode (eager).

    All modes are built and warmed up (compiled) first; then each measured frame and each decode
    step runs every mode in turn, order rotating, so that drift in the machine's speed hits all
    modes alike. The environment (CPU, versions, load average at start and end) is recorded with
    the rows: a busy machine inflates every figure.
    """
    import torch._inductor.config as ic

    ic.cpp.enable_kernel_profile = True  # before anything compiles: fused kernels then show in the counts
    policy = policy or floor_policy()
    env = environment(policy.model.device, policy.model.dtype)
    floors = [_ModeFloor(policy, m, steps) for m in modes]

    def order(i: int) -> list[_ModeFloor]:
        return floors[i % len(floors) :] + floors[: i % len(floors)]

    for i in range(reps):
        for f in order(i):
            f.frame()
    for f in floors:
        f.count_frame_ops()
    for b in BATCHES:
        for f in floors:
            f.start_batch(b)
        for i in range(reps):
            for f in order(i):
                f.decode(b)
        for f in floors:
            f.eng.close()
    rows = [f.finish() for f in floors]
    base = rows[0]
    for r in rows:
        r["floor_ratio_b8"] = base["frame_b8_ms"] / r["frame_b8_ms"]
    return {
        "model": "pi05-tiny widths, depth 27/18/18, 3 cameras",
        "steps": steps,
        "reps": reps,
        "interleaved": True,
        "threads": torch.get_num_threads(),
        "environment": finish_environment(env),
        "rows": rows,
    }


def markdown(doc: dict[str, Any]) -> str:
    """The host-floor table (ms, medians; warm-up apart)."""
    cols = (
        ["compile", "vision_ms", "prefill_ms", "denoise_ms"]
        + [f"decode_b{b}_ms" for b in BATCHES]
        + [f"frame_b{b}_ms" for b in BATCHES]
        + ["floor_ratio_b8", "ops_per_denoise_step", "ops_per_decode_step_b8", "warmup_frame_s", "warmup_decode_s"]
    )

    def fmt(v: Any) -> str:
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    env = doc.get("environment", {})
    load = f"; load average {env.get('loadavg_start')} → {env.get('loadavg_end')}" if env else ""
    lines = [
        f"Host floor — {doc['model']}, S = {doc['steps']}, {doc['threads']} thread(s), median of {doc['reps']}{load}",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in doc["rows"]]
    return "\n".join(lines)


def action_path(policy: Pi05Policy, compile_mode: str, steps: int, reps: int = 10) -> list[dict[str, Any]]:
    """Action-path latency (vision + prefill + S denoise steps, device-synchronised stage times,
    median of ``reps`` frames) with 1 … all cameras, each shape warmed up (compiled) first."""
    eng = Engine(
        policy,
        EngineConfig(
            compile=compile_mode,
            num_denoise_steps=steps,
            max_running_requests=1,
            tasks=(TaskConfig("path", "", max_new_tokens=4),),
        ),
    )
    rng = np.random.default_rng(3)
    size, slots = policy.cfg.vision.image_size, policy.cfg.image_slots
    out = []
    for cams in range(1, len(slots) + 1):
        warm = eng.warmup(cameras=[cams])
        o = Observation(
            {s: rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for s in slots[:cams]},
            rng.uniform(-1, 1, policy.normalizer.state_dim).astype(np.float32),
            "pick up the cube",
        )
        times = []
        for _ in range(reps):
            eng.submit_observation(o)
            m = eng.step().metrics
            times.append(m.vision + m.prefill + m.denoise)
        out.append({"cameras": cams, "ms": 1e3 * statistics.median(times), "warmup_s": warm})
    eng.close()
    return out
