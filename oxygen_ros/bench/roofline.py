"""``bench roofline``: how far a run is from its device's limit — a roofline floor per π0.5 stage.

Each stage's floor is ``max(bytes / bandwidth, flops / peak)``: the time it cannot beat on a
device that streams ``bytes`` from memory at ``bandwidth`` and computes ``flops`` at ``peak``,
whichever is the tighter (``bound`` says which). A measured stage time divided by its floor is
how far that stage is from the device's limit.

**Parameters are counted from the model, not by hand**: :func:`param_groups` builds
:class:`~oxygen_ros.core.model.pi05.Pi05Model` on the ``meta`` device (shapes only, no memory)
and groups ``named_parameters()``: the vision tower (SigLIP + projector), the VLM layers (+ final
norm, without the token embedding), the token embedding (= the tied LM head, ``vocab × width``),
the action-expert layers (+ final norm; their adaRMS modulation layers included and also
counted on their own) and the small action / time projections. Full ``pi05``: vision 414.8 M,
VLM layers 1981.9 M (Gemma 2B's 2.51 B minus its 527 M embedding), embedding 526.6 M, expert
427.9 M (Gemma 300M's 311.4 M of projections + MLP, 116.5 M of adaRMS modulation), projections
2.2 M.

**Stages** (B = batch rows, T = prefix tokens = C cameras × n image tokens + prompt, H = action
tokens, L = decode context; every matmul costs 2 FLOPs per weight per token; attention
``4 · q · k · heads · head_dim`` per layer for ``q`` queries over ``k`` keys; K/V is bf16,
``2 · kv_heads · head_dim · 2 bytes`` per token per layer):

* ``vision`` — C images in one batch: ``2 · P_vision · C·n + 4 · C · n² · width · layers``;
  bytes: the vision weights + pixels in + image tokens out;
* ``prefill`` — ``2 · P_vlm · T + 4 · T² · heads · head_dim · layers`` (bidirectional prefix);
  bytes: the VLM layer weights + the prompt's embedding rows + the K/V written;
* ``denoise`` (one step) — ``2 · P_expert · H + 4 · H · (T + H) · heads · head_dim · layers``
  (the adaRMS modulation runs once per row, not per token); bytes: the expert weights (the
  modulation's included: it is re-read every step) + the projections + the prefix K/V read;
* ``decode`` (one step, B rows over L tokens each; L = prefix + N tokens) — ``2 · B · (P_vlm + vocab · width) +
  4 · B · L · heads · head_dim · layers``; bytes: the VLM layer weights + the LM head + B rows of
  K/V read.

Frames: action path = vision + prefill + S · denoise; a frame at k decode steps = action path +
k · decode(B) with B = ceil(N / k) rows (one N-token request arriving per frame stays N / k
frames: 30 rows at k = 1, 6 at k = 5 for N = 30); action frequency = H / frame (the project's
convention: 70 Hz at H = 10 needs a frame ≤ 1/7 s).

**Weight formats** are weight-only: ``bf16``/``fp8``/``int8``/``int4`` store 2 / 1 / 1 / 0.5
bytes per weight; activations and K/V stay bf16. **Rule for the compute peak**: a format runs at
the device's tensor peak for that format where :class:`DeviceSpec` lists one (a native path:
FP8 on Thor, the RTX 4090 and the H200; INT8/INT4 on the RTX 4090; INT8 on Orin and the H200),
else at the bf16 peak (the weights are widened to bf16 before the matmul). A native peak also
assumes the activations are quantised (W8A8-style); for a memory-bound stage the choice does not
matter. Formats apply to every weight, embedding and vision tower included.

**Checked against published measurements** (docs/benchmark.md, "Roofline: how far from the
limit"; LIBERO layout = 2 cameras, 200 prompt tokens, bf16): the OxyGen paper's RTX 4090 full
π0.5 prefix (vision + prefill) of ≈ 45.1 ms is ≈ 2.2× its floor here (2.7 + 17.5 = 20.2 ms,
compute-bound; 2.8× with a 30-token prompt) and its 10-step denoise of ≈ 20.4 ms ≈ 2.3× (8.7 ms,
memory-bound). On Jetson AGX Thor its 198 ms action path (N = 30, k = 5) is ≈ 4.0× the bf16
action-path floor (49.6 ms) — or 1.4× the floor of a whole k = 5 frame (143 ms), if the 198 ms
includes the decode steps; "≈ 27 Hz" does not follow from 198 ms at H = 10 (that is 50 Hz), so
which quantity it is stays open. The issue's ~13 GB per bf16 action path (~50 ms on Thor) and
~5 GB per decode step (≥ 18 ms on Thor) agree with the model-counted figures: 13.6 GB / 50.6 ms
with 3 cameras (13.5 GB with 2), of which 8.8 GB are the S = 10 re-reads of the 428 M expert
(116 M of it adaRMS modulation, which depends only on the flow time and could be computed once
per frame); decode 5.03 GB = 3.96 GB of VLM layers + 1.05 GB of LM head, 18.4 ms.

    bench roofline                                   # pi05, 3 cameras, the table
    bench roofline --cameras 2 --cpu --json out/roofline.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.config import ModelConfig

#: Bytes per stored weight of each weight-only format.
#: ``fp32`` is the CPU engine's own format (``bench`` on a CPU), not a weight-only format.
WEIGHT_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp32": 4.0}
#: The weight-only formats of the predicted table.
FORMATS: tuple[str, ...] = ("bf16", "fp8", "int8", "int4")
#: Activations and K/V: bf16 (fp32 in an fp32 model, :func:`act_bytes`).
ACT_BYTES = 2.0


def act_bytes(fmt: str) -> float:
    """Bytes per activation / K/V element with ``fmt`` weights: 4 for an fp32 model, else bf16's 2."""
    return 4.0 if fmt == "fp32" else ACT_BYTES


