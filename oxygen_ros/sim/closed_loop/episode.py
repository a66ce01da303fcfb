"""Episode mode and the scripted policy of the ``closed_loop`` script.

``--episode-s T``: the run ends when the sim reports task success (its ``aloha_sim: executor``
status, :mod:`oxygen_ros.sim.task.success`), or ``T`` simulated seconds after the episode start
(the sim's first executed chunk step); when no chunk is ever executed (e.g. every chunk arrives
expired), ``T`` simulated seconds after the first chunk was seen. ``report['episode']`` holds the
episode's values (:func:`episode_report`) from the sim status that ended it (the sim keeps running
until it is stopped), or from the last one when the run ended otherwise (error, timeout).

``--policy scripted``: the oracle (:mod:`oxygen_ros.sim.task.policy_node`) instead of the oxygen
node, with the sim's seed, the oxygen node's horizon (50) and the sim's control period; the sim
then renders only what the oracle needs (one small ``top`` camera image per chunk trigger; with
``--video`` the sim's default size, for the video). ``--latency-ms`` is the sim's
``command_delay_s`` for either policy (:func:`sim_task_params`).

Asks in episode mode: ``--ask-count`` (and its schedule) is checked here too; the schedule itself
and the scoring rule are in :mod:`oxygen_ros.sim.closed_loop.asks`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from oxygen_ros.sim.closed_loop.monitor import LoopMonitor
from oxygen_ros.sim.closed_loop.processes import control_period
from oxygen_ros.sim.closed_loop.report import num

__all__ = [
    "EPISODE_KEYS",
    "EpisodeWatch",
    "argument_problem",
    "episode_report",
    "resolve_defaults",
    "scripted_cmd",
    "sim_task_params",
]

SIM_STATUS = "aloha_sim: executor"
EPISODE_KEYS = (
    "seed",
    "policy",
    "latency_ms",
    "success",
    "time_to_success_s",
    "episode_s",
    "path_length_rad",
    "gripper_path_length",
    "max_switch_jump",
    "lift_max_m",
    "max_reward",
)
ORACLE_CAMERA = ("top", "cam_high/image_raw/compressed")


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the policy-dependent defaults (idempotent): ``--rtf`` 1.0 for the scripted policy,
    else 0.25; ``--ask`` none for the scripted policy and in episode mode, else 'What do you
    see?'."""
    scripted = args.policy == "scripted"
    if args.rtf is None:
        args.rtf = 1.0 if scripted else 0.25
    if args.ask is None:
        args.ask = "" if scripted or args.episode_s > 0 else "What do you see?"
    if scripted:
        args.ask = ""  # nobody answers
    return args


def argument_problem(args: argparse.Namespace) -> str | None:
    """Why the episode arguments cannot run (None when they can): the numbers' ranges, a
    repeated ask only in episode mode and only for the checkable question, a video only as MP4."""
    from oxygen_ros.sim.closed_loop.asks import is_checkable
    from oxygen_ros.sim.task.language import CUBE_QUESTION

    if args.latency_ms < 0 or args.episode_s < 0:
        return f"--latency-ms and --episode-s must be >= 0, got {args.latency_ms:g}, {args.episode_s:g}"
    if not args.lift_height_m > 0 or args.lift_hold_s < 0:
        return f"--lift-height-m must be > 0 and --lift-hold-s >= 0, got {args.lift_height_m:g}, {args.lift_hold_s:g}"
    if args.ask_count < 1 or args.ask_every_frames < 1 or not args.ask_before_s > 0:
        return (
            f"--ask-count and --ask-every-frames must be >= 1 and --ask-before-s > 0, got "
            f"{args.ask_count}, {args.ask_every_frames}, {args.ask_before_s:g}"
        )
    if args.ask_count > 1 and args.policy == "scripted":
        return f"--ask-count {args.ask_count}: the scripted policy answers no ask (use --policy model)"
    if args.ask_count > 1 and not (args.episode_s > 0 and is_checkable(args.ask or "")):
        return (
            f"--ask-count {args.ask_count} needs episode mode (--episode-s) and --ask {CUBE_QUESTION!r} "
            "(the one question with a checkable answer)"
        )
    if args.video and not str(args.video).lower().endswith(".mp4"):
        return f"--video must name an .mp4 file, got {args.video!r}"
    from oxygen_ros.sim.params import sim_specs

    names = {spec.name for spec in sim_specs()}
    for item in getattr(args, "sim_param", []):
        name, sep, _ = item.partition(":=")
        if not sep or name not in names:
            return f"--sim-param {item!r}: not NAME:=VALUE with an aloha_sim parameter (oxygen_ros.sim.params)"
    return None


