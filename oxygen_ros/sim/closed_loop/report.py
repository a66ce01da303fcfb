"""Report pieces of the ``closed_loop`` script: command-safety analysis, pass/fail checks and the
human-readable report (pure functions over the collected numbers)."""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

__all__ = ["answers_line", "num", "command_safety", "checks", "episode_line", "format_report", "switch_line"]


def rtc_line(rtc: dict[str, str]) -> str:
    """The oxygen node's ``rtc_*`` diagnostics in one line (on/off, delay, guided and unguided)."""
    if rtc.get("enabled") != "True":
        return "off"
    unguided = {k[len("unguided_") :]: v for k, v in rtc.items() if k.startswith("unguided_") and v != "0"}
    return (
        f"on, delay {rtc.get('delay_rows', '?')} rows ({rtc.get('delay_source', '?')}), "
        f"{rtc.get('guided', '0')} chunks guided, unguided {unguided or 'none'}"
    )


def num(values: dict[str, str], key: str) -> float:
    """``values[key]`` as a float (NaN when absent or not a number)."""
    try:
        return float(values.get(key, "nan"))
    except ValueError:
        return math.nan


def command_safety(executed: list[tuple[float, str, np.ndarray]], limit: float) -> dict[str, Any]:
    """Finite / step-size / hold checks over the executed commands."""
    rows = [p for _, _, p in executed]
    out: dict[str, Any] = {
        "executed_messages": len(rows),
        "non_finite": 0,
        "max_step_change": 0.0,
        "max_change_while_lost": 0.0,
        "lost_messages": 0,
        "step_limit": limit,
    }
    if not rows:
        return out
    arr = np.stack([r for r in rows if r.shape == rows[0].shape])
    out["non_finite"] = int((~np.isfinite(arr)).any(axis=1).sum())
    if len(arr) > 1:
        out["max_step_change"] = float(np.nanmax(np.abs(np.diff(arr, axis=0))))
    lost = [i for i, (_, state, _) in enumerate(executed) if state == "lost"]
    out["lost_messages"] = len(lost)
    for i in lost:
        if i > 0 and executed[i - 1][1] == "lost":
            d = float(np.max(np.abs(executed[i][2] - executed[i - 1][2])))
            out["max_change_while_lost"] = max(out["max_change_while_lost"], d)
    return out


def checks(args: argparse.Namespace, report: dict[str, Any]) -> None:
    c = report["checks"]
    sim, cmd = report["sim"], report["command"]
    codes = report.get("exit_codes", {})
    c["no_error"] = "error" not in report
    episode = getattr(args, "episode_s", 0) > 0
    c["frames"] = report["oxygen"]["chunks_seen"] >= (1 if episode else args.frames)
    used = "executed_steps" if args.stream else "chunks_executed"
    c["sim_executed_commands"] = (sim.get(used) or 0) >= 1 and report["joint_motion_max_rad"] > 1e-3
    c["no_dropped_or_rejected_chunks"] = all(
        (sim.get(k) or 0) == 0 for k in ("out_of_order", "expired", "bad_names", "bad_shape", "non_finite", "bad_times")
    )
    c["commands_finite"] = cmd["non_finite"] == 0 and cmd["executed_messages"] > 0
    c["no_jump"] = cmd["max_step_change"] <= cmd["step_limit"] + 1e-9
    if args.ask:
        c["language_deltas"] = report["language"]["deltas"] > 0
    c["clean_exit"] = all(rc == 0 for name, rcs in codes.items() for rc in (rcs if name == "sim" else rcs[-1:]))
    expected = ("command loss",) if args.kill_at_frame > 0 else ()
    unexpected = [w for lines in report["warnings"].values() for w in lines if not any(e in w for e in expected)]
    c["no_unexpected_warnings"] = not unexpected
    if args.kill_at_frame > 0:
        k = report.get("kill", {})
        c["loss_reported"] = bool(k.get("loss_reported"))
        c["held_without_motion"] = cmd["lost_messages"] > 0 and cmd["max_change_while_lost"] == 0.0
        c["resumed_after_restart"] = bool(k.get("resumed"))
    if episode:
        c["episode_success"] = bool(report.get("episode", {}).get("success"))
    if getattr(args, "video", ""):
        c["video_written"] = bool((report.get("video") or {}).get("frames"))
    report["ok"] = all(c.values())