# ---------------------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class ParamGroups:
    """Parameter counts (number of weights) of π0.5, grouped by the stage that reads them.

    ``expert_modulation`` is a part of ``expert_layers`` (the adaRMS ``Linear(cond, 3 · width)`` of
    every expert norm), reported on its own; it is not added again in :attr:`total`.
    """

    vision: int  #: SigLIP tower + projector
    vlm_layers: int  #: VLM transformer layers + final norm (no token embedding)
    embedding: int  #: token embedding = the tied LM head (vocab × VLM width)
    expert_layers: int  #: action-expert layers + final norm, adaRMS modulation included
    expert_modulation: int  #: the adaRMS modulation part of ``expert_layers``
    projections: int  #: action_in/out_proj and time_mlp_in/out

    @property
    def total(self) -> int:
        """Every parameter of the model once."""
        return self.vision + self.vlm_layers + self.embedding + self.expert_layers + self.projections


def classify(name: str) -> str:
    """The :class:`ParamGroups` field a ``Pi05Model.named_parameters()`` name belongs to.

    Raises:
        ValueError: a name of no known part (the model grew a part this module does not know).
    """
    if name.startswith("vision."):
        return "vision"
    if name.startswith("vlm.embed_tokens."):
        return "embedding"
    if name.startswith("vlm."):
        return "vlm_layers"
    if name.startswith("expert."):
        return "expert_layers"
    if name.split(".")[0] in ("action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out"):
        return "projections"
    raise ValueError(f"parameter {name!r} belongs to no roofline group")


@functools.lru_cache(maxsize=8)
def param_groups(cfg: ModelConfig) -> ParamGroups:
    """Count ``cfg``'s parameters per group from the model itself, built on the ``meta`` device
    (shapes only: no memory, ~0.1 s for full π0.5 once torch and transformers are imported)."""
    import torch

    from ..core.model.pi05 import Pi05Model

    with torch.device("meta"):
        model = Pi05Model(cfg)
    counts = dict.fromkeys(("vision", "vlm_layers", "embedding", "expert_layers", "projections"), 0)
    modulation = 0
    for name, p in model.named_parameters():
        counts[classify(name)] += p.numel()
        if name.startswith("expert.") and ".dense." in name:  # AdaRMSNorm.dense
            modulation += p.numel()
    return ParamGroups(expert_modulation=modulation, **counts)


