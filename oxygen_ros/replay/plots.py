"""PNG plots of a replay (matplotlib, no GUI: figures are rendered with the Agg canvas).

- ``timeline.png``: every frame on the wall clock with its stages (vision, prefill, denoise,
  request admission, batched decode, bookkeeping), and per-frame stage times against the deadline;
- ``trajectories.png``: for a few joints, the recorded joint state, the recorded reference command
  (if the bag has one) and every predicted action chunk at the times it covers;
- ``decode_batch.png``: decode batch size, running requests and tokens per frame over time;
- ``action_error.png`` (only with a usable reference, :mod:`oxygen_ros.replay.accuracy`): open-loop
  error vs horizon index (policy and hold baseline) and the per-joint normalised MAE.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from oxygen_ros.replay.report import STAGES, ReplayStats

__all__ = ["pick_joints", "save_plots"]

_COLORS = {
    "vision": "#4c72b0",
    "prefill": "#55a868",
    "denoise": "#c44e52",
    "start": "#8172b2",
    "decode": "#ccb974",
    "bookkeeping": "#a0a0a0",
}
_MAX_CHUNKS = 200
_GANTT_FRAMES = 8


def pick_joints(names: Sequence[str], n: int = 4) -> list[int]:
    """Indices of up to ``n`` joints to plot: for ALOHA-like names the first arm joint, an elbow
    and both grippers; otherwise joints spread over the vector."""
    want = [i for i, name in enumerate(names) if "gripper" in name]
    first = [i for i, name in enumerate(names) if "waist" in name or "shoulder_pan" in name][:1]
    elbow = [i for i, name in enumerate(names) if "elbow" in name][:1]
    picked = list(dict.fromkeys(first + elbow + want))[:n]
    if len(picked) < min(n, len(names)):
        spread = np.linspace(0, len(names) - 1, num=min(n, len(names))).round().astype(int).tolist()
        picked = list(dict.fromkeys(picked + spread))[:n]
    return sorted(picked)


def _timeline(stats: ReplayStats, path: Path) -> Path:
    fig = Figure(figsize=(11, 6), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1)
    first = next((i for i, f in enumerate(stats.frames) if f.has_obs and not f.warmup), 0)
    window = stats.frames[first : first + _GANTT_FRAMES]
    for stage in STAGES:
        spans = []
        for f in window:
            offset = sum(getattr(f, s) for s in STAGES[: STAGES.index(stage)])
            if getattr(f, stage) > 0:
                spans.append((f.wall_start + offset, getattr(f, stage)))
        ax1.broken_barh(spans, (0, 1), facecolors=_COLORS[stage], label=stage)
    dropped = [f.wall_start for f in window if f.has_obs and not f.action]
    if dropped:
        ax1.plot(dropped, [1.15] * len(dropped), "kx", label="frame without chunk")
    ax1.set_yticks([])
    ax1.set_xlabel("wall time since start [s]")
    ax1.set_title(f"frame timeline: stages of frames {first}-{first + len(window) - 1} (all frames below)")
    ax1.legend(ncols=7, fontsize=8, loc="upper right")
    ax1.set_ylim(0, 1.4)
    idx = np.arange(len(stats.frames))
    bottom = np.zeros(len(stats.frames))
    for stage in STAGES:
        vals = np.array([getattr(f, stage) for f in stats.frames]) * 1e3
        ax2.bar(idx, vals, bottom=bottom, color=_COLORS[stage], width=1.0, label=stage)
        bottom += vals
    deadline = stats.meta.get("frame_deadline_s") or stats.meta.get("input_period_s")
    if deadline:
        ax2.axhline(deadline * 1e3, color="k", ls="--", lw=1, label=f"deadline {deadline * 1e3:.0f} ms")
    ax2.set_xlabel("frame")
    ax2.set_ylabel("time [ms]")
    ax2.legend(ncols=4, fontsize=8)
    fig.savefig(path, dpi=110)
    return path


def _trajectories(stats: ReplayStats, sim: Any, path: Path) -> Path:
    names = list(stats.meta.get("joint_names", []))
    joints = pick_joints(names)
    period = float(stats.meta.get("control_period_s", 0.02))
    t0 = sim.states[0][0] if sim.states else (sim.chunks[0].stamp if sim.chunks else 0.0)
    fig = Figure(figsize=(11, 2.4 * max(len(joints), 1)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(max(len(joints), 1), 1, sharex=True))
    chunks = sim.chunks[:: max(1, len(sim.chunks) // _MAX_CHUNKS)]
    colors = [(0.85, 0.2 + 0.6 * i / max(len(chunks) - 1, 1), 0.1) for i in range(len(chunks))]
    for ax, j in zip(axes, joints):
        for c, color in zip(chunks, colors):
            a = np.asarray(c.actions)
            t = c.stamp - t0 + period * np.arange(1, a.shape[0] + 1)
            ax.plot(t, a[:, j], color=color, lw=0.8, alpha=0.55)
        if sim.reference:
            ax.plot(
                [s - t0 for s, _ in sim.reference],
                [v[j] for _, v in sim.reference],
                color="#2060c0",
                ls="--",
                lw=1.2,
                label="recorded command",
            )
        if sim.states:
            ax.plot(
                [s - t0 for s, _ in sim.states],
                [v[j] for _, v in sim.states],
                "k",
                lw=1.4,
                label="recorded joint state",
            )
        ax.plot([], [], color=(0.85, 0.5, 0.1), lw=0.8, label="predicted chunks (early → late)")
        ax.set_ylabel(names[j] if j < len(names) else f"joint {j}", fontsize=8)
        ax.legend(fontsize=7, loc="upper right")
    axes[0].set_title("predicted action chunks vs recorded trajectories")
    axes[-1].set_xlabel("time since the first joint state [s] (header stamps)")
    fig.savefig(path, dpi=110)
    return path


def _decode_batch(stats: ReplayStats, path: Path) -> Path:
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    ax = fig.subplots()
    t = [f.wall_start for f in stats.frames]
    ax.step(t, [f.decode_batch for f in stats.frames], where="post", color="#c44e52", label="decode batch size")
    ax.step(
        t,
        [f.running for f in stats.frames],
        where="post",
        color="#4c72b0",
        ls=":",
        label="running requests after the frame",
    )
    ax.set_xlabel("wall time since start [s]")
    ax.set_ylabel("requests")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax2 = ax.twinx()
    ax2.bar(
        t,
        [f.tokens for f in stats.frames],
        width=0.6 * (np.median(np.diff(t)) if len(t) > 1 else 1),
        color="#ccb974",
        alpha=0.5,
        label="tokens emitted",
    )
    ax2.set_ylabel("tokens per frame")
    lines = ax.get_legend_handles_labels()
    bars = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + bars[0], lines[1] + bars[1], fontsize=8, loc="upper right")
    ax.set_title("cross-frame continuous batching: decode batch over time")
    fig.savefig(path, dpi=110)
    return path


def _action_error(acc: dict[str, Any], path: Path) -> Path:
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, width_ratios=(1, 1.4))
    ax1b = ax1.twinx()
    base = acc["hold_baseline"]
    for label, src, color in (("policy", acc, "#c44e52"), ("hold baseline", base, "#4c72b0")):
        for ax, key, ls, what in ((ax1, "mae", "-", "MAE"), (ax1b, "mae_norm", ":", "normalised MAE")):
            vals = np.array([np.nan if v is None else v for v in src["by_horizon"][key]], dtype=float)
            ax.plot(np.arange(len(vals)), vals, ls=ls, color=color, label=f"{label} {what}")
    ax1.set_xlabel("horizon index")
    ax1.set_ylabel("MAE, mean over joints (joint units, solid)")
    ax1b.set_ylabel("normalised MAE (dotted)")
    lines, more = ax1.get_legend_handles_labels(), ax1b.get_legend_handles_labels()
    ax1.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7)
    ax1.set_title(f"open-loop error vs {acc['reference_topic']}")
    names = list(acc["per_joint"])
    x = np.arange(len(names))
    for k, (label, per, color) in enumerate(
        (("policy", acc["per_joint"], "#c44e52"), ("hold baseline", base.get("per_joint", {}), "#4c72b0"))
    ):
        vals = np.array(
            [np.nan if per.get(n, {}).get("mae_norm") is None else per[n]["mae_norm"] for n in names], dtype=float
        )
        ax2.bar(x + (k - 0.5) * 0.4, vals, width=0.4, color=color, label=label)
    ax2.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    ax2.set_ylabel("MAE / recorded range (q01-q99)")
    ax2.set_title("per-joint normalised MAE (no bar: missing joint or range ~0)")
    ax2.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path


def save_plots(stats: ReplayStats, sim: Any, out: Path) -> list[Path]:
    """Write the PNGs into ``out``; returns their paths (none when there is no frame;
    ``action_error.png`` only when the action accuracy was measured)."""
    if not stats.frames:
        return []
    paths = [
        _timeline(stats, out / "timeline.png"),
        _trajectories(stats, sim, out / "trajectories.png"),
        _decode_batch(stats, out / "decode_batch.png"),
    ]
    if stats.accuracy.get("available"):
        paths.append(_action_error(stats.accuracy, out / "action_error.png"))
    return paths
