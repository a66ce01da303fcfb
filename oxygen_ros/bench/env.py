"""The environment a ``bench`` run measured on: device, dtype, threads, library versions, load."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return {"git_commit": head or None, "git_dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def environment(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """Snapshot taken at the start of a run."""
    cuda = device.type == "cuda"
    env: dict[str, Any] = {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "device_name": torch.cuda.get_device_name(device) if cuda else _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "versions": {
            d: _version(d)
            for d in ("torch", "numpy", "transformers", "safetensors", "tokenizers", "matplotlib", "tqdm", "oxygen_ros")
        },
        "cuda_runtime": torch.version.cuda,
        "loadavg_start": _loadavg(),
        **_git(),
    }
    if cuda:
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu_memory_gb=round(props.total_memory / 2**30, 1),
            gpu_capability=f"{props.major}.{props.minor}",
            cudnn=torch.backends.cudnn.version(),
            gpu_count=torch.cuda.device_count(),
        )
    return env


def finish_environment(env: dict[str, Any]) -> dict[str, Any]:
    """Add the end-of-run load average (noise indicator) and the final thread count."""
    return {**env, "loadavg_end": _loadavg(), "torch_threads_end": torch.get_num_threads()}


__all__ = ["environment", "finish_environment"]