def sim_task_params(args: argparse.Namespace) -> list[str]:
    """The sim's extra ``-p`` arguments: success criterion, the added latency ``--latency-ms`` (the
    sim holds every chunk that long, ``command_delay_s``: the same for the model and the oracle), and
    for the scripted policy one small camera (only its stamps matter); in episode mode a faster
    status."""
    out = ["-p", f"lift_height_m:={args.lift_height_m}", "-p", f"lift_hold_s:={args.lift_hold_s}"]
    if args.latency_ms > 0:
        out += ["-p", f"command_delay_s:={args.latency_ms / 1000.0}"]
    if args.policy == "scripted":
        out += ["-p", f"cameras:=[{ORACLE_CAMERA[0]}]", "-p", f"camera_topics:=[{ORACLE_CAMERA[1]}]"]
        if not getattr(args, "video", ""):  # only the stamps matter to the oracle; a video wants pixels
            out += ["-p", "image_width:=32", "-p", "image_height:=24"]
    if args.episode_s > 0:
        out += ["-p", "diagnostics_period_s:=0.2"]
    return out


def scripted_cmd(args: argparse.Namespace, py: str, sim_yaml: Path, sim_time: bool) -> list[str]:
    """The oracle policy process."""
    return [
        py,
        "-m",
        "oxygen_ros.sim.task.policy_node",
        "--ros-args",
        "-p",
        f"seed:={args.seed}",
        "-p",
        "horizon:=50",
        "-p",
        f"control_period_s:={control_period(sim_yaml)}",
        "-p",
        f"camera_topic:={ORACLE_CAMERA[1]}",
        "-p",
        f"use_sim_time:={'true' if sim_time else 'false'}",
    ]


def success_within(sim: dict[str, str], episode_s: float) -> bool:
    """The sim reports success, reached within ``episode_s`` episode seconds (the sim itself does
    not know the episode length, and its status may come a period after the limit)."""
    return sim.get("success") == "True" and num(sim, "success_time_s") <= episode_s + 1e-6


class EpisodeWatch:
    """Decides when an episode-mode run is over (module doc)."""

    def __init__(self, episode_s: float) -> None:
        self.episode_s = float(episode_s)
        self.t_first_chunk: float | None = None  # sim time when the first chunk was seen
        self.ended_by = ""
        self.final: dict[str, str] = {}  # the sim status that ended the episode

    def done(self, monitor: LoopMonitor) -> bool:
        d = monitor.last_diag(SIM_STATUS)
        sim_t = num(d, "sim_time")
        if self.t_first_chunk is None and monitor.n_chunks() >= 1 and math.isfinite(sim_t):
            self.t_first_chunk = sim_t
        if success_within(d, self.episode_s):
            self.ended_by = "success"
        elif d.get("episode_started") == "True" and (
            num(d, "episode_time_s") >= self.episode_s or d.get("success") == "True"
        ):  # too late
            self.ended_by = "time"
        elif (
            d.get("episode_started") != "True"
            and self.t_first_chunk is not None
            and sim_t - self.t_first_chunk >= self.episode_s
        ):
            self.ended_by = "time, no chunk executed"
        if self.ended_by:
            self.final = d
        return bool(self.ended_by)


def _opt(values: dict[str, str], key: str) -> float | None:
    v = num(values, key)
    return v if math.isfinite(v) else None


def episode_report(args: argparse.Namespace, sim: dict[str, str], ended_by: str) -> dict[str, Any]:
    """``report['episode']`` from the sim's last status ``sim``: the :data:`EPISODE_KEYS`
    (``None`` for a value the sim has not reported) plus ``ended_by`` and ``episode_started``."""
    success = success_within(sim, args.episode_s)
    reward = _opt(sim, "max_reward")
    return {
        "seed": args.seed,
        "policy": args.policy,
        "latency_ms": args.latency_ms,
        "success": success,
        "time_to_success_s": _opt(sim, "success_time_s") if success else None,
        "episode_s": _opt(sim, "episode_time_s"),
        "path_length_rad": _opt(sim, "path_length_rad"),
        "gripper_path_length": _opt(sim, "gripper_path_length"),
        "max_switch_jump": _opt(sim, "switch_jump_max"),
        "lift_max_m": _opt(sim, "lift_max_m"),
        "max_reward": None if reward is None else int(reward),
        "ended_by": ended_by or "not over",
        "episode_started": sim.get("episode_started") == "True",
    }