def switch_line(s: dict[str, Any]) -> str:
    """The chunk-switch figures of the sim's status values ``s`` (the executor's switch
    discontinuity: largest joint difference between the old and the new chunk's targets at the
    switch, joint units), or why there are none."""

    def g(key: str) -> float:
        v = s.get(key)
        return math.nan if v is None else float(v)

    n, after = g("switches"), g("switches_after_hold")
    hold = f"{after:.0f} after a hold (not measured)" if math.isfinite(after) else "after a hold n/a"
    if not math.isfinite(n):
        return f"n/a; {hold}"
    if n < 1:
        return f"no measured chunk switches; {hold}"
    med, top = (f"{v:.4f}" if math.isfinite(v) else "n/a" for v in (g("switch_jump_median"), g("switch_jump_max")))
    return (
        f"{n:.0f} measured, switch discontinuity median {med}, max {top} (largest joint "
        f"difference, joint units); {hold}"
    )


def episode_line(e: dict[str, Any]) -> str:
    """The episode in one report line."""

    def f(x: Any, nd: int = 2) -> str:
        return "n/a" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))

    return (
        f"  episode          : {'SUCCESS' if e['success'] else 'no success'} "
        f"(ended by {e['ended_by']}), policy {e['policy']}, seed {e['seed']}, latency "
        f"{e['latency_ms']:g} ms, time to success {f(e['time_to_success_s'])} s of "
        f"{f(e['episode_s'])} s, lift max {f(e['lift_max_m'], 3)} m, max reward "
        f"{f(e['max_reward'])}, path {f(e['path_length_rad'])} rad (grippers "
        f"{f(e['gripper_path_length'])}), max switch jump {f(e['max_switch_jump'], 4)}"
    )


def answers_line(a: dict[str, Any]) -> str:
    """``report['answers']`` in one report line."""
    acc = "n/a" if a.get("accuracy") is None else f"{a['accuracy']:.2f}"
    extra = f", {a['requested'] - a['asked']} not sent (episode time limit)" if a["requested"] > a["asked"] else ""
    return (
        f"  answers          : {a['correct']}/{a['asked']} correct (accuracy {acc}), {a['answered']} "
        f"answered, truth {a['truth']!r}{extra}; unmatched texts {a.get('unmatched', 0)}"
    )


