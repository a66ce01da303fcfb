"""The evaluation's output folder: settings, per-episode results, the table and the aggregate report.

Layout of ``--out``::

    evaluation.json          what was asked (kind, options, episode ids): a rerun must match it
    episodes/<id>/           each episode's own outputs (replay report and plots, or loop logs)
    episodes/<id>/result.json  the episode's row, written the moment it ends
    episodes.csv, episodes.json  the per-episode table, one row per episode, in episode order
    report.txt, report.json  the aggregate (success rate with its 95 % Wilson interval per policy
                             and latency, answer accuracy beside it when the episodes asked; or
                             mean action error against the hold-the-state baseline)
    episodes/<id>/episode.mp4  the episode's video (``--video first|all``)

A rerun into the same folder skips every episode whose ``result.json`` says ``ok`` and runs the
failed, timed-out and missing ones again.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oxygen_ros.evaluate.episodes import CLOSED_LOOP, Episode, EvaluateError
from oxygen_ros.evaluate.runner import CLOSED_LOOP_METRICS, OPEN_LOOP_METRICS

__all__ = ["OutputFolder", "aggregate", "answer_totals", "compared_rows", "format_aggregate", "wilson_interval"]

_BASE_COLUMNS = (
    "episode",
    "kind",
    "model",
    "bag",
    "seed",
    "policy",
    "run_policy",
    "latency_ms",
    "status",
    "error",
    "note",
    "exit_code",
    "wall_s",
)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a success rate (``scipy.stats.binomtest(...).proportion_ci``).

    Returns:
        ``(low, high)`` in [0, 1]; ``(nan, nan)`` when ``n`` is 0.
    """
    if n <= 0:
        return math.nan, math.nan
    from scipy.stats import binomtest

    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


class OutputFolder:
    """``--out`` of one evaluation (see the module doc).

    Args:
        root: the folder (created).
        settings: what defines the evaluation (kind, options); compared with a previous run's.
        overwrite: delete a previous evaluation's files first instead of resuming it.

    Raises:
        EvaluateError: the folder holds an evaluation with other settings (and not ``overwrite``),
            or holds files that are not an evaluation's.
    """

    def __init__(self, root: Path, settings: dict[str, Any], overwrite: bool = False) -> None:
        self.root = Path(root)
        self.episodes_dir = self.root / "episodes"
        marker = self.root / "evaluation.json"
        if self.root.exists() and any(self.root.iterdir()):
            if not marker.is_file():
                raise EvaluateError(f"{self.root} exists and is not an evaluation folder; choose another --out")
            if overwrite:
                shutil.rmtree(self.root)
            else:
                previous = json.loads(marker.read_text())
                if previous != settings:
                    diff = sorted(k for k in set(previous) | set(settings) if previous.get(k) != settings.get(k))
                    raise EvaluateError(
                        f"{self.root} holds an evaluation with other settings "
                        f"({', '.join(diff)}); use another --out, or --overwrite "
                        "to start it again"
                    )
        self.episodes_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(settings, indent=1))

    def result_path(self, episode: Episode) -> Path:
        return self.episodes_dir / episode.id / "result.json"

    def finished(self, episode: Episode) -> dict[str, Any] | None:
        """The saved row of an episode that ended ``ok`` with the same arguments, else None (it must
        run again)."""
        try:
            row = json.loads(self.result_path(episode).read_text())
        except (OSError, ValueError):
            return None
        # the same command (bag path, episode length, seed ...): an id alone is not the episode
        return row if row.get("status") == "ok" and row.get("args") == list(episode.args) else None

    def save_row(self, row: dict[str, Any]) -> None:
        path = self.episodes_dir / row["episode"] / "result.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(row, indent=1, default=str))
        tmp.replace(path)

    def write_table(self, rows: Sequence[dict[str, Any]], kind: str) -> list[Path]:
        """``episodes.csv`` (scalar columns) and ``episodes.json`` (everything), in row order."""
        metrics = CLOSED_LOOP_METRICS if kind == CLOSED_LOOP else OPEN_LOOP_METRICS
        present = {k for r in rows for k in r}
        columns = [c for c in (*_BASE_COLUMNS, *metrics) if c in present]
        csv_path, json_path = self.root / "episodes.csv", self.root / "episodes.json"
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({c: _cell(r.get(c)) for c in columns})
        json_path.write_text(json.dumps(list(rows), indent=1, default=str))
        return [csv_path, json_path]


