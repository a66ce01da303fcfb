"""PNG plots of ``bench`` results (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .report import MODES, STAGES

COLORS = {"isolated": "tab:gray", "shared_kv": "tab:blue", "unified": "tab:red"}
STAGE_COLORS = {
    "preprocess": "#bbbbbb",
    "vision": "#8fbbd9",
    "prefill": "#1f77b4",
    "denoise": "#2ca02c",
    "fwd_decode": "#ff7f0e",
    "fwd_start": "#ffbb78",
    "build": "#d62728",
    "sample": "#9467bd",
    "other": "#e377c2",
}


def _plt() -> Any:  # matplotlib.pyplot (a module)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def speedup_vs_n(rows: list[dict[str, Any]], points: dict[str, dict[str, Any]], path: Path) -> Path:
    """Speedup over isolated vs N, one line per k (unified solid, shared_kv dashed), at the paper's
    layout/S/arrival (the most common one in the run)."""
    plt = _plt()
    base = max(
        ({(p["layout"], p["steps"], p["arrival"]) for p in points.values()}),
        key=lambda c: sum((p["layout"], p["steps"], p["arrival"]) == c for p in points.values()),
    )
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ks = sorted({p["k"] for p in points.values()})
    cmap = plt.get_cmap("viridis")
    for i, k in enumerate(ks):
        for mode, style in (("unified", "-o"), ("shared_kv", "--x")):
            pts = sorted(
                (points[r["point"]]["tokens"], r["speedup"])
                for r in rows
                if r["mode"] == mode
                and r["speedup"] is not None
                and points[r["point"]]["k"] == k
                and (points[r["point"]]["layout"], points[r["point"]]["steps"], points[r["point"]]["arrival"]) == base
            )
            if pts:
                ax.plot(
                    *zip(*pts),
                    style,
                    color=cmap(i / max(1, len(ks) - 1)),
                    label=f"unified k={k}" if mode == "unified" else ("shared_kv (dashed, x)" if i == 0 else None),
                )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("N tokens per request")
    ax.set_ylabel("speedup over isolated (frame time)")
    ax.set_title(f"speedup vs N — {base[0]}, S={base[1]}, {base[2]} req/frame")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def hz_vs_toks(rows: list[dict[str, Any]], path: Path) -> Path:
    """Action frequency vs language throughput, one colour per mode (every point of the run)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for mode in MODES:
        xs = [r["tok_s"] for r in rows if r["mode"] == mode]
        ys = [r["action_hz"] for r in rows if r["mode"] == mode]
        ax.scatter(xs, ys, color=COLORS[mode], label=mode, s=22, alpha=0.8)
    ax.set_xlabel("language throughput (tok/s)")
    ax.set_ylabel("action frequency H/T (Hz)")
    ax.set_title("action Hz vs tok/s per mode")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def stage_bars(rows: list[dict[str, Any]], path: Path, max_points: int = 8) -> Path:
    """Stacked mean stage times per (point, mode) for the first ``max_points`` points."""
    plt = _plt()
    keys = list(dict.fromkeys(r["point"] for r in rows))[:max_points]
    sel = [r for k in keys for m in MODES for r in rows if r["point"] == k and r["mode"] == m]
    fig, ax = plt.subplots(figsize=(max(6.4, 0.55 * len(sel) + 3.2), 4.6))
    bottoms = [0.0] * len(sel)
    for s in STAGES:
        vals = [max(0.0, r["stages_ms"][s]) for r in sel]
        ax.bar(range(len(sel)), vals, bottom=bottoms, color=STAGE_COLORS[s], label=s)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_xticks(range(len(sel)))
    ax.set_xticklabels([f"{r['point']}\n{r['mode']}" for r in sel], rotation=70, fontsize=6, ha="right")
    ax.set_ylabel("mean time per frame (ms)")
    ax.set_title("stage times per frame (overhead = build + sample + other)", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(doc: dict[str, Any], out: Path) -> list[str]:
    """Write the three plots next to the JSON; returns their file names."""
    points = {p["point"]["key"]: p["point"] for p in doc["points"]}
    rows = doc["summary"]
    if not rows:
        return []
    files = [
        speedup_vs_n(rows, points, out / "speedup_vs_n.png"),
        hz_vs_toks(rows, out / "hz_vs_toks.png"),
        stage_bars(rows, out / "stages.png"),
    ]
    return [f.name for f in files]


__all__ = ["write_plots", "speedup_vs_n", "hz_vs_toks", "stage_bars"]
