"""Stage ``env`` of :mod:`oxygen_ros.bench.gpu_check`: the environment, and a few frames of every engine mode.

``python -m oxygen_ros.bench.gpu_check.smoke --device cuda --json env.json`` records the device and library
versions (:func:`.env.environment`), then runs pi05-tiny (random weights) in the ``isolated``,
``shared_kv`` and ``unified`` modes, serial schedule, and ``unified`` with the concurrent schedule:
one observation per frame and one greedy language request, until the request ends. It checks
that every chunk is finite, that every request finishes, and that the modes agree (same weights,
same frame noise: equal chunks up to kernel rounding, identical greedy tokens). Nothing here needs
more than the core's dependencies (torch, transformers, tokenizers, safetensors, numpy).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...core.config import EngineConfig, TaskConfig
from ...core.loops.schedules import make_engine
from ...core.policy import Pi05Policy
from ...core.types import Observation
from ..env import environment

RUNS = (("isolated", "serial"), ("shared_kv", "serial"), ("unified", "serial"), ("unified", "concurrent"))
TASK = TaskConfig("conversation", "Question: {text}\nAnswer: ", max_new_tokens=6)
#: chunk agreement between modes: fp32 kernels differ in the last bits, bf16 in the third digit
AGREE_ATOL = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 2e-2}


def _observation(policy: Pi05Policy, frame: int) -> Observation:
    rng = np.random.default_rng(frame)
    images: dict[str, np.ndarray | None] = {
        s: rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for s in policy.cfg.image_slots
    }
    return Observation(
        images=images,
        state=rng.uniform(-1, 1, policy.normalizer.state_dim).astype(np.float32),
        instruction="pick up the cube",
        stamp=float(frame),
    )


def run_mode(policy: Pi05Policy, mode: str, schedule: str, max_frames: int = 8) -> dict[str, Any]:
    """Frames of one engine until its request ends; returns chunks, tokens, times and errors."""
    eng = make_engine(
        policy, EngineConfig(mode=mode, schedule=schedule, tasks=(TASK,), tokens_per_frame=3, num_denoise_steps=4)
    )
    chunks, tokens, times, errors, ended = [], [], [], [], []
    try:
        rid = eng.submit_request(TASK.name, "what do you see?")
        for f in range(max_frames):
            eng.submit_observation(_observation(policy, f))
            t0 = time.perf_counter()
            r = eng.step()
            times.append(time.perf_counter() - t0)
            if r.error:
                errors.append(r.error)
            if r.action is not None:
                chunks.append(r.action.actions)
            ended += [e for e in r.ended if e.id == rid]
            if ended and len(chunks) >= 2:
                break
        eng.check_invariants()
    finally:
        eng.close()
    tokens = ended[0].token_ids if ended else []
    return {
        "mode": mode,
        "schedule": schedule,
        "frames": len(times),
        "chunks": chunks,
        "tokens": list(tokens),
        "finished": bool(ended) and ended[0].status.name == "FINISHED",
        "errors": errors,
        "first_frame_ms": 1e3 * times[0] if times else None,
        "frame_ms": 1e3 * float(np.median(times[1:])) if len(times) > 1 else None,
    }


def smoke(device: str, dtype: torch.dtype, preset: str = "pi05-tiny") -> dict[str, Any]:
    """The ``env`` stage's result: environment, per-run summary and ``ok`` (all checks passed).

    Raises:
        RuntimeError: the device is not usable (e.g. ``cuda`` without a CUDA device).
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda requested but torch.cuda.is_available() is False")
    env = environment(dev, dtype)
    policy = Pi05Policy.from_pretrained(preset, device=device, dtype=dtype)
    runs = [run_mode(policy, mode, schedule) for mode, schedule in RUNS]
    ref = runs[0]
    tol = AGREE_ATOL.get(dtype, 1e-3)
    rows, ok = [], True
    for r in runs:
        n = min(len(r["chunks"]), len(ref["chunks"]))
        diff = max(
            (float(np.abs(a - b).max()) for a, b in zip(r["chunks"][:n], ref["chunks"][:n])), default=float("nan")
        )
        finite = bool(r["chunks"]) and all(np.isfinite(c).all() for c in r["chunks"])
        row = {k: r[k] for k in ("mode", "schedule", "frames", "finished", "errors", "first_frame_ms", "frame_ms")}
        row.update(
            chunks=len(r["chunks"]),
            finite=finite,
            max_diff_vs_isolated=diff,
            tokens=len(r["tokens"]),
            tokens_match=r["tokens"] == ref["tokens"],
        )
        row["ok"] = finite and r["finished"] and not r["errors"] and diff <= tol and row["tokens_match"]
        ok = ok and row["ok"]
        rows.append(row)
    peak = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None
    return {"ok": ok, "environment": env, "preset": preset, "runs": rows, "agree_atol": tol, "peak_mem_mb": peak}


def main(argv: list[str] | None = None) -> int:
    """Command line: prints one line per run and writes ``--json``; exit 1 unless every check passed."""
    ap = argparse.ArgumentParser(
        prog="python -m oxygen_ros.bench.gpu_check.smoke", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--preset", default="pi05-tiny")
    ap.add_argument("--json", type=Path, required=True, help="write the result here")
    a = ap.parse_args(argv)
    res = smoke(a.device, getattr(torch, a.dtype), a.preset)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(res, indent=1, default=str))
    env = res["environment"]
    print(
        f"{env['device_name']} ({env['device']}), torch {env['versions']['torch']}, CUDA {env['cuda_runtime']}, "
        f"Python {env['python']}"
    )
    for r in res["runs"]:
        print(
            f"{r['mode']}/{r['schedule']}: {'ok' if r['ok'] else 'FAILED'} — {r['chunks']} chunks, "
            f"finite {r['finite']}, max diff vs isolated {r['max_diff_vs_isolated']:.2e}, {r['tokens']} tokens "
            f"(match {r['tokens_match']}), first frame {r['first_frame_ms']:.0f} ms, errors {r['errors']}"
        )
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
