"""Run one episode as its own process and turn what it wrote into one table row.

The episode runs as ``python -m <module>`` in a new session (its own process group), with its
output in ``<episode folder>/output.log``. A timeout first sends SIGINT to the whole group (so
``closed_loop`` stops its nodes and writes its report), then SIGKILL after a grace period: an
episode never outlives its time and never leaves nodes behind. Whatever happens, the result is a
row — a crash, a bad bag or a timeout is ``status='failed'`` / ``'timed_out'`` with the reason in
``error``, never a missing row.

Row columns: ``episode``, ``kind``, the episode's own columns (``bag``; or ``seed``, ``policy``,
``latency_ms``), ``status``, ``error``, ``exit_code``, ``wall_s``, then the metrics of the kind
(:data:`OPEN_LOOP_METRICS` from ``replay``'s ``report.json`` ``action_accuracy``;
:data:`CLOSED_LOOP_METRICS` from ``closed_loop``'s ``report['episode']``).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from oxygen_ros.evaluate.episodes import CLOSED_LOOP, Episode

__all__ = [
    "CLOSED_LOOP_METRICS",
    "OPEN_LOOP_METRICS",
    "PID_FILE",
    "STOP_FILE",
    "kill_episode_group",
    "row_from_outputs",
    "run_episode",
]

OPEN_LOOP_METRICS = (
    "reference_available",
    "reference_kind",
    "reference_topic",
    "n_chunks",
    "n_points",
    "mae",
    "rmse",
    "mae_norm",
    "rmse_norm",
    "arms_mae_norm",
    "grippers_mae_norm",
    "hold_mae",
    "hold_mae_norm",
    "first_point_mae_norm",
    "chunks",
    "frame_time_p50_ms",
)
"""Open-loop columns: accuracy in joint units / normalised by the joint's recorded range (means
over joints), arms and grippers apart, the hold-the-state baseline, the error of a chunk's first
point (wall-clock independent); the replay's chunk count and median frame time (machine-dependent)."""

CLOSED_LOOP_METRICS = (
    "success",
    "time_to_success_s",
    "episode_s",
    "path_length_rad",
    "gripper_path_length",
    "max_switch_jump",
    "lift_max_m",
    "max_reward",
    "checks_failed",
    "answers_asked",
    "answers_answered",
    "answers_correct",
    "answer_accuracy",
    "video",
)
"""Closed-loop columns: the sim's success verdict and per-episode measures (see
:mod:`oxygen_ros.sim.closed_loop.run`), the names of the loop's failed safety checks, the scored
answers of ``report['answers']`` (``None`` when the episode asked nothing checkable; the answers
themselves are the row's ``answers`` list, in ``episodes.json`` only) and the episode's video file
(``None`` without one)."""

PID_FILE = "episode.pid"
"""Written in the episode folder when its process starts: the id of its process group (and the
time it started running, as the file's modification time)."""

STOP_FILE = "evaluate.stop"
"""Written beside the episode folders by an interrupted ``evaluate`` before it signals the running
episodes: an episode whose process starts after that (so its pid file was not there to be found)
stops itself, and one not started yet does not start."""

GRACE_S = 30.0
"""Seconds between SIGINT and SIGKILL of a timed-out episode's process group."""


def _tail(text: str, lines: int = 3) -> str:
    """The reason in a failed episode's output: from its last ``error``/``Error`` line on (the
    message may span lines), else its last lines; joined with `` | ``."""
    kept = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    marked = [i for i, ln in enumerate(kept) if re.search(r"\berror\b|Error\b", ln)]
    start = marked[-1] if marked else max(0, len(kept) - lines)
    return " | ".join(kept[start : start + lines])[:600]