def format_report(r: dict[str, Any]) -> str:
    """Human-readable report."""

    def f(x: Any, nd: int = 1) -> str:
        return (
            "n/a"
            if x is None or (isinstance(x, float) and not math.isfinite(x))
            else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))
        )

    o, s, c = r["oxygen"], r["sim"], r["command"]
    rejected = sum((s.get(k) or 0) for k in ("bad_names", "bad_shape", "non_finite", "bad_times"))
    lines = [
        f"closed loop: {o['chunks_seen']} chunks (target {r['frames_target']}) in "
        f"{f(r.get('run_s'))} s after a {f(r.get('startup_s'))} s start-up, model {r['model']}, "
        f"target real-time factor {r['target_real_time_factor']:g}",
        f"  action rate      : {f(o['action_hz'])} actions/s (H/T, oxygen), "
        f"{f(o['chunk_hz_seen'], 2)} chunks/s seen, frame time p50 {f(o['frame_time_p50_ms'])} ms",
        f"  tokens           : {f(o['tok_per_s_peak'])} tok/s peak ({f(o['tok_per_s_last'])} last "
        f"5 s window), {f(o['tokens'], 0)} tokens in {f(o['frames'], 0)} frames",
        f"  chunk age at execution (sim ms): p50 {f(s['chunk_age_p50_ms'])}, p95 "
        f"{f(s['chunk_age_p95_ms'])}, max {f(s['chunk_age_max_ms'])}; arrival latency p50 "
        f"{f(s['arrival_latency_p50_ms'])}, max {f(s['arrival_latency_max_ms'])}"
        + (f" (incl. {s['command_delay_s'] * 1e3:g} ms added latency)" if s.get("command_delay_s") else ""),
        f"  sim chunks       : received {f(s['chunks_received'], 0)} (per-step commands "
        f"{f(s.get('commands_received'), 0)}), executed "
        f"{f(s['chunks_executed'], 0)}, same-stamp replacements {f(s['same_stamp'], 0)}, "
        f"out of order {f(s['out_of_order'], 0)}, expired {f(s['expired'], 0)}, rejected "
        f"{f(rejected, 0)}",
        f"  sim              : {f(s['sim_step_hz'])} steps/s, real-time factor "
        f"{f(s['real_time_factor'], 2)}, cameras {f(s['camera_hz'])} Hz (render "
        f"{f(s['render_ms'])} ms, skipped {f(s['camera_skipped'], 0)}), overruns "
        f"{f(s['overruns'], 0)}",
        f"  commands         : executed steps {f(s['executed_steps'], 0)}, waiting for the first "
        f"chunk {f(s.get('wait_steps'), 0)}, held in gaps {f(s['hold_steps'], 0)} (losses "
        f"{f(s['losses'], 0)}, resumes {f(s['resumes'], 0)}), "
        f"speed-limited {f(s['limited_steps'], 0)}; max step {f(c['max_step_change'], 4)} "
        f"(limit {f(c['step_limit'], 4)}), non-finite {c['non_finite']}, joint motion "
        f"{f(r['joint_motion_max_rad'], 3)} rad",
        "  chunk switches   : " + switch_line(s),
        "  real-time chunking: " + rtc_line(o.get("rtc") or {}),
    ]
    lang = r["language"]
    if "ask" in r:
        lines.append(
            f"  language         : ask {r['ask']['text']!r} at frame "
            f"{r['ask']['at_frame']} -> {lang['deltas']} deltas, text "
            f"{lang['text'][:60]!r}"
        )
    if "answers" in r:
        lines.append(answers_line(r["answers"]))
        for it in r["answers"]["items"][:5]:
            lines.append(f"    {'ok ' if it['correct'] else 'NO '} {str(it['answer'])[:80]!r}")
    if "video" in r:
        v = r["video"]
        lines.append(
            f"  video            : {v['path'] or 'not written'} ({v['frames']} frames, {v['dropped']} dropped"
            + (f"; {v['error']}" if v.get("error") else "")
            + ")"
        )
    if "kill" in r:
        k = r["kill"]
        lines.append(
            f"  oxygen killed    : at frame {k['at_frame']}, loss reported "
            f"{k.get('loss_reported')} after {f(k.get('loss_report_s'), 2)} s, held "
            f"{c['lost_messages']} steps (max change {f(c['max_change_while_lost'], 4)}), "
            f"resumed {k.get('resumed')} {f(k.get('resume_s'), 1)} s after the restart"
        )
    if "episode" in r:
        lines.append(episode_line(r["episode"]))
    lines.append(f"  exit codes       : {r.get('exit_codes')}")
    warns = [f"{name}: {w}" for name, ws in r["warnings"].items() for w in ws]
    lines.append(f"  warnings/errors  : {len(warns)}")
    lines += [f"    {w[:160]}" for w in warns[:10]]
    if "error" in r:
        lines.append(f"  error            : {r['error']}")
    failed = [k for k, v in r["checks"].items() if not v]
    lines.append("  checks           : " + ("all passed" if not failed else "FAILED: " + ", ".join(failed)))
    return "\n".join(lines)