def compared_rows(runs: Sequence[tuple[str, Path]]) -> list[dict[str, Any]]:
    """The rows of finished closed-loop evaluations, each relabelled for one combined report:
    ``policy`` becomes the run's label (so the aggregate groups by run and latency) and the
    episode id is prefixed with it; the run's own policy is kept as ``run_policy``.

    Args:
        runs: (label, ``--out`` folder of a finished ``evaluate closed-loop``) pairs.

    Raises:
        EvaluateError: a label given twice, a folder without a finished table (``episodes.json``),
            or an evaluation that is not closed-loop.
    """
    labels = [label for label, _ in runs]
    if len(set(labels)) != len(labels) or not all(labels):
        raise EvaluateError(f"compare: every run needs its own non-empty label, got {labels}")
    out: list[dict[str, Any]] = []
    for label, root in runs:
        try:
            kind = json.loads((Path(root) / "evaluation.json").read_text())["kind"]
            rows = json.loads((Path(root) / "episodes.json").read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise EvaluateError(f"compare: {root} is not a finished evaluation ({exc})") from exc
        if kind != CLOSED_LOOP:
            raise EvaluateError(f"compare: {root} is a {kind} evaluation; compare takes closed-loop ones")
        for r in rows:
            out.append({**r, "episode": f"{label}/{r['episode']}", "policy": label, "run_policy": r.get("policy")})
    return out


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def _mean(values: Sequence[Any]) -> float | None:
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(float(v))]
    return statistics.fmean(vals) if vals else None


def _curve_mean(curves: Sequence[Sequence[Any]]) -> list[float | None]:
    n = max((len(c) for c in curves), default=0)
    return [_mean([c[i] for c in curves if i < len(c)]) for i in range(n)]


