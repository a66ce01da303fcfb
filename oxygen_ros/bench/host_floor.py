"""``bench --host-floor``: the host-side floor of one frame at π0.5 depth, eager vs compiled; and
the action-path latency per camera count that ``bench --gpu`` prints.

The model has π0.5's depth (27 SigLIP, 18 VLM, 18 expert layers) and pi05-tiny's widths, so the
arithmetic is negligible and what remains is what every GPU frame pays on the host before its
kernels run: Python, dispatcher and kernel-launch overhead. Stages are timed through the engine's
own runner (vision, prefill, the S denoise steps, one decode step at each batch size), every
compile mode in one run, warm-up (compilation) reported apart. Operator counts come from the
PyTorch profiler: top-level non-view ``aten::`` calls plus inductor's fused C++ kernels
(``cpp.enable_kernel_profile``) — on a GPU each is about one kernel launch.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from ..core.cache.block_pool import BlockTable
from ..core.config import EngineConfig, TaskConfig, get_preset
from ..core.engine.engine import Engine
from ..core.policy import Pi05Policy, frame_noise
from ..core.types import Observation
from .env import environment, finish_environment

# metadata-only operators (no kernel): excluded from the operator counts
VIEW_OPS = {"aten::view", "aten::expand", "aten::as_strided", "aten::transpose", "aten::permute", "aten::slice",
            "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::reshape", "aten::alias", "aten::t",
            "aten::unflatten", "aten::split", "aten::chunk", "aten::narrow", "aten::detach", "aten::_reshape_alias",
            "aten::unbind", "aten::flatten", "aten::resolve_conj", "aten::resolve_neg", "aten::lift_fresh",
            "aten::empty", "aten::empty_strided", "aten::_unsafe_view", "aten::expand_as", "aten::view_as",
            "aten::contiguous", "aten::split_with_sizes", "aten::empty_like", "aten::result_type", "aten::item",
            "aten::_local_scalar_dense", "aten::is_nonzero", "aten::dim", "aten::size", "aten::stride"}
BATCHES = (8, 16, 30)


def floor_policy(device: str = "cpu") -> Pi05Policy:
    """pi05-tiny widths at π0.5 depth (27 / 18 / 18 layers), three cameras, random weights."""
    t = get_preset("pi05-tiny")
    over = {"vision": dataclasses.replace(t.vision, num_layers=27), "vlm": dataclasses.replace(t.vlm, depth=18),
            "expert": dataclasses.replace(t.expert, depth=18)}
    return Pi05Policy.from_pretrained("pi05-tiny", device=device, config_overrides=over)


def count_ops(fn) -> int:
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


def _median_ms(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return 1e3 * statistics.median(out)


def measure(policy: Pi05Policy, compile_mode: str, steps: int, reps: int) -> dict[str, Any]:
    """Stage times (median ms) and operator counts of one compile mode."""
    task = TaskConfig("floor", "", max_new_tokens=200)
    eng = Engine(policy, EngineConfig(compile=compile_mode, max_running_requests=max(BATCHES), tokens_per_frame=1,
                                      num_denoise_steps=steps, tasks=(task,), max_request_tokens=256))
    run, pool, cfg = eng.runner, eng.pool, policy.cfg
    rng = np.random.default_rng(0)
    size = cfg.vision.image_size
    obs = Observation({s: rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for s in cfg.image_slots},
                      rng.uniform(-1, 1, policy.normalizer.state_dim).astype(np.float32), "pick up the cube")
    enc = policy.encode_observation(obs)
    noise = frame_noise(0, 0, cfg.action_horizon, cfg.action_dim)
    res: dict[str, Any] = {"compile": compile_mode}
    t0 = time.perf_counter()
    times: dict[str, list[float]] = {"vision": [], "prefill": [], "denoise": []}

    def frame() -> None:
        prefix = run.prefill(enc, 0, BlockTable(pool.blocks))
        t = time.perf_counter()
        run.actions_normalized(prefix, noise, steps)
        times["denoise"].append(time.perf_counter() - t)
        times["vision"].append(prefix.stage_times["vision"])
        times["prefill"].append(prefix.stage_times["prefill"])
        pool.blocks.free(prefix.blocks)

    frame()  # compiles vision / prefill / denoise for this shape
    res["warmup_frame_s"] = time.perf_counter() - t0
    for v in times.values():
        v.clear()
    for _ in range(reps):
        frame()
    for k, v in times.items():
        res[f"{k}_ms"] = 1e3 * statistics.median(v)
    prefix = run.prefill(enc, 0, BlockTable(pool.blocks))
    res["ops_per_denoise_step"] = count_ops(lambda: run.actions_normalized(prefix, noise, steps)) / steps
    pool.blocks.free(prefix.blocks)
    warm_decode = 0.0
    for b in BATCHES:
        eng.submit_observation(obs)
        for _ in range(b):
            eng.submit_request("floor", "", 200)
        t = time.perf_counter()
        eng.step()  # admits b requests and runs one decode step (compiles this bucket)
        warm_decode += time.perf_counter() - t
        batch = eng.scheduler.decode_batch()
        assert len(batch) == b, (len(batch), b)
        with torch.inference_mode():
            res[f"decode_b{b}_ms"] = _median_ms(lambda: run.decode(batch), reps)
            res[f"ops_per_decode_step_b{b}"] = count_ops(lambda: run.decode(batch))
        eng.close()
    res["warmup_decode_s"] = warm_decode
    res["compiled_stages"] = [s.name for s in run.stages if s.compiled]
    for b in BATCHES:
        res[f"frame_b{b}_ms"] = res["vision_ms"] + res["prefill_ms"] + res["denoise_ms"] + res[f"decode_b{b}_ms"]
    return res


def host_floor(modes: list[str], steps: int = 10, reps: int = 11, policy: Pi05Policy | None = None) -> dict[str, Any]:
    """Every compile mode in one run on one policy (default :func:`floor_policy`); ratios against
    the first mode (eager). The environment (CPU, versions, load average at start and end) is
    recorded with the rows: a busy machine inflates every figure."""
    policy = policy or floor_policy()
    env = environment(policy.model.device, policy.model.dtype)
    rows = [measure(policy, m, steps, reps) for m in modes]
    base = rows[0]
    for r in rows:
        r["floor_ratio_b8"] = base["frame_b8_ms"] / r["frame_b8_ms"]
    return {"model": "pi05-tiny widths, depth 27/18/18, 3 cameras", "steps": steps, "reps": reps,
            "threads": torch.get_num_threads(), "environment": finish_environment(env), "rows": rows}


def markdown(doc: dict[str, Any]) -> str:
    """The host-floor table (ms, medians; warm-up apart)."""
    cols = ["compile", "vision_ms", "prefill_ms", "denoise_ms"] + [f"decode_b{b}_ms" for b in BATCHES] + \
        [f"frame_b{b}_ms" for b in BATCHES] + ["floor_ratio_b8", "ops_per_denoise_step", "ops_per_decode_step_b8",
                                               "warmup_frame_s", "warmup_decode_s"]
    fmt = lambda v: f"{v:.1f}" if isinstance(v, float) else str(v)  # noqa: E731
    env = doc.get("environment", {})
    load = f"; load average {env.get('loadavg_start')} → {env.get('loadavg_end')}" if env else ""
    lines = [f"Host floor — {doc['model']}, S = {doc['steps']}, {doc['threads']} thread(s), median of {doc['reps']}"
             f"{load}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in doc["rows"]]
    return "\n".join(lines)


def action_path(policy: Pi05Policy, compile_mode: str, steps: int, reps: int = 10) -> list[dict[str, Any]]:
    """Action-path latency (vision + prefill + S denoise steps, device-synchronised stage times,
    median of ``reps`` frames) with 1 … all cameras, each shape warmed up (compiled) first."""
    eng = Engine(policy, EngineConfig(compile=compile_mode, num_denoise_steps=steps, max_running_requests=1,
                                      tasks=(TaskConfig("path", "", max_new_tokens=4),)))
    rng = np.random.default_rng(3)
    size, slots = policy.cfg.vision.image_size, policy.cfg.image_slots
    out = []
    for cams in range(1, len(slots) + 1):
        warm = eng.warmup(cameras=[cams])
        o = Observation({s: rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for s in slots[:cams]},
                        rng.uniform(-1, 1, policy.normalizer.state_dim).astype(np.float32), "pick up the cube")
        times = []
        for _ in range(reps):
            eng.submit_observation(o)
            m = eng.step().metrics
            times.append(m.vision + m.prefill + m.denoise)
        out.append({"cameras": cams, "ms": 1e3 * statistics.median(times), "warmup_s": warm})
    eng.close()
    return out