def model_param_count(cfg: ModelConfig) -> int:
    """All parameters of ``Pi05Model(cfg)`` (meta device), for checking :func:`param_groups`."""
    import torch

    from ..core.model.pi05 import Pi05Model

    with torch.device("meta"):
        return sum(p.numel() for p in Pi05Model(cfg).parameters())


# ---------------------------------------------------------------------------------------- devices
@dataclass(frozen=True)
class DeviceSpec:
    """A device's memory bandwidth (bytes/s) and dense tensor peaks (FLOP/s) per format."""

    name: str
    bandwidth: float  #: bytes/s
    peaks: dict[str, float]  #: format -> dense FLOP/s (OPS for int formats); "bf16" always present
    note: str = ""

    def peak(self, fmt: str) -> float:
        """FLOP/s a matmul with ``fmt`` weights runs at: the format's own peak where the device has
        a native path for it, else the bf16 peak (weights widened to bf16; see the module doc)."""
        return self.peaks.get(fmt, self.peaks["bf16"])


TERA = 1e12  #: FLOP/s per TFLOP/s
DEVICES: tuple[DeviceSpec, ...] = (
    # Jetson AGX Thor (T5000): 273 GB/s LPDDR5X (NVIDIA Jetson Thor datasheet / dev-kit page).
    # NVIDIA publishes 2070 FP4 TFLOPS *sparse*; dense FP4 = 2070 / 2 = 1035. FP8 = FP4 / 2 and
    # BF16 = FP8 / 2 follow Blackwell's 2:1 per-format ratios — NVIDIA gives no dense FP8/BF16
    # figure for Thor, so those two are UNCERTAIN (derived). 20 SMs at the measured clock agree to
    # within ~10 % with B200's per-SM bf16 rate. Blackwell has no INT4 tensor path; INT8 not listed
    # (uncertain for Thor) -> bf16 peak.
    DeviceSpec(
        "Jetson AGX Thor",
        273e9,
        {"bf16": 258.75 * TERA, "fp8": 517.5 * TERA},
        "FP4 1035 dense (2070 sparse, NVIDIA); fp8/bf16 derived 2:1, uncertain",
    ),
    # Jetson AGX Orin 64 GB: 204.8 GB/s LPDDR5 (NVIDIA Jetson AGX Orin datasheet). NVIDIA gives
    # 275 sparse INT8 TOPS for the module, 170 of them the Ampere GPU -> 85 dense INT8 TOPS; dense
    # FP16/BF16 tensor = INT8 / 2 = 42.5 TFLOPS (Ampere ratio; derived, UNCERTAIN at the MAXN
    # clock). No FP8 path on Ampere.
    DeviceSpec(
        "Jetson AGX Orin 64GB",
        204.8e9,
        {"bf16": 42.5 * TERA, "int8": 85.0 * TERA},
        "GPU 170 sparse INT8 TOPS (NVIDIA); dense and bf16 derived, uncertain",
    ),
    # GeForce RTX 4090: 1008 GB/s GDDR6X; NVIDIA Ada Lovelace whitepaper (Appendix A), dense, FP32
    # accumulate: BF16 165.2 TFLOPS, FP8 330.3 TFLOPS, INT8 660.6 TOPS, INT4 1321.2 TOPS.
    DeviceSpec(
        "RTX 4090",
        1008e9,
        {"bf16": 165.2 * TERA, "fp8": 330.3 * TERA, "int8": 660.6 * TERA, "int4": 1321.2 * TERA},
        "Ada whitepaper, dense, FP32 accumulate",
    ),
    # H200 SXM: 4.8 TB/s HBM3e (NVIDIA H200 datasheet); dense = half the datasheet's sparse
    # figures: BF16 989.5 TFLOPS, FP8 1979 TFLOPS, INT8 1979 TOPS. Hopper has no INT4 tensor path.
    DeviceSpec(
        "H200",
        4.8e12,
        {"bf16": 989.5 * TERA, "fp8": 1979.0 * TERA, "int8": 1979.0 * TERA},
        "NVIDIA H200 SXM datasheet, dense",
    ),
)


