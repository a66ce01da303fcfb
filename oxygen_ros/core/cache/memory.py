"""What an engine configuration will allocate, checked against the memory the machine has — before
anything is allocated.

An engine's memory beyond the model weights grows with a few parameters, some of them without an
obvious bound: the KV pool (``engine.kv_blocks``, or the workload — ``engine.requests_per_frame``
and the tasks' ``max_new_tokens`` — within a memory budget), the block bookkeeping in Python (a free
list and a reference count per block, ~48 bytes each), the persistent decode-step buffers (one row
per request the decode batch may hold, ``engine.max_running_requests``, each as wide as the longest
sequence, ``engine.max_request_tokens``), and the activations of the widest decode step, which
warm-up runs once (every request's K/V gathered over the whole block-table width, one layer at a
time). :func:`estimate` lists them; :func:`check_fits` refuses a configuration whose total exceeds
a share of the memory available — naming the parameter behind the largest part, the bytes and the
memory available — instead of letting configure run for minutes into the out-of-memory killer
(vLLM checks its KV cache against the free device memory the same way before it starts).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import ConfigError, EngineConfig, ModelConfig
from .sizing import PoolPlan, size_for

#: Upper bound of the automatic decode batch cap (``engine.max_running_requests: 0``): a pool sized
#: far beyond the workload (a huge ``engine.kv_blocks``) must not turn into a decode batch of
#: millions of rows; set ``engine.max_running_requests`` to go beyond it.
AUTO_MAX_RUNNING = 256
#: Python bytes per pool block: a free-list entry (deque slot + int object) and a reference count.
BOOKKEEPING_BYTES_PER_BLOCK = 48
#: Share of the available memory an engine may plan to use (the rest: the model's activations,
#: the process, the other programs on the robot).
USABLE_SHARE = 0.8
_STEP_FIXED_COLUMNS = 8  # int64 per row besides the block table (``step_buffers``)


@dataclass(frozen=True)
class MemoryPart:
    """One allocation of the engine.

    Attributes:
        name: what it is; nbytes: its size in bytes; on_device: on the model's device (else the
        host; on a CPU engine both are the same memory); parameter: what sets its size.
    """

    name: str
    nbytes: int
    on_device: bool
    parameter: str


def size_engine(
    cfg: EngineConfig, model: ModelConfig, dtype: torch.dtype, device: torch.device, flex: bool
) -> tuple[EngineConfig, PoolPlan]:
    """How big an engine is, decided before it allocates anything: the KV pool
    (:func:`~.sizing.size_for`), the decode batch cap (``max_running_requests`` 0 = the workload's
    requests in flight, at most :data:`AUTO_MAX_RUNNING`), and the check that all of it fits the
    memory available (:func:`check_fits`).

    Returns:
        ``(cfg with max_running_requests resolved, the pool plan)``.

    Raises:
        ConfigError: the pool cannot hold one request beside the action path, or the engine does
            not fit the memory available (the parameter named).
    """
    plan = size_for(cfg, model, dtype, device)
    if not cfg.max_running_requests:  # auto: the workload's in-flight count (blocks still gate)
        n = min(max(1, plan.sustained, plan.in_flight), AUTO_MAX_RUNNING)
        cfg = dataclasses.replace(cfg, max_running_requests=n)
    check_fits(estimate(cfg, model, plan, dtype, cfg.max_running_requests, flex), device)
    return cfg, plan


def estimate(
    cfg: EngineConfig, model: ModelConfig, plan: PoolPlan, dtype: torch.dtype, max_running: int, flex: bool
) -> list[MemoryPart]:
    """The engine's allocations beyond the model weights (see the module doc).

    Args:
        cfg: the engine configuration; model: the model's shapes; plan: the chosen pool
            (:func:`~.sizing.size_for`); dtype: the K/V dtype; max_running: the resolved decode batch
            cap; flex: whether the decode step builds FlexAttention masks over the whole pool.

    Returns:
        The parts, largest sizes in bytes (no allocation happens here).
    """
    pool_param = (
        plan.source
        if plan.source == "engine.kv_blocks"
        else (
            "engine.requests_per_frame / tasks.<task>.max_new_tokens (the workload the pool is sized for; "
            "or cap it with engine.kv_memory_mb / engine.kv_blocks)"
        )
    )
    width_blocks = -(-model.max_prefix_len // cfg.block_size) + -(-cfg.max_request_tokens // cfg.block_size)
    batch = max(1, max_running)
    row = (_STEP_FIXED_COLUMNS + width_blocks) * 8 + 4
    if flex:  # kv_idx (int32) and p2l (int64) over every pool block, per row
        row += (plan.blocks + 2) * 4 + (plan.blocks + 1) * 8
    width_tokens = width_blocks * cfg.block_size
    element = torch.empty((), dtype=dtype).element_size()
    gathered = batch * width_tokens * 2 * model.vlm.num_kv_heads * model.vlm.head_dim * element
    scores = batch * model.vlm.num_heads * width_tokens * 4
    batch_param = "engine.max_running_requests (0 = the workload's requests in flight) x engine.max_request_tokens"
    return [
        MemoryPart("KV pool", plan.nbytes, True, pool_param),
        MemoryPart("KV block bookkeeping", plan.blocks * BOOKKEEPING_BYTES_PER_BLOCK, False, pool_param),
        MemoryPart("decode step buffers", batch * row, False, batch_param),
        MemoryPart("decode step buffers (device copy)", batch * row, True, batch_param),
        MemoryPart("widest decode step (gathered K/V, attention scores)", gathered + scores, True, batch_param),
    ]


def available_bytes(device: torch.device) -> tuple[int, str]:
    """Memory available for new allocations on ``device``: free CUDA memory
    (``torch.cuda.mem_get_info``), or the host's (:func:`host_available_bytes`). Returns
    ``(bytes, where)``."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0]), f"free on {device}"
    return host_available_bytes(), "available on the host"