def answer_totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The scored answers of completed closed-loop rows pooled: ``answer_episodes`` (rows that
    asked), ``answers_asked``, ``answers_answered``, ``answers_correct`` and ``answer_accuracy``
    = correct / asked (``None`` when nothing was asked). Asks of one episode are not independent,
    so no interval is given; a row without answers (``answers_asked`` ``None``) is left out."""
    scored = [r for r in rows if isinstance(r.get("answers_asked"), int)]
    asked = sum(int(r["answers_asked"]) for r in scored)
    correct = sum(int(r.get("answers_correct") or 0) for r in scored)
    return {
        "answer_episodes": len(scored),
        "answers_asked": asked,
        "answers_answered": sum(int(r.get("answers_answered") or 0) for r in scored),
        "answers_correct": correct,
        "answer_accuracy": correct / asked if asked else None,
    }


def aggregate(rows: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    """Aggregate of the table: see :func:`format_aggregate` for what it holds."""
    failed = [
        {"episode": r["episode"], "status": r["status"], "error": r.get("error", "")}
        for r in rows
        if r["status"] != "ok"
    ]
    ok = [r for r in rows if r["status"] == "ok"]
    out: dict[str, Any] = {"kind": kind, "episodes": len(rows), "completed": len(ok), "failed": failed}
    if kind == CLOSED_LOOP:
        groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault((r.get("policy", ""), float(r.get("latency_ms", 0.0))), []).append(r)
        out["groups"] = []
        for (policy, lat), rs in sorted(groups.items()):
            done = [r for r in rs if r["status"] == "ok"]
            wins = [r for r in done if r.get("success")]
            low, high = wilson_interval(len(wins), len(done))
            touched = [r for r in done if isinstance(r.get("max_reward"), (int, float)) and r["max_reward"] >= 1]
            t_low, t_high = wilson_interval(len(touched), len(done))
            out["groups"].append(
                {
                    **answer_totals(done),
                    "policy": policy,
                    "latency_ms": lat,
                    "episodes": len(rs),
                    "completed": len(done),
                    "failed": len(rs) - len(done),
                    "successes": len(wins),
                    "success_rate": len(wins) / len(done) if done else None,
                    "wilson95_low": None if math.isnan(low) else low,
                    "wilson95_high": None if math.isnan(high) else high,
                    "time_to_success_s_mean": _mean([r.get("time_to_success_s") for r in wins]),
                    "path_length_rad_mean": _mean([r.get("path_length_rad") for r in done]),
                    "max_switch_jump_max": max(
                        (
                            float(r["max_switch_jump"])
                            for r in done
                            if isinstance(r.get("max_switch_jump"), (int, float))
                            and math.isfinite(r["max_switch_jump"])
                        ),
                        default=None,
                    ),
                    "lift_max_m_mean": _mean([r.get("lift_max_m") for r in done]),
                    "touched": len(touched),
                    "touched_rate": len(touched) / len(done) if done else None,
                    "touched_wilson95_low": None if math.isnan(t_low) else t_low,
                    "touched_wilson95_high": None if math.isnan(t_high) else t_high,
                }
            )
        out["answers"] = answer_totals(ok)
        return out
    with_ref = [r for r in ok if r.get("reference_available")]
    out["without_reference"] = [r["episode"] for r in ok if not r.get("reference_available")]
    out["with_reference"] = len(with_ref)
    kinds: dict[str, int] = {}
    for r in with_ref:  # commands and joint states are different references: say how many of each
        kinds[str(r.get("reference_kind"))] = kinds.get(str(r.get("reference_kind")), 0) + 1
    out["reference_kinds"] = kinds
    for key in (
        "mae",
        "rmse",
        "mae_norm",
        "rmse_norm",
        "arms_mae_norm",
        "grippers_mae_norm",
        "hold_mae",
        "hold_mae_norm",
        "first_point_mae_norm",
    ):
        out[key] = _mean([r.get(key) for r in with_ref])
    out["beats_hold_baseline"] = sum(
        1
        for r in with_ref
        if r.get("mae_norm") is not None and r.get("hold_mae_norm") is not None and r["mae_norm"] < r["hold_mae_norm"]
    )
    out["by_horizon_mae_norm"] = _curve_mean([r.get("by_horizon_mae_norm") or [] for r in with_ref])
    out["hold_by_horizon_mae_norm"] = _curve_mean([r.get("hold_by_horizon_mae_norm") or [] for r in with_ref])
    return out


def _f(v: Any, nd: int = 3, unit: str = "") -> str:
    return "-" if v is None else f"{v:.{nd}f}{unit}"


def format_aggregate(agg: dict[str, Any]) -> str:
    """The aggregate as text: per (policy, latency) success rate with its 95 % Wilson interval,
    mean time to success, path length, largest switch jump and how many episodes the right gripper
    touched the cube (gym-aloha's staged reward >= 1: the partial progress a policy makes before it
    succeeds), and when the episodes asked a
    checkable question the answers correct / asked and the accuracy, per group and overall
    (closed loop); or the mean action
    error in joint units and normalised by each joint's recorded range, arms and grippers apart,
    next to the hold-the-state baseline (open loop). Failed episodes are listed with their error."""
    lines = [
        f"evaluate: {agg['kind'].replace('_', '-')}, {agg['episodes']} episodes, "
        f"{agg['completed']} completed, {len(agg['failed'])} failed"
    ]
    if agg["kind"] == CLOSED_LOOP:
        asked = bool((agg.get("answers") or {}).get("answers_asked"))
        w = max([9, *(len(g["policy"]) for g in agg["groups"])])
        lines.append(
            f"  {'policy':<{w}} {'latency':>8} {'success':>9} {'rate':>6} {'95% Wilson':>15} "
            f"{'t_success':>9} {'path rad':>8} {'max jump':>8} {'touched':>9}"
            + (f" {'answers':>11} {'acc':>5}" if asked else "")
        )
        for g in agg["groups"]:
            ci = f"[{g['wilson95_low']:.2f}, {g['wilson95_high']:.2f}]" if g["wilson95_low"] is not None else "-"
            acc = _f(g.get("answer_accuracy"), 2)
            touched = f"{g['touched']}/{g['completed']}"
            ans = (
                f" {g.get('answers_correct', 0):>5}/{g.get('answers_asked', 0):<5} {acc:>5}"
                if g.get("answers_asked")
                else f" {'-':>11} {'-':>5}"  # this group asked nothing (e.g. the oracle beside a model)
            )
            lines.append(
                f"  {g['policy']:<{w}} {g['latency_ms']:>6g}ms {g['successes']:>4}/"
                f"{g['completed']:<4} {_f(g['success_rate'], 2):>6} {ci:>15} "
                f"{_f(g['time_to_success_s_mean'], 2, 's'):>9} {_f(g['path_length_rad_mean'], 2):>8} "
                f"{_f(g['max_switch_jump_max'], 3):>8} {touched:>9}"
                + (ans if asked else "")
                + (f"  ({g['failed']} failed, not in the rate)" if g["failed"] else "")
            )
        if asked:
            a = agg["answers"]
            lines.append(
                f"  answers (all groups): {a['answers_correct']}/{a['answers_asked']} correct "
                f"(accuracy {_f(a['answer_accuracy'], 2)}), {a['answers_answered']} answered, in "
                f"{a['answer_episodes']} episodes; an unanswered ask counts as wrong"
            )
    else:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(agg.get("reference_kinds", {}).items()))
        lines.append(
            f"  bags with a reference: {agg['with_reference']}"
            + (f" ({kinds})" if kinds else "")
            + (f"; without: {', '.join(agg['without_reference'])}" if agg["without_reference"] else "")
        )
        lines.append(f"  {'':<22} {'policy':>9} {'hold state':>11}")
        for label, key, hold in (
            ("MAE (joint units)", "mae", "hold_mae"),
            ("MAE / joint range", "mae_norm", "hold_mae_norm"),
        ):
            lines.append(f"  {label:<22} {_f(agg[key], 4):>9} {_f(agg[hold], 4):>11}")
        lines.append(
            f"  arms / grippers (norm.) {_f(agg['arms_mae_norm'], 4)} / "
            f"{_f(agg['grippers_mae_norm'], 4)}; first point {_f(agg['first_point_mae_norm'], 4)}"
        )
        lines.append(
            f"  policy better than holding the state on {agg['beats_hold_baseline']} of {agg['with_reference']} bags"
        )
    for f in agg["failed"]:
        lines.append(f"  {f['status'].upper():<9} {f['episode']}: {f['error']}")
    return "\n".join(lines)