def probe_cpu(seconds: float = 3.0, size_mb: int = 256, n: int = 1024) -> DeviceSpec:
    """This CPU as a :class:`DeviceSpec`, measured in about ``seconds`` (well under 10 s).

    * bandwidth (bytes/s): ``dst.copy_(src)`` of a ``size_mb`` MiB float32 tensor, counting one read
      and one write, best of the repetitions that fit half the time;
    * peak (FLOP/s): ``torch.matmul`` of two ``n × n`` float32 matrices (``2 n³`` FLOPs) with the
      current ``torch.get_num_threads()``, best of the repetitions that fit the other half. It is
      the fp32 rate, used for every format (the CPU path computes in fp32).
    """
    import torch

    src = torch.ones(size_mb * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages
    best_copy = float("inf")
    end = time.perf_counter() + seconds / 2
    for i in range(50):
        t0 = time.perf_counter()
        dst.copy_(src)
        best_copy = min(best_copy, time.perf_counter() - t0)
        if i >= 2 and time.perf_counter() > end:
            break
    bandwidth = 2 * src.numel() * 4 / best_copy
    del src, dst
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(a, b)  # warm-up
    best_mm = float("inf")
    end = time.perf_counter() + seconds / 2
    for i in range(200):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best_mm = min(best_mm, time.perf_counter() - t0)
        if i >= 2 and time.perf_counter() > end:
            break
    flops = 2 * n**3 / best_mm
    threads = torch.get_num_threads()
    return DeviceSpec(
        "this CPU",
        bandwidth,
        {"bf16": flops},
        f"probed: {size_mb} MiB copy, fp32 {n}x{n} matmul, {threads} threads",
    )


# ---------------------------------------------------------------------------------------- stages
@dataclass(frozen=True)
class Workload:
    """One frame's shape: cameras C, prompt tokens, action horizon H, denoise steps S, decode
    batch B (rows) and decode context (tokens per row; ``None``: the prefix + ``tokens``)."""

    cameras: int = 3
    prompt_tokens: int = 200
    horizon: int = 10
    steps: int = 10
    batch: int = 30
    tokens: int = 30
    context: int | None = None


@dataclass(frozen=True)
class StageCost:
    """One stage on one device: work, traffic and the floor."""

    stage: str
    flops: float  #: FLOPs
    bytes: float  #: bytes moved to/from memory
    floor_s: float  #: max(bytes / bandwidth, flops / peak), seconds
    bound: str  #: "memory" | "compute"


def _kv_bytes_per_token(cfg: ModelConfig, fmt: str = "bf16") -> float:
    g = cfg.vlm
    return 2 * g.num_kv_heads * g.head_dim * g.depth * act_bytes(fmt)


def stage_work(cfg: ModelConfig, w: Workload, fmt: str) -> dict[str, tuple[float, float]]:
    """Stage name -> (FLOPs, bytes) of ``vision``, ``prefill``, ``denoise`` (one step),
    ``decode_b1`` (one step, one row) and ``decode`` (one step, ``w.batch`` rows), see the
    module doc for the formulas. ``fmt`` sets the bytes per weight (:data:`WEIGHT_BYTES`)."""
    if fmt not in WEIGHT_BYTES:
        raise ValueError(f"unknown weight format {fmt!r}; known: {list(WEIGHT_BYTES)}")
    wb = WEIGHT_BYTES[fmt]
    p = param_groups(cfg)
    v, g = cfg.vision, cfg.vlm
    n_img = w.cameras * v.num_tokens
    t = n_img + w.prompt_tokens
    attn = g.num_heads * g.head_dim * g.depth  # 4 · q · k · attn per (q, k) pair count
    kv = _kv_bytes_per_token(cfg, fmt)
    out: dict[str, tuple[float, float]] = {}
    out["vision"] = (
        2 * p.vision * n_img + 4 * w.cameras * v.num_tokens**2 * v.hidden_size * v.num_layers,
        p.vision * wb + (w.cameras * 3 * v.image_size**2 + n_img * g.width) * act_bytes(fmt),
    )
    out["prefill"] = (
        2 * p.vlm_layers * t + 4 * t * t * attn,
        p.vlm_layers * wb + w.prompt_tokens * g.width * wb + t * kv,
    )
    dense_expert = p.expert_layers - p.expert_modulation
    h = w.horizon
    out["denoise"] = (
        2 * (dense_expert + p.projections) * h + 2 * p.expert_modulation + 4 * h * (t + h) * attn,
        (p.expert_layers + p.projections) * wb + (t + h) * kv,
    )
    for key, b in (("decode_b1", 1), ("decode", w.batch)):
        out[key] = decode_work(cfg, w, fmt, b)
    return out


def decode_work(cfg: ModelConfig, w: Workload, fmt: str, rows: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step of ``rows`` rows, each over ``w.context`` tokens (default
    the prefix + ``w.tokens``, the longest a request's context gets)."""
    p = param_groups(cfg)
    g = cfg.vlm
    ctx = w.context if w.context is not None else w.cameras * cfg.vision.num_tokens + w.prompt_tokens + w.tokens
    return (
        2 * rows * (p.vlm_layers + p.embedding) + 4 * rows * ctx * g.num_heads * g.head_dim * g.depth,
        (p.vlm_layers + p.embedding) * WEIGHT_BYTES[fmt] + rows * ctx * _kv_bytes_per_token(cfg, fmt),
    )


def frame_rows(w: Workload, k: int) -> int:
    """Decode rows in a frame at ``k`` decode steps: one ``w.tokens``-token request arriving per
    frame lives ``ceil(tokens / k)`` frames, so that many rows decode together (30 at k = 1, 6 at
    k = 5 for N = 30; the paper's and ``bench``'s workload)."""
    return -(-w.tokens // k)


def floor(stage: str, flops: float, nbytes: float, device: DeviceSpec, fmt: str) -> StageCost:
    """The roofline floor of one stage on ``device`` with ``fmt`` weights."""
    mem, comp = nbytes / device.bandwidth, flops / device.peak(fmt)
    return StageCost(stage, flops, nbytes, max(mem, comp), "memory" if mem >= comp else "compute")


def stages(cfg: ModelConfig, w: Workload, device: DeviceSpec, fmt: str) -> list[StageCost]:
    """Every stage of :func:`stage_work` with its floor on ``device``."""
    return [floor(name, f, b, device, fmt) for name, (f, b) in stage_work(cfg, w, fmt).items()]


def against_floor(
    cfg: ModelConfig, device: DeviceSpec, fmt: str, w: Workload, measured: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Measured stage times beside their floors: the "% of limit" of a run.

    Args:
        cfg / device / fmt: the model, the device it ran on and its weight format (``fp32`` for
            an fp32 model on a CPU, whose :func:`probe_cpu` peak is the fp32 matmul rate).
        w: the run's frame shape (cameras, prompt tokens, horizon, steps S, decode context).
        measured: ``bench``'s cost-model entries ``{"stage", "batch", "median"}`` (seconds):
            ``vision``, ``prefill``, ``denoise`` (all S steps), ``decode`` and ``head`` per batch.

    Returns:
        One row per measured stage: ``stage``, ``batch``, ``measured_s``, ``floor_s``, ``bound``
        and ``pct_of_limit`` = floor ÷ measured × 100 (100 %: at the device's limit). A decode
        row is the decode forward plus the LM head of the same batch (the floor counts both).
    """
    by = {(m["stage"], m.get("batch")): float(m["median"]) for m in measured}
    work = stage_work(cfg, w, fmt)
    rows: list[dict[str, Any]] = []

    def row(stage: str, batch: int | None, t: float, flops: float, nbytes: float) -> None:
        c = floor(stage, flops, nbytes, device, fmt)
        rows.append(
            {
                "stage": stage,
                "batch": batch,
                "measured_s": t,
                "floor_s": c.floor_s,
                "bound": c.bound,
                "pct_of_limit": 100.0 * c.floor_s / t if t > 0 else None,
            }
        )

    for stage in ("vision", "prefill"):
        if (stage, None) in by:
            row(stage, None, by[(stage, None)], *work[stage])
    if ("denoise", None) in by:
        f, b = work["denoise"]
        row(f"denoise ×{w.steps}", None, by[("denoise", None)], w.steps * f, w.steps * b)
    for (stage, batch), t in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        if stage == "decode" and batch is not None:
            row("decode + head", batch, t + by.get(("head", batch), 0.0), *decode_work(cfg, w, fmt, batch))
    return rows


def device_spec(kind: str, name: str = "") -> DeviceSpec | None:
    """The :class:`DeviceSpec` of a run's device: the CPU probed now (``kind`` ``cpu``), or the
    table entry whose name is in the CUDA device ``name`` (None: not in the table)."""
    if kind == "cpu":
        return probe_cpu(2.0)
    keys = {"Jetson AGX Thor": "Thor", "Jetson AGX Orin 64GB": "Orin", "RTX 4090": "4090", "H200": "H200"}
    return next((d for d in DEVICES if keys.get(d.name, d.name) in name), None)


@dataclass(frozen=True)
class FramePrediction:
    """Frame arithmetic of one (device, format), seconds and Hz."""

    device: str
    format: str
    action_path_s: float  #: vision + prefill + S · denoise
    decode_b1_s: float  #: one decode step, one row
    decode_s: float  #: one decode step, ``batch`` rows
    frame_k1_s: float  #: action path + 1 · decode(ceil(N / 1) rows)
    frame_k5_s: float  #: action path + 5 · decode(ceil(N / 5) rows)
    hz_k1: float  #: H / frame_k1
    hz_k5: float  #: H / frame_k5
    target_hz: float  #: the action-rate target of the budgets
    budget_k1_s: float  #: action-path time left at ``target_hz`` after 1 decode step (ceil(N) rows)
    budget_k5_s: float  #: action-path time left at ``target_hz`` after 5 decode steps (ceil(N / 5) rows)
    stages: list[StageCost]


def frame(cfg: ModelConfig, w: Workload, device: DeviceSpec, fmt: str, target_hz: float = 70.0) -> FramePrediction:
    """Floors of the action path and of frames at k = 1 and k = 5 decode steps (see module doc),
    and the action-path budget those decode steps leave at ``target_hz`` (:func:`budget`)."""
    st = stages(cfg, w, device, fmt)
    s = {c.stage: c.floor_s for c in st}
    action = s["vision"] + s["prefill"] + w.steps * s["denoise"]
    dec = {k: floor("decode", *decode_work(cfg, w, fmt, frame_rows(w, k)), device, fmt).floor_s for k in (1, 5)}
    k1, k5 = action + dec[1], action + 5 * dec[5]
    return FramePrediction(
        device=device.name,
        format=fmt,
        action_path_s=action,
        decode_b1_s=s["decode_b1"],
        decode_s=s["decode"],
        frame_k1_s=k1,
        frame_k5_s=k5,
        hz_k1=w.horizon / k1,
        hz_k5=w.horizon / k5,
        target_hz=target_hz,
        budget_k1_s=budget(target_hz, w.horizon, dec[1], 1),
        budget_k5_s=budget(target_hz, w.horizon, dec[5], 5),
        stages=st,
    )


def budget(target_hz: float, horizon: int, decode_s: float, k: int) -> float:
    """Seconds left for the action path when a frame must deliver ``horizon`` actions at
    ``target_hz`` (frame ≤ horizon / target_hz) and spends ``k`` decode steps of ``decode_s``."""
    return horizon / target_hz - k * decode_s


def predict(
    cfg: ModelConfig, w: Workload, devices: tuple[DeviceSpec, ...] | list[DeviceSpec], target_hz: float = 70.0
) -> dict[str, Any]:
    """Plain-JSON document: config, workload, parameter groups and every device × format."""
    p = param_groups(cfg)
    rows = [frame(cfg, w, d, f, target_hz) for d in devices for f in FORMATS]
    return {
        "preset": cfg.name,
        "workload": dataclasses.asdict(w),
        "target_hz": target_hz,
        "prefix_tokens": w.cameras * cfg.vision.num_tokens + w.prompt_tokens,
        "params": {**dataclasses.asdict(p), "total": p.total},
        "devices": {d.name: dataclasses.asdict(d) for d in devices},
        "predictions": [dataclasses.asdict(r) for r in rows],
    }


def _hz(hz: float) -> str:
    return f"{hz:.0f}" if hz >= 100 else f"{hz:.2g}" if hz < 1 else f"{hz:.1f}"


def markdown(doc: dict[str, Any]) -> str:
    """The Markdown table of :func:`predict`'s document (ms, Hz)."""
    w = doc["workload"]
    b = w["batch"]
    lines = [
        f"{doc['preset']}: C = {w['cameras']} cameras, prefix {doc['prefix_tokens']} tokens, "
        f"H = {w['horizon']}, S = {w['steps']}, N = {w['tokens']} tokens per request (frame at k: "
        f"ceil(N / k) decode rows); floors in ms",
        "",
        f"| device | weights | action path | decode B=1 | decode B={b} | frame k=1 | frame k=5 "
        f"| Hz k=1 (H={w['horizon']}) | Hz k=5 | path budget at {doc['target_hz']:g} Hz, k=1 / k=5 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["predictions"]:
        lines.append(
            f"| {r['device']} | {r['format']} | {r['action_path_s'] * 1e3:.1f} | {r['decode_b1_s'] * 1e3:.2f} "
            f"| {r['decode_s'] * 1e3:.2f} | {r['frame_k1_s'] * 1e3:.1f} | {r['frame_k5_s'] * 1e3:.1f} "
            f"| {_hz(r['hz_k1'])} | {_hz(r['hz_k5'])} | {r['budget_k1_s'] * 1e3:.1f} / {r['budget_k5_s'] * 1e3:.1f} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line of ``bench roofline`` (parsed before torch is imported)."""
    ap = argparse.ArgumentParser(prog="bench roofline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="pi05", help="model preset (default pi05)")
    ap.add_argument(
        "--cameras", type=int, default=3, help="cameras C (default 3, the three image slots; LIBERO uses 2)"
    )
    ap.add_argument("--prompt-tokens", type=int, default=200, help="prompt tokens (default 200, π0.5's max_token_len)")
    ap.add_argument("--steps", type=int, default=10, help="denoise steps S (default 10)")
    ap.add_argument("--horizon", type=int, default=10, help="action tokens H per chunk (default 10)")
    ap.add_argument("--batch", type=int, default=30, help="decode batch B of the second decode column (default 30)")
    ap.add_argument(
        "--tokens",
        type=int,
        default=30,
        help="tokens N per request: frame rows ceil(N/k), context prefix + N (default 30)",
    )
    ap.add_argument(
        "--target-hz", type=float, default=70.0, help="action-rate target of the budget column (default 70)"
    )
    ap.add_argument("--cpu", action="store_true", help="add a row probed on this CPU (a few seconds)")
    ap.add_argument("--json", type=Path, metavar="PATH", help="write the numbers as JSON")
    a = ap.parse_args(argv)
    for name in ("cameras", "prompt_tokens", "steps", "horizon", "batch", "tokens", "target_hz"):
        if getattr(a, name) < (0 if name == "prompt_tokens" else 1):
            ap.error(f"--{name.replace('_', '-')} must be positive")
    return a


def main(argv: list[str] | None = None) -> int:
    """Console entry (``bench roofline …``): print the table, write ``--json``."""
    a = parse_args(argv)
    from ..core.config import get_preset

    cfg = get_preset(a.preset)
    w = Workload(a.cameras, a.prompt_tokens, a.horizon, a.steps, a.batch, a.tokens)
    devices = list(DEVICES) + ([probe_cpu()] if a.cpu else [])
    doc = predict(cfg, w, devices, a.target_hz)
    print(markdown(doc))
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=1))
        print(f"wrote {a.json}", file=sys.stderr)
    return 0


__all__ = [
    "DEVICES",
    "FORMATS",
    "act_bytes",
    "against_floor",
    "device_spec",
    "WEIGHT_BYTES",
    "DeviceSpec",
    "FramePrediction",
    "ParamGroups",
    "StageCost",
    "Workload",
    "budget",
    "classify",
    "decode_work",
    "floor",
    "frame",
    "frame_rows",
    "main",
    "markdown",
    "model_param_count",
    "param_groups",
    "parse_args",
    "predict",
    "probe_cpu",
    "stage_work",
    "stages",
]
