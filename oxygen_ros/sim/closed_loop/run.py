"""Run the closed loop (ALOHA sim <-> oxygen node) without ``ros2 launch`` and print a report.

Console script ``closed_loop``. Starts ``aloha_sim`` (``oxygen_ros.sim.node``) and the
``oxygen`` node as two processes with the same parameter files as ``launch/sim.launch.py``
(``config/oxygen.yaml`` for the node, ``config/sim.yaml`` for both), watches the loop from a third
ROS participant in this process, sends a language ask mid-run, waits for ``--frames`` action chunks,
stops both processes with SIGINT and prints a report:

- action rate: the oxygen node's ``action_hz`` (horizon / median frame time) and chunk rate;
- tokens per second (the oxygen node's /diagnostics) and the streamed answer to the ask;
- chunk age when executed (sim time from observation stamp to the step that applied the point),
  chunk arrival latency, chunks executed / dropped / rejected by the sim;
- the sim's control rate and real-time factor, command holds and losses;
- chunk switches (the sim's executor): measured switches, median and max switch discontinuity
  (largest joint difference between the old and the new chunk's targets at the switch, joint
  units) and switches after a hold (not measured);
- safety of the executed command: finite, largest step change, largest change while held;
- exit status of both processes, warnings and errors from their logs.

``--stream`` drives the sim with the node's per-step command stream (``action_rate_hz`` = the
sim's control rate) instead of the chunks. ``--kill-at-frame K`` kills the oxygen node (SIGKILL)
after K chunks, checks that the sim reports a command loss and holds its last command, restarts
the node after ``--hold-s`` seconds and waits until the loop runs again
(``--frames-after-restart`` more chunks).

``--policy scripted`` runs the scripted oracle (``scripted_policy``, the sim's pick-and-lift)
instead of the oxygen node. ``--latency-ms L`` adds L ms (sim time) to either policy: the sim
holds every chunk that long before executing it (its ``command_delay_s``), so the chunk acts on an
observation L ms staler; ``--episode-s T`` ends the run at task success or T
sim seconds into the episode and adds ``report['episode']`` (see
:mod:`oxygen_ros.sim.closed_loop.episode`). In episode mode ``--ask "Where is the cube?"
--ask-count N`` sends that checkable ask N times while the arm reaches and adds
``report['answers']`` (asked, answered, correct, accuracy, one item per ask) scored against the
seed's initial cube region (rule: :mod:`oxygen_ros.sim.closed_loop.asks`).

``--video PATH.mp4`` writes the top camera (``cam_high/image_raw/compressed``) with sim/episode
time, a new-chunk marker and the latest streamed answer drawn on it, frame by frame
(:mod:`oxygen_ros.sim.closed_loop.video`); ``report['video']`` says how many frames.

Exit status: 0 when every check passed, 1 otherwise (the report says which failed), 2 for bad
arguments. Example::

    closed_loop --frames 30 --model pi05-tiny --json /tmp/loop.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oxygen_ros.sim.closed_loop.asks import AskSchedule, answers_report, is_checkable
from oxygen_ros.sim.closed_loop.episode import (
    EpisodeWatch,
    argument_problem,
    episode_report,
    resolve_defaults,
    scripted_cmd,
    sim_task_params,
)
from oxygen_ros.sim.closed_loop.monitor import LoopMonitor
from oxygen_ros.sim.closed_loop.processes import (
    ChildProcess,
    child_env,
    config_dir,
    control_period,
    ros_domain,
    sigterm_as_interrupt,
    wait_for,
)
from oxygen_ros.sim.closed_loop.report import checks, command_safety, format_report, num
from oxygen_ros.sim.closed_loop.video import EpisodeVideo
from oxygen_ros.sim.task.answers import latest_answer_text
from oxygen_ros.sim.task.language import CUBE_QUESTION

__all__ = ["LoopMonitor", "main", "run_loop"]

SIM_STATUS = "aloha_sim: executor"
OXYGEN_STATUS = "oxygen: inference"
VIDEO_CAMERA_TOPIC = "cam_high/image_raw/compressed"


def run_loop(
    args: argparse.Namespace, domain_id: int, log_dir: Path, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the loop once (see module doc) and return the report dictionary.

    Raises:
        ParamsFileError: the oxygen node's parameters (files + ``-p``) are invalid or hold a name the
            node does not declare (checked before any process starts).
    """
    resolve_defaults(args)
    scripted = args.policy == "scripted"
    cfg = config_dir()
    sim_yaml = Path(args.sim_params) if args.sim_params else cfg / "sim.yaml"
    oxy_yaml = Path(args.oxygen_params) if args.oxygen_params else cfg / "oxygen.yaml"
    sim_time = args.rtf != 1.0 or scripted  # the oracle follows the sim clock
    env = child_env(domain_id)
    py = sys.executable
    sim_cmd = [
        py,
        "-m",
        "oxygen_ros.sim.node",
        "--ros-args",
        "--params-file",
        str(sim_yaml),
        "-p",
        f"real_time_factor:={args.rtf}",
        "-p",
        f"publish_clock:={'true' if sim_time else 'false'}",
        "-p",
        f"seed:={args.seed}",
    ]
    if args.camera_rate_hz > 0:
        sim_cmd += ["-p", f"camera_rate_hz:={args.camera_rate_hz}"]
    if args.stream:  # the node's per-step command stream at the sim's control rate
        sim_cmd += ["-p", "command_source:=stream"]
    sim_cmd += sim_task_params(args)
    for p in args.sim_param:  # after the loop's own: the user's value wins
        sim_cmd += ["-p", p]
    oxy_cmd = [
        py,
        "-m",
        "oxygen_ros.ros.node",
        "--ros-args",
        "--params-file",
        str(oxy_yaml),
        "--params-file",
        str(sim_yaml),
        "-p",
        f"model:={args.model}",
        "-p",
        f"use_sim_time:={'true' if sim_time else 'false'}",
        "-p",
        f"num_threads:={args.num_threads}",
    ]
    if args.device:
        oxy_cmd += ["-p", f"device:={args.device}"]
    oxy_cmd += ["-p", f"engine.seed:={args.seed}"]  # the flow noise: the same seed, the same chunks
    # the node's input timeout is wall time: a sim slowed to --rtf sends 1/rtf times less often, and
    # at the end the sim is stopped first (SIGINT, up to 30 s) while the node still runs: 10 s of
    # silence is the loop's stop, not a fault (the loop's own monitor reports command loss)
    timeout_s = min(3600.0, 10.0 / args.rtf) if 0 < args.rtf < 1 else 10.0
    oxy_cmd += ["-p", f"input_timeout_s:={timeout_s:.2f}"]
    if args.rtc:
        oxy_cmd += ["-p", "rtc.enabled:=true"]
    for p in args.oxygen_param:
        oxy_cmd += ["-p", p]
    if args.stream:
        oxy_cmd += ["-p", f"action_rate_hz:={1.0 / control_period(sim_yaml)}"]
    # the node's own checks before starting anything: a typo fails here, named, not after start-up
    if scripted:
        oxy_cmd = scripted_cmd(args, py, sim_yaml, sim_time)
    else:
        from oxygen_ros.ros.params.node_config import load_node_config

        load_node_config([oxy_yaml, sim_yaml], [oxy_cmd[i + 1] for i, a in enumerate(oxy_cmd) if a == "-p"])
    policy_name = "scripted_policy" if scripted else "oxygen"
    watch = EpisodeWatch(args.episode_s) if args.episode_s > 0 else None
    report: dict[str, Any] = {
        "model": "scripted" if scripted else args.model,
        "frames_target": args.frames,
        "command_source": "stream" if args.stream else "trajectory",
        "target_real_time_factor": args.rtf,
        "seed": args.seed,
        "policy": args.policy,
        "rtc": args.rtc,
        "camera_rate_hz": args.camera_rate_hz,
        "domain_id": domain_id,
        "logs": str(log_dir),
        "checks": {},
    }
    schedule = _ask_schedule(args)
    truth = ""
    if schedule is not None and args.episode_s > 0 and is_checkable(args.ask):
        from oxygen_ros.sim.task.answers import seed_cube_region

        truth = seed_cube_region(args.seed)  # the sim's first episode uses the seed itself
    video = EpisodeVideo(args.video, args.camera_rate_hz if args.camera_rate_hz > 0 else 10.0) if args.video else None
    holder: list[LoopMonitor] = []

    def on_frame(stamp: float, rgb: Any) -> None:
        if video is None or not holder:
            return
        mon = holder[0]
        sim_status = mon.last_diag(SIM_STATUS)
        ep_t = num(sim_status, "episode_time_s") if sim_status.get("episode_started") == "True" else math.nan
        answer = latest_answer_text(mon.latest_text())
        video.add(rgb, video.frame_info(stamp, ep_t, mon.n_chunks(), answer))

    monitor = LoopMonitor(
        domain_id, camera_topic=VIDEO_CAMERA_TOPIC if video else None, on_frame=on_frame if video else None
    )
    holder.append(monitor)
    procs: list[ChildProcess] = []
    oxygen_runs: list[ChildProcess] = []
    t_start = time.monotonic()
    try:
        sim = ChildProcess("sim", sim_cmd, log_dir / "sim.log", env)
        procs.append(sim)
        oxygen = ChildProcess(policy_name, oxy_cmd, log_dir / f"{policy_name}.log", env)
        procs.append(oxygen)
        oxygen_runs.append(oxygen)
        echo(
            f"started aloha_sim (pid {sim.popen.pid}) and {policy_name} (pid {oxygen.popen.pid}) "
            f"on ROS domain {domain_id}; logs in {log_dir}"
        )

        def died() -> str:
            dead = [p.name for p in (sim, oxygen_runs[-1]) if not p.alive()]
            return ", ".join(dead)

        deadline = t_start + args.timeout
        first = wait_for(lambda: monitor.n_chunks() >= 1, max(1.0, deadline - time.monotonic()), abort=died)
        report["startup_s"] = round(time.monotonic() - t_start, 2)
        if not first:
            raise RuntimeError(f"no action chunk within {args.timeout:g} s" + (f" ({died()} exited)" if died() else ""))
        echo(f"first chunk after {report['startup_s']} s; running ...")
        t_first = time.monotonic()
        asked_at = None
        killed = None
        frames_before_restart = 0
        while True:
            n = monitor.n_chunks()
            if schedule is not None:
                sim_status = monitor.last_diag(SIM_STATUS)
                ep_t = num(sim_status, "episode_time_s")
                if schedule.due(n, sim_status.get("episode_started") == "True", ep_t) and monitor.ask(args.ask):
                    schedule.mark_sent(n, ep_t)
                    asked_at = time.monotonic()
                    report.setdefault("ask", {"text": args.ask, "at_frame": n})["count"] = len(schedule.sent)
                    echo(f"frame {n}: asked {args.ask!r} ({len(schedule.sent)} of {schedule.count})")
            if args.kill_at_frame > 0 and killed is None and n >= args.kill_at_frame:
                killed = _kill_and_restart(args, monitor, oxygen_runs, procs, oxy_cmd, env, log_dir, report, echo)
                frames_before_restart = monitor.n_chunks()
            target = args.frames
            if killed is not None:
                target = max(args.frames, frames_before_restart + args.frames_after_restart)
            if watch is not None and watch.done(monitor):
                echo(f"episode over: {watch.ended_by}")
                break
            if watch is None and n >= target and (schedule is None or asked_at is not None):
                break
            if died():
                raise RuntimeError(f"{died()} exited during the run")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"episode not over within {args.timeout:g} s"
                    if watch
                    else f"only {n} of {target} chunks within {args.timeout:g} s"
                )
            time.sleep(0.05)
        t_done = time.monotonic()
        if schedule is not None and asked_at is not None:  # let the answers finish streaming (bounded)
            wait_s = min(args.text_wait_s, max(0.0, deadline - t_done))
            if truth:
                sent = len(schedule.sent)
                wait_for(lambda: _answers_in(monitor, schedule, truth, args.ask) >= sent, wait_s)
            else:
                wait_for(lambda: monitor.texts, wait_s)
        # one more status of each node after the last frame
        n_sim, n_oxy = monitor.n_diags(SIM_STATUS), monitor.n_diags(OXYGEN_STATUS)
        wait_for(
            lambda: monitor.n_diags(SIM_STATUS) > n_sim and (scripted or monitor.n_diags(OXYGEN_STATUS) > n_oxy), 5.0
        )
        report["run_s"] = round(t_done - t_first, 2)
    except RuntimeError as exc:
        report["error"] = str(exc)
        echo(f"error: {exc}")
    except KeyboardInterrupt:
        report["error"] = "interrupted"
    finally:
        rcs: dict[str, list[int]] = {}
        for p in sorted(procs, key=lambda p: p.name != "sim"):  # the sim first: no loss report
            rc = p.stop() if p.popen.returncode is None else p.popen.returncode
            rcs.setdefault(p.name, []).append(rc)
        report["exit_codes"] = rcs
        report["wall_s"] = round(time.monotonic() - t_start, 2)
        if watch is not None:
            report["episode"] = episode_report(args, watch.final or monitor.last_diag(SIM_STATUS), watch.ended_by)
        monitor.close()  # no frame callback after this
        if video is not None:
            report["video"] = video.close()
        if schedule is not None and truth:
            report["answers"] = answers_report(schedule, monitor.text_messages(), truth, args.ask)
        _summarise(args, monitor, report, procs)
    return report


