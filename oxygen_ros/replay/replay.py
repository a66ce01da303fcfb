"""Replay a rosbag2 through the engine offline, as the ``oxygen`` node would see it (``replay``).

The bag is read with ``rosbags``; topics are mapped with the node's own parameter file
(``config/oxygen.yaml`` by default, ``-p name:=value`` overrides as with ``--ros-args``) and
messages go through the node's converters and observation assembler (:mod:`oxygen_ros.replay.loops`).

Timing (``--timing``):

- ``fast`` (default): as fast as possible, deterministic — one frame per image of the trigger
  camera (the first configured camera present in the bag; ``--frame-period`` thins them out),
  run once every message stamped up to that image has been delivered. Same bag + same seed ->
  identical actions and text.
- ``recorded``: messages are delivered at their recorded times (x ``--rate``) while the engine
  runs as the node's inference loop does (a frame whenever a new image arrived; inputs that
  arrive during a frame wait for the next one and are superseded) — latencies and drops as on
  the robot; not bit-reproducible.

After the bag, running language requests are decoded to the end (``--no-drain``: cancelled).

Outputs in ``--out``: ``output_bag/`` (mcap; JointTrajectory chunks on the action topic, String
deltas and finished texts per task), ``report.txt``/``report.json`` (with the open-loop action
accuracy against the bag's commanded actions, ``--reference-topic``, or joint states:
:mod:`oxygen_ros.replay.accuracy`) and the PNG plots of :mod:`oxygen_ros.replay.plots`. Exit status:
0 ok; 2 unusable input (bag, parameters, model) with a one-line reason; 3 the replay ran but is
incomplete (bag read error, unreadable messages, or no action chunk at all) — the report says why.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from oxygen_ros.bags.reader import BagError, BagInput
from oxygen_ros.bags.writer import BagOutput
from oxygen_ros.replay.accuracy import reference_problem, replay_accuracy
from oxygen_ros.replay.prepare import (
    ReplayError,
    ReplaySetupError,
    TopicMap,
    check_bag,
    check_policy,
    default_params_file,
    load_node_config,
    load_policy,
)
from oxygen_ros.replay.report import ReplayStats, find_gaps, format_report

if TYPE_CHECKING:  # torch and rclpy are imported only when a replay runs (`replay --help` stays quick)
    from oxygen_ros.core.policy import Pi05Policy
    from oxygen_ros.core.types import ActionChunk
    from oxygen_ros.replay.node_sim import NodeSim
    from oxygen_ros.ros.params.node_config import NodeConfig

__all__ = ["ReplayError", "ReplayOptions", "ReplayResult", "build_parser", "main", "replay"]

_OUT_FILES = ("report.txt", "report.json", "timeline.png", "trajectories.png", "decode_batch.png", "action_error.png")


@dataclass
class ReplayOptions:
    """Replay settings (see ``replay --help``). ``params`` are ``name:=value`` overrides."""

    bag: Path
    out: Path | None = None
    params_file: Path | None = None
    params: tuple[str, ...] = ()
    model: str | None = None
    timing: str = "fast"
    rate: float = 1.0
    frame_period_s: float = 0.0
    max_frames: int = 0
    trigger_slot: str | None = None
    reference_topic: str | None = "/commanded_action"
    reference_joints: tuple[str, ...] = ()
    gripper_joints: tuple[str, ...] | None = None
    warmup: int = 1
    drain: bool = True
    plots: bool = True
    progress: str = "auto"
    show_text: bool = True
    overwrite: bool = False
    node_name: str = "oxygen"
    namespace: str = "/"


@dataclass
class ReplayResult:
    """What a replay produced. ``ok`` is False when the result is incomplete (see ``problems``)."""

    stats: ReplayStats
    report: str
    chunks: list[ActionChunk] = field(default_factory=list)
    texts: list[tuple[str, int, str]] = field(default_factory=list)  # (task, request id, text)
    out_bag: Path | None = None
    files: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No problem that makes the result incomplete."""
        return not self.problems


