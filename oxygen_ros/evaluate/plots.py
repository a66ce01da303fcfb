"""Plots of an evaluation (matplotlib, Agg): ``success_rate.png`` (closed loop: success rate and
the rate of episodes where the right gripper touched the cube, per latency and policy with the
95 % Wilson interval, and the arms' mean joint path) or ``action_error.png`` (open loop: mean
normalised action error vs the horizon index, policy and hold-the-state baseline, and per bag)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oxygen_ros.evaluate.episodes import CLOSED_LOOP

__all__ = ["save_plots"]


def _success(agg: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.0), sharex=True)
    panels = (
        ("success_rate", "wilson95", "success rate (95 % Wilson interval)", "cube lifted and held"),
        ("touched_rate", "touched_wilson95", "touched rate (95 % Wilson interval)", "right gripper touched the cube"),
        ("path_length_rad_mean", None, "arm joint path, mean (rad)", "how much the arms move"),
    )
    for ax, (key, ci, ylabel, title) in zip(axes, panels, strict=True):
        for policy in sorted({g["policy"] for g in agg["groups"]}):
            gs = [g for g in agg["groups"] if g["policy"] == policy and g.get(key) is not None]
            if not gs:
                continue
            x = [g["latency_ms"] for g in gs]
            y = [g[key] for g in gs]
            ns = sorted({g["completed"] for g in gs})
            label = f"{policy} (n={'/'.join(map(str, ns))} per latency)"
            if ci is None:
                ax.plot(x, y, marker="o", label=label)
                continue
            err = [[r - g[f"{ci}_low"] for r, g in zip(y, gs)], [g[f"{ci}_high"] - r for r, g in zip(y, gs)]]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=4, label=label)
        ax.set_xlabel("added policy latency (ms)")
        ax.set_ylabel(ylabel)
        if ci is not None:
            ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(title)
    fig.suptitle("closed loop")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _errors(agg: dict[str, Any], rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.0))
    pol, hold = agg["by_horizon_mae_norm"], agg["hold_by_horizon_mae_norm"]
    a1.plot(range(len(pol)), [float("nan") if v is None else v for v in pol], label="policy")
    a1.plot(range(len(hold)), [float("nan") if v is None else v for v in hold], "--", label="hold state")
    a1.set_xlabel("horizon index (point of the chunk)")
    a1.set_ylabel("MAE / joint range (mean over joints and bags)")
    a1.grid(alpha=0.3)
    a1.legend()
    ok = [r for r in rows if r["status"] == "ok" and r.get("reference_available")]
    names = [r["episode"] for r in ok]
    xs = range(len(ok))

    def val(r: dict[str, Any], key: str) -> float:
        return float("nan") if r.get(key) is None else r[key]  # no bar, never a 0 that looks perfect

    a2.bar([x - 0.2 for x in xs], [val(r, "mae_norm") for r in ok], width=0.4, label="policy")
    a2.bar([x + 0.2 for x in xs], [val(r, "hold_mae_norm") for r in ok], width=0.4, label="hold state")
    a2.set_xticks(list(xs), names, rotation=45, ha="right", fontsize=7)
    a2.set_ylabel("MAE / joint range")
    a2.legend()
    fig.suptitle("open loop: predicted action vs the recorded reference")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_plots(agg: dict[str, Any], rows: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """Write the evaluation's plot into ``out``; returns the paths written (none without data)."""
    import matplotlib

    matplotlib.use("Agg")
    if agg["kind"] == CLOSED_LOOP:
        if not any(g["success_rate"] is not None for g in agg["groups"]):
            return []
        path = out / "success_rate.png"
        _success(agg, path)
    else:
        if not agg.get("with_reference"):
            return []
        path = out / "action_error.png"
        _errors(agg, rows, path)
    return [path]