def _num(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _open_loop_metrics(out_dir: Path) -> tuple[dict[str, Any], str]:
    """Metrics from ``replay``'s ``report.json`` (empty + reason when it is missing)."""
    path = out_dir / "report.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {}, f"no readable report.json ({type(exc).__name__})"
    acc = data.get("action_accuracy") or {}
    summary = data.get("summary") or {}
    hold = acc.get("hold_baseline") or {}
    by_h = (acc.get("by_horizon") or {}).get("mae_norm") or []
    frame_p50 = _num(summary.get("frame_time_p50_s"))
    row = {
        "reference_available": bool(acc.get("available", False)),
        "reference_kind": acc.get("reference_kind"),
        "reference_topic": acc.get("reference_topic"),
        "reference_note": (acc.get("message") or "") if acc.get("available") else "",
        "n_chunks": acc.get("n_chunks"),
        "n_points": acc.get("n_points"),
        "mae": _num(acc.get("mae")),
        "rmse": _num(acc.get("rmse")),
        "mae_norm": _num(acc.get("mae_norm")),
        "rmse_norm": _num(acc.get("rmse_norm")),
        "arms_mae_norm": _num((acc.get("arms") or {}).get("mae_norm")),
        "grippers_mae_norm": _num((acc.get("grippers") or {}).get("mae_norm")),
        "hold_mae": _num(hold.get("mae")),
        "hold_mae_norm": _num(hold.get("mae_norm")),
        "first_point_mae_norm": _num(by_h[0]) if by_h else None,
        "chunks": summary.get("chunks"),
        "frame_time_p50_ms": None if frame_p50 is None else round(frame_p50 * 1e3, 2),
        "by_horizon_mae_norm": [_num(v) for v in by_h],
        "hold_by_horizon_mae_norm": [_num(v) for v in (hold.get("by_horizon") or {}).get("mae_norm", [])],
    }
    return row, "" if acc.get("available", False) else (acc.get("message") or "no reference")


def _closed_loop_metrics(out_dir: Path) -> tuple[dict[str, Any], str]:
    """Metrics from ``closed_loop``'s JSON report; the error is the loop's own when it has one."""
    try:
        report = json.loads((out_dir / "report.json").read_text())
    except (OSError, ValueError) as exc:
        return {}, f"no readable report.json ({type(exc).__name__})"
    ep = report.get("episode") or {}
    failed = sorted(
        k
        for k, v in (report.get("checks") or {}).items()
        if v is False or (isinstance(v, dict) and v.get("ok") is False)
    )
    row = {k: ep.get(k) for k in CLOSED_LOOP_METRICS[: CLOSED_LOOP_METRICS.index("checks_failed")]}
    row["success"] = bool(ep.get("success", False))
    row["checks_failed"] = " ".join(failed)
    answers = report.get("answers")
    if isinstance(answers, dict):
        for col, key in (("answers_asked", "asked"), ("answers_answered", "answered"), ("answers_correct", "correct")):
            row[col] = int(answers.get(key) or 0)
        row["answer_accuracy"] = _num(answers.get("accuracy"))
        row["answers"] = [{k: it.get(k) for k in ("answer", "truth", "correct")} for it in answers.get("items") or []]
    else:
        row.update(answers_asked=None, answers_answered=None, answers_correct=None, answer_accuracy=None)
    video = report.get("video") or {}
    row["video"] = video.get("path")
    error = report.get("error") or ("" if ep else "the report has no episode section")
    return row, error


def row_from_outputs(
    episode: Episode, out_dir: Path, exit_code: int | None, output: str, wall_s: float, timed_out: bool
) -> dict[str, Any]:
    """The table row of a finished (or killed) episode from what it left in ``out_dir``.

    Args:
        episode: the episode.
        out_dir: its folder.
        exit_code: the process's exit status (None if it never started).
        output: its stdout+stderr.
        wall_s: wall seconds it ran.
        timed_out: it was stopped at its time limit.
    """
    row: dict[str, Any] = {"episode": episode.id, "kind": episode.kind, **episode.columns, "args": list(episode.args)}
    if episode.kind == CLOSED_LOOP:
        metrics, error = _closed_loop_metrics(out_dir)
        ok = not error and exit_code in (0, 1)  # 1: a safety check failed; the episode still ran
    else:
        metrics, error = _open_loop_metrics(out_dir)
        ok = exit_code == 0 and bool(metrics)
        if exit_code == 0 and metrics and not metrics["reference_available"]:
            row["note"] = error  # ran fine; the bag has no usable reference (said, not zeros)
            error = ""
        elif metrics.get("reference_note"):
            row["note"] = metrics["reference_note"]  # e.g. compared with the joint states instead
    if timed_out:
        status, error = "timed_out", f"timed out after {wall_s:.0f} s" + (f"; {error}" if error else "")
    elif ok and not error:
        status = "ok"
    else:
        status = "failed"
        if not error or exit_code not in (0, 1):
            error = f"exit {exit_code}: {_tail(output) or error}"
    row.update(status=status, error=error if status != "ok" else "", exit_code=exit_code, wall_s=round(wall_s, 2))
    row.update(metrics)
    return row


def run_episode(
    episode: Episode, out_dir: Path, timeout_s: float, env: dict[str, str] | None = None, cwd: str | None = None
) -> dict[str, Any]:
    """Run ``episode`` into ``out_dir`` (created) as a process and return its row.

    Args:
        episode: what to run.
        out_dir: the episode's folder (``output.log`` and the command's outputs).
        timeout_s: wall-clock limit, seconds (SIGINT, then SIGKILL after :data:`GRACE_S`).
        env: extra environment variables.
        cwd: working directory of the episode's process (the driver's, so relative paths in its
            arguments mean the same).

    Never raises for a failing episode: the row says what happened.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("report.json", "result.json", PID_FILE):  # a previous attempt's: never read as this one's
        (out_dir / stale).unlink(missing_ok=True)
    cmd = episode.command(out_dir)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if episode.kind == CLOSED_LOOP:  # a free domain per episode (domain_coordinator), never a shared one
        full_env.pop("ROS_DOMAIN_ID", None)
    t0 = time.monotonic()
    timed_out = False
    with open(out_dir / "output.log", "w+b") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        stop = out_dir.parent / STOP_FILE
        if stop.exists():
            return row_from_outputs(episode, out_dir, None, "not started: the evaluation was interrupted", 0.0, False)
        try:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=cwd, start_new_session=True
            )
        except OSError as exc:
            return row_from_outputs(episode, out_dir, None, f"could not start: {exc}", 0.0, False)
        (out_dir / PID_FILE).write_text(str(proc.pid))  # its process group, for the driver's backstop
        try:
            # The driver writes the stop file, then signals the groups of the pid files it finds;
            # this side writes its pid file, then looks for the stop file: one of the two sees
            # the other, so an episode starting during an interrupt is stopped either way.
            if stop.exists():
                _stop_group(proc)
            proc.wait(timeout_s)
            _kill_group(proc)  # whatever the episode left running (a crashed loop's nodes)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_group(proc)
        except KeyboardInterrupt:  # Ctrl-C, or Ray cancelling the task: stop the episode first
            _stop_group(proc)
            raise
        wall = time.monotonic() - t0
        log.seek(0)
        output = log.read().decode(errors="replace").split("\n", 1)[-1]  # without the '$ cmd' line
    return row_from_outputs(episode, out_dir, proc.returncode, output, wall, timed_out)


def _kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_episode_group(out_dir: Path, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` (SIGKILL; SIGINT to let ``closed_loop`` stop its nodes and report) to the
    process group recorded in ``out_dir`` (an episode whose Ray task was cancelled, lost or is
    being interrupted: its processes run in their own session and would outlive the worker).
    Returns whether a group was signalled. Works on this machine only (a cluster node's own
    episodes end at their own time limit)."""
    try:
        pgid = int((out_dir / PID_FILE).read_text())
        os.killpg(pgid, sig)
        return True
    except (OSError, ValueError):
        return False


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT the episode's process group, SIGKILL it after the grace period."""
    _kill_group(proc, signal.SIGINT)
    try:
        proc.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc)
    proc.wait()


def _exec_module(argv: list[str]) -> None:
    """``python -m oxygen_ros.evaluate.runner MODULE ARGS...``: run MODULE as ``__main__`` with
    every signal unblocked and SIGINT handled as by a fresh Python (see :meth:`Episode.command`)."""
    import runpy
    import sys

    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    import sys

    _exec_module(sys.argv[1:])