def _ask_schedule(args: argparse.Namespace) -> AskSchedule | None:
    """The asks of this run (None without ``--ask``): in frames mode one ask at
    ``--ask-at-frame`` (default frames/3); in episode mode ``--ask-count`` asks from
    ``--ask-at-frame`` (default 1), ``--ask-every-frames`` apart, before ``--ask-before-s``."""
    if not args.ask:
        return None
    if args.episode_s > 0:
        first = args.ask_at_frame if args.ask_at_frame >= 0 else 1
        return AskSchedule(args.ask_count, first, args.ask_every_frames, args.ask_before_s)
    return AskSchedule(1, args.ask_at_frame if args.ask_at_frame >= 0 else max(1, args.frames // 3))


def _answers_in(monitor: LoopMonitor, schedule: AskSchedule, truth: str, question: str) -> int:
    """How many asks of ``schedule`` have an answer on the text topic so far."""
    return int(answers_report(schedule, monitor.text_messages(), truth, question)["answered"])


def _kill_and_restart(
    args: argparse.Namespace,
    monitor: LoopMonitor,
    oxygen_runs: list[ChildProcess],
    procs: list[ChildProcess],
    oxy_cmd: list[str],
    env: dict[str, str],
    log_dir: Path,
    report: dict[str, Any],
    echo: Callable[[str], None],
) -> float:
    """SIGKILL the oxygen node, check the sim's loss report and hold, restart the node."""
    before = monitor.last_diag(SIM_STATUS)
    losses0 = int(num(before, "losses")) if before else 0
    resumes0 = int(num(before, "resumes")) if before else 0
    frame = monitor.n_chunks()
    t_kill = time.monotonic()
    rc = oxygen_runs[-1].kill()
    echo(f"frame {frame}: killed the oxygen node (exit {rc}); waiting for the sim to report a loss")
    kill: dict[str, Any] = {"at_frame": frame, "exit_code": rc}
    report["kill"] = kill
    lost = wait_for(lambda: int(num(monitor.last_diag(SIM_STATUS), "losses") or 0) > losses0, 15.0)
    kill["loss_reported"] = bool(lost)
    kill["loss_report_s"] = round(time.monotonic() - t_kill, 2) if lost else None
    if lost:
        echo(f"sim reported the command loss after {kill['loss_report_s']} s; holding for {args.hold_s:g} s")
    time.sleep(args.hold_s)
    kill["state_before_restart"] = monitor.last_diag(SIM_STATUS).get("state", "")
    n = len(oxygen_runs) + 1
    oxygen = ChildProcess("oxygen", oxy_cmd, log_dir / f"oxygen_{n}.log", env)
    procs.append(oxygen)
    oxygen_runs.append(oxygen)
    t_restart = time.monotonic()
    echo(f"restarted the oxygen node (pid {oxygen.popen.pid})")
    resumed = wait_for(
        lambda: int(num(monitor.last_diag(SIM_STATUS), "resumes") or 0) > resumes0,
        args.timeout,
        abort=lambda: "" if oxygen.alive() else "dead",
    )
    kill["resumed"] = bool(resumed)
    kill["resume_s"] = round(time.monotonic() - t_restart, 2) if resumed else None
    if resumed:
        echo(f"loop resumed {kill['resume_s']} s after the restart")
    return t_kill


def _summarise(
    args: argparse.Namespace, monitor: LoopMonitor, report: dict[str, Any], procs: list[ChildProcess]
) -> None:
    sim = monitor.last_diag(SIM_STATUS)
    oxy_hist = monitor.diag_history(OXYGEN_STATUS)
    active = [v for _, v, _, _ in oxy_hist if v.get("state") == "active"]
    oxy = active[-1] if active else (oxy_hist[-1][1] if oxy_hist else {})
    chunks = list(monitor.chunks)
    span = chunks[-1][0] - chunks[0][0] if len(chunks) > 1 else 0.0
    tok = [num(v, "tok_per_s") for v in active]
    tok = [t for t in tok if math.isfinite(t)]
    report["oxygen"] = {
        "action_hz": num(oxy, "action_hz"),
        "chunk_hz": num(oxy, "chunk_hz"),
        "frame_time_p50_ms": num(oxy, "frame_time_p50_ms"),
        "tok_per_s_last": num(oxy, "tok_per_s"),
        "tok_per_s_peak": max(tok) if tok else math.nan,
        "tokens": num(oxy, "tokens"),
        "frames": num(oxy, "frames"),
        "chunks_seen": len(chunks),
        "chunk_hz_seen": (len(chunks) - 1) / span if span else 0.0,
        "rtc": {k[len("rtc_") :]: oxy[k] for k in sorted(oxy) if k.startswith("rtc_")},  # as on /diagnostics
    }
    keys = (
        "state",
        "sim_time",
        "sim_step_hz",
        "real_time_factor",
        "camera_hz",
        "render_ms",
        "chunk_age_p50_ms",
        "chunk_age_p95_ms",
        "chunk_age_max_ms",
        "arrival_latency_p50_ms",
        "arrival_latency_max_ms",
        "command_delay_s",
        "chunks_received",
        "commands_received",
        "accepted",
        "chunks_executed",
        "same_stamp",
        "executed_steps",
        "wait_steps",
        "hold_steps",
        "limited_steps",
        "late_points",
        "losses",
        "resumes",
        "out_of_order",
        "stale",
        "expired",
        "bad_names",
        "bad_shape",
        "non_finite",
        "bad_times",
        "overruns",
        "camera_frames",
        "camera_skipped",
        "switches",
        "switches_after_hold",
        "switch_jump_last",
        "switch_jump_median",
        "switch_jump_max",
    )
    report["sim"] = {k: (sim.get(k) if k == "state" else num(sim, k)) for k in keys}
    step_limit = args.max_joint_speed / 50.0 if args.max_joint_speed > 0 else math.inf
    report["command"] = command_safety(list(monitor.executed), step_limit)
    report["joint_motion_max_rad"] = round(monitor.joint_max_dev, 4)
    deltas = [d for _, d in monitor.deltas]
    report["language"] = {
        "deltas": len(deltas),
        "text": "".join(deltas)[:200],
        "finished": [t for _, t in monitor.texts][:3],
    }
    report["warnings"] = {p.log.name: p.problems() for p in procs}
    checks(args, report)


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    ap = argparse.ArgumentParser(
        prog="closed_loop", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frames", type=int, default=30, help="action chunks to wait for (30)")
    ap.add_argument("--model", default="pi05-tiny", help="oxygen model: preset or checkpoint")
    ap.add_argument("--device", default="", help='oxygen torch device ("" = auto)')
    ap.add_argument("--num-threads", type=int, default=1, help="CPU threads of the oxygen node (0 = torch default; 1)")
    ap.add_argument(
        "--policy",
        choices=("model", "scripted"),
        default="model",
        help="who sends the chunks: the oxygen node (model) or the scripted oracle",
    )
    ap.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="added policy latency: the sim executes every chunk this much (sim) time after it arrived (0)",
    )
    ap.add_argument(
        "--episode-s",
        type=float,
        default=0.0,
        help="episode mode: end at task success or this many sim seconds after the episode start (0 = frames mode)",
    )
    ap.add_argument("--lift-height-m", type=float, default=0.05, help="task success: cube lift, metres (0.05)")
    ap.add_argument(
        "--lift-hold-s", type=float, default=1.0, help="task success: lift held this long, sim seconds (1.0)"
    )
    ap.add_argument(
        "--rtf",
        type=float,
        default=None,
        help="sim real-time factor; not 1 = sim time over /clock (default 0.25 for the "
        "model: on a CPU the tiny model and the renderer keep up with time to spare; "
        "1.0 for the scripted policy)",
    )
    ap.add_argument(
        "--camera-rate-hz",
        type=float,
        default=25.0,
        help="camera frames per simulated second (0 = from the sim parameter file; "
        "25: every 2nd control step, 6.25 renders per wall second at --rtf 0.25)",
    )
    ap.add_argument(
        "--stream", action="store_true", help="drive the sim with the per-step command stream instead of the chunks"
    )
    ap.add_argument(
        "--ask",
        default=None,
        help='ask sent mid-run ("" = none; default \'What do '
        "you see?', none with the scripted policy or in episode mode)",
    )
    ap.add_argument(
        "--ask-at-frame", type=int, default=-1, help="frame of the (first) ask (frames/3; 1 in episode mode)"
    )
    ap.add_argument(
        "--ask-count",
        type=int,
        default=1,
        help=f"episode mode: send the ask this many times and score the answers; >1 only for {CUBE_QUESTION!r} (1)",
    )
    ap.add_argument("--ask-every-frames", type=int, default=3, help="episode mode: chunks between the asks (3)")
    ap.add_argument(
        "--ask-before-s",
        type=float,
        default=3.0,
        help="episode mode: no ask once the episode is this many sim seconds old (the cube still rests; 3.0)",
    )
    ap.add_argument(
        "--video",
        default="",
        metavar="PATH.mp4",
        help="write the top camera with time, chunk and answer overlays to this MP4 file",
    )
    ap.add_argument(
        "--text-wait-s", type=float, default=10.0, help="longest wait for the answer to finish after the last frame"
    )
    ap.add_argument(
        "--kill-at-frame",
        type=int,
        default=0,
        help="SIGKILL the oxygen node after this many chunks, then restart it (0 = no)",
    )
    ap.add_argument("--hold-s", type=float, default=2.0, help="wall seconds before the restart")
    ap.add_argument("--frames-after-restart", type=int, default=10, help="chunks to wait for after the restart")
    ap.add_argument(
        "--max-joint-speed",
        type=float,
        default=3.0,
        help="the sim's max_joint_speed (rad/s) used for the no-jump check",
    )
    ap.add_argument("--sim-params", default="", help="sim parameter file (config/sim.yaml)")
    ap.add_argument(
        "--oxygen-params", default="", help="oxygen parameter file (config/oxygen.yaml; sim.yaml is layered on top)"
    )
    ap.add_argument(
        "--seed", type=int, default=0, help="seed of the cube placement (sim) and of the flow noise (engine.seed); 0"
    )
    ap.add_argument(
        "--rtc", action="store_true", help="real-time chunking on (rtc.enabled:=true; other rtc.* via --oxygen-param)"
    )
    ap.add_argument(
        "--oxygen-param",
        action="append",
        default=[],
        metavar="NAME:=VALUE",
        help="extra oxygen node parameter, as -p NAME:=VALUE (repeatable)",
    )
    ap.add_argument(
        "--sim-param",
        action="append",
        default=[],
        metavar="NAME:=VALUE",
        help="extra aloha_sim parameter, as -p NAME:=VALUE (repeatable), e.g. render_shadows:=true",
    )
    ap.add_argument("--domain-id", type=int, default=None, help="ROS domain (default: $ROS_DOMAIN_ID, else a free one)")
    ap.add_argument("--timeout", type=float, default=180.0, help="overall limit, seconds")
    ap.add_argument("--log-dir", default="", help="folder for the node logs (a temp folder)")
    ap.add_argument("--json", default="", help="also write the report as JSON here")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Console script ``closed_loop`` (see module doc)."""
    args = resolve_defaults(build_parser().parse_args(argv))
    from oxygen_ros.ros.params.node_config import ParamsFileError  # rclpy: after the arguments are parsed

    if args.frames < 1 or args.rtf < 0:
        print("closed_loop: --frames must be >= 1 and --rtf >= 0", file=sys.stderr)
        return 2
    problem = argument_problem(args)
    if problem:
        print(f"closed_loop: {problem}", file=sys.stderr)
        return 2
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="closed_loop_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    try:  # SIGTERM: the loop stops its nodes, as on Ctrl-C
        with sigterm_as_interrupt(), ros_domain(args.domain_id) as dom:
            report = run_loop(args, dom, log_dir)
    except ParamsFileError as exc:
        print(f"closed_loop: {exc}", file=sys.stderr)
        return 2
    print(format_report(report), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        print(f"  wrote {args.json}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