def _prepare_out(out: Path | None, overwrite: bool) -> None:
    if out is None:
        return
    if out.exists() and not overwrite and any(out.iterdir()):
        raise ReplayError(f"output folder {out} exists and is not empty; pass --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for name in _OUT_FILES:
            (out / name).unlink(missing_ok=True)


def replay(opts: ReplayOptions, policy: Pi05Policy | None = None) -> ReplayResult:
    """Run one replay (see module doc).

    Args:
        opts: settings; policy: an already loaded policy to use instead of the configured model.

    Raises:
        ReplayError: bag, parameters, model or output folder unusable (nothing was run).
    """
    import torch

    if opts.timing not in ("fast", "recorded"):
        raise ReplayError(f"timing must be 'fast' or 'recorded', got {opts.timing!r}")
    if not opts.rate > 0:
        raise ReplayError(f"rate must be > 0, got {opts.rate}")
    params_file = opts.params_file if opts.params_file is not None else default_params_file()
    try:
        cfg = load_node_config(params_file, opts.params, opts.node_name, opts.namespace)
        topics = TopicMap.from_config(cfg, opts.namespace, opts.node_name)
        bag = BagInput(opts.bag)
    except (ReplaySetupError, BagError) as exc:
        raise ReplayError(str(exc)) from exc
    with bag:
        try:
            warnings = check_bag(bag, topics, cfg.instruction)
        except ReplaySetupError as exc:
            raise ReplayError(str(exc)) from exc
        threads = torch.get_num_threads()
        if cfg.num_threads:  # for this replay only (restored below): library callers share torch
            torch.set_num_threads(cfg.num_threads)
        try:
            return _replay(opts, cfg, topics, bag, warnings, policy)
        finally:
            torch.set_num_threads(threads)


def _replay(
    opts: ReplayOptions,
    cfg: NodeConfig,
    topics: TopicMap,
    bag: BagInput,
    warnings: list[str],
    policy: Pi05Policy | None,
) -> ReplayResult:
    import torch

    from oxygen_ros.core.loops.schedules import make_engine
    from oxygen_ros.replay.console import Console
    from oxygen_ros.replay.loops import drain, run_fast, run_recorded
    from oxygen_ros.replay.node_sim import NodeSim

    if policy is None:
        policy = load_policy(cfg, opts.model)
    else:
        check_policy(cfg, policy)
    _prepare_out(opts.out, opts.overwrite)
    torch.manual_seed(cfg.engine.seed)  # periodic requests sample from the global RNG
    engine = make_engine(policy, cfg.engine, rtc=cfg.rtc)
    ref_note = reference_problem(opts.reference_topic, {t: i.msgtype for t, i in bag.topics.items()})
    ref = None if ref_note else opts.reference_topic
    read = [t for t in dict.fromkeys([*topics.inputs, *([ref] if ref else [])]) if t in bag.topics]
    stats = ReplayStats(warnings=list(warnings))
    slots = [s for s in policy.cfg.image_slots if any(v[0] == s and t in bag.topics for t, v in topics.cameras.items())]
    trigger = opts.trigger_slot or slots[0]
    if trigger not in slots:
        raise ReplayError(f"trigger slot {trigger!r} has no camera in the bag (have {slots})")
    cam_times = [t for t, v in topics.cameras.items() if v[0] == trigger]
    stats.meta.update(
        bag=str(opts.bag),
        bag_duration_s=bag.duration_s,
        model=f"{opts.model or cfg.model} ({policy.cfg.name}, {policy.model.device}, "
        f"{str(policy.model.dtype).removeprefix('torch.')}{', weights ' + cfg.weights if cfg.weights else ''})",
        timing=(
            f"{opts.timing} timing"
            + (f" x{opts.rate:g}" if opts.timing == "recorded" else "")
            + f", mode {cfg.engine.mode}, k={cfg.engine.tokens_per_frame}, {cfg.engine.schedule} schedule"
        ),
        horizon=policy.cfg.action_horizon,
        control_period_s=cfg.control_period_s,
        frame_deadline_s=cfg.engine.frame_deadline_s,
        joint_names=list(cfg.joint_names),
        trigger_slot=trigger,
        trigger_topic=cam_times[0],
        schedule=cfg.engine.schedule,
    )
    writer = None
    if opts.out is not None:
        writer = BagOutput(opts.out / "output_bag", overwrite=opts.overwrite)
        writer.add_topic(topics.action, "trajectory_msgs/msg/JointTrajectory")
        for task in topics.deltas:
            writer.add_topic(topics.deltas[task], "std_msgs/msg/String", depth=100)
            writer.add_topic(topics.texts[task], "std_msgs/msg/String", depth=100)
    console = Console(bag.count(read), [t.name for t in cfg.engine.tasks], opts.progress, opts.show_text)
    sim = NodeSim(
        cfg,
        topics,
        engine,
        {t: bag.topics[t].msgtype for t in read},
        bag.start_ns,
        writer,
        console,
        stats,
        reference_topic=ref,
        rate=opts.rate if opts.timing == "recorded" else 1.0,
        reference_joints=opts.reference_joints,
    )
    sim.reference_note = ref_note  # why there is no reference topic (the accuracy report says)
    sim.warmup = opts.warmup
    for w in warnings:
        console.line(f"warning: {w}")
    try:
        if opts.timing == "fast":
            run_fast(sim, bag, read, trigger, opts.frame_period_s, opts.max_frames, console)
        else:
            run_recorded(sim, bag, read, opts.rate, opts.max_frames, console)
        drain(sim, opts.drain)
    except BaseException:
        console.close()
        if writer is not None:
            writer.abort()
        raise
    console.close()
    stats.wall_total = sim.now() - sim.t0
    sim.counts()
    stats.bag_error = bag.read_error
    stats.lost = bag.lost(read)
    if not bag.read_to_end:
        stats.warnings.append(
            f"stopped after {opts.max_frames} frames (--max-frames); the rest of the bag was not replayed"
        )
    stats.gaps = find_gaps(sim.times)
    stats.meta["rtc"] = (
        {
            **engine.handover.diagnostics(),
            "rtc_execution_horizon": cfg.rtc.execution_horizon,
            "rtc_schedule": cfg.rtc.schedule,
            "rtc_guidance": cfg.rtc.guidance,
            "rtc_max_guidance_weight": cfg.rtc.max_guidance_weight,
        }
        if cfg.rtc.enabled
        else {}
    )
    stats.meta["input_period_s"] = _median_period(sim.times.get(cam_times[0], []), opts)
    stats.meta["trigger_period_s"] = _median_period(sim.times.get(cam_times[0], []), opts, raw=True)
    return _finish(opts, stats, sim, writer)


def _median_period(times: list[float], opts: ReplayOptions, raw: bool = False) -> float:
    """Median interval of ``times`` (bag s); unless ``raw``: at least the frame period, in wall
    seconds (divided by the playback rate with recorded timing)."""
    import numpy as np

    if len(times) < 2:
        return 0.0
    period = float(np.median(np.diff(times)))
    if raw:
        return period
    period = max(period, opts.frame_period_s)
    return period / (opts.rate if opts.timing == "recorded" else 1.0)


def _finish(opts: ReplayOptions, stats: ReplayStats, sim: NodeSim, writer: BagOutput | None) -> ReplayResult:
    result = ReplayResult(stats=stats, report="", chunks=sim.chunks, texts=sim.texts)
    if writer is not None:
        result.out_bag = writer.close()
        stats.outputs = dict(writer.counts)
    if stats.bag_error:
        result.problems.append(stats.bag_error)
    if stats.lost:
        result.problems.append(f"{sum(stats.lost.values())} messages of the bag could not be read (corrupt chunk?)")
    if not sim.chunks:
        why = "; ".join(f"{v}x {k}" for k, v in stats.waiting.items()) or "no trigger image"
        result.problems.append(f"no action chunk was produced ({why})")
    stats.accuracy = replay_accuracy(
        sim, sim.topics.joint_state, sim.reference_topic, sim.reference_note, opts.reference_joints, opts.gripper_joints
    )
    result.report = format_report(stats)
    if result.problems:
        result.report += "\n  INCOMPLETE      " + "\n                  ".join(result.problems)
    if opts.out is not None:
        (opts.out / "report.txt").write_text(result.report + "\n")
        stats.save_json(opts.out / "report.json")
        result.files += [opts.out / "report.txt", opts.out / "report.json"]
        if opts.plots:
            from oxygen_ros.replay.plots import save_plots

            result.files += save_plots(stats, sim, opts.out)
    return result


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of ``replay``."""
    p = argparse.ArgumentParser(
        prog="replay", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("bag", type=Path, help="rosbag2 folder (mcap/sqlite3) or .mcap file")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: out/replay_<bag name>)")
    p.add_argument(
        "--params-file", type=Path, default=None, help="node parameter YAML (default: the package config/oxygen.yaml)"
    )
    p.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="NAME:=VALUE",
        help="parameter override, as --ros-args -p (repeatable)",
    )
    p.add_argument("--model", default=None, help="checkpoint folder or preset (overrides the parameter)")
    p.add_argument("--timing", choices=("fast", "recorded"), default="fast")
    p.add_argument("--rate", type=float, default=1.0, help="playback rate with --timing recorded")
    p.add_argument(
        "--frame-period",
        type=float,
        default=0.0,
        help="fast timing: least bag seconds between frames (0 = every trigger image)",
    )
    p.add_argument("--max-frames", type=int, default=0, help="stop after N frames (0 = whole bag)")
    p.add_argument("--trigger-slot", default=None, help="image slot whose images trigger frames")
    p.add_argument(
        "--reference-topic",
        default="/commanded_action",
        help="JointState topic of commands: plotted and the action-accuracy reference "
        "(if in the bag; else the joint states are; '' = joint states)",
    )
    p.add_argument(
        "--reference-joints",
        default="",
        metavar="NAMES",
        help="comma-separated joint names of the reference positions, for messages without names",
    )
    p.add_argument(
        "--gripper-joints",
        default=None,
        metavar="NAMES",
        help="comma-separated gripper joints of the accuracy report (default: names with 'gripper')",
    )
    p.add_argument("--warmup", type=int, default=1, help="frames excluded from timing statistics")
    p.add_argument("--no-drain", action="store_true", help="cancel running text at the bag end")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--quiet-text", action="store_true", help="do not print asks and utterances")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument("--node-name", default="oxygen")
    p.add_argument("--namespace", default="/")
    return p


def options_from_args(args: argparse.Namespace) -> ReplayOptions:
    """ReplayOptions from parsed flags."""
    return ReplayOptions(
        bag=args.bag,
        out=args.out or Path("out") / f"replay_{args.bag.resolve().name}",
        params_file=args.params_file,
        params=tuple(args.param),
        model=args.model,
        timing=args.timing,
        rate=args.rate,
        frame_period_s=args.frame_period,
        max_frames=args.max_frames,
        trigger_slot=args.trigger_slot,
        reference_topic=args.reference_topic,
        reference_joints=_names(args.reference_joints),
        gripper_joints=None if args.gripper_joints is None else _names(args.gripper_joints),
        warmup=args.warmup,
        drain=not args.no_drain,
        plots=not args.no_plots,
        progress=args.progress,
        show_text=not args.quiet_text,
        overwrite=args.overwrite,
        node_name=args.node_name,
        namespace=args.namespace,
    )


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def main(argv: list[str] | None = None) -> int:
    """Console script ``replay``; returns the exit status (0 ok, 2 unusable input, 3 incomplete)."""
    args = build_parser().parse_args(argv)
    try:
        result = replay(options_from_args(args))
    except ReplayError as exc:
        print(f"replay: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("replay: interrupted", file=sys.stderr)
        return 130
    print(result.report)
    for f in ([result.out_bag] if result.out_bag else []) + result.files:
        print(f"  wrote {f}")
    return 0 if result.ok else 3


if __name__ == "__main__":
    sys.exit(main())