def host_available_bytes() -> int:
    """Host memory available to this process, in bytes: the kernel's ``MemAvailable``
    (``/proc/meminfo``; free physical pages elsewhere), within a cgroup v2 memory limit when the
    process runs under one (a container). Plain standard library: the core runs where only torch
    and numpy are installed."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            free = min(free, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return int(free)


def check_fits(parts: list[MemoryPart], device: torch.device, share: float = USABLE_SHARE) -> None:
    """Refuse a configuration whose parts need more than ``share`` of the memory available.

    On the CPU (or any device whose memory is the host's) every part counts against the host; on
    CUDA, device parts against free device memory and host parts against the host.

    Raises:
        ConfigError: the message names the parameter behind the largest part, the bytes needed
            (every part listed) and the memory available.
    """
    groups = (
        [(parts, *available_bytes(device))]
        if device.type != "cuda"
        else [
            ([p for p in parts if p.on_device], *available_bytes(device)),
            ([p for p in parts if not p.on_device], host_available_bytes(), "available on the host"),
        ]
    )
    for group, free, where in groups:
        need = sum(p.nbytes for p in group)
        if need <= share * free:
            continue
        worst = max(group, key=lambda p: p.nbytes)
        listed = ", ".join(f"{p.name} {_size(p.nbytes)}" for p in sorted(group, key=lambda p: -p.nbytes) if p.nbytes)
        raise ConfigError(
            f"engine: the configuration needs {_size(need)} ({listed}) but {_size(free)} are {where} "
            f"(at most {share:.0%} of it is planned for); the largest part, {worst.name}, is set by {worst.parameter}: "
            "lower it"
        )


def _size(nbytes: float) -> str:
    """``1.5 GiB``-style text for a byte count."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    i = min(len(units) - 1, int(math.log(max(nbytes, 1), 1024)))
    return f"{nbytes / 1024**i:.1f} {units[i]}"


__all__ = [
    "AUTO_MAX_RUNNING",
    "BOOKKEEPING_BYTES_PER_BLOCK",
    "USABLE_SHARE",
    "MemoryPart",
    "available_bytes",
    "check_fits",
    "estimate",
    "host_available_bytes",
    "size_engine",
]
