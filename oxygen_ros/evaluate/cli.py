"""``evaluate``: many episodes at once on Ray, one output folder with a table, a report and plots.

Two kinds, as LeRobot's ``lerobot-eval`` (success over seeded sim episodes) and openpi's open-loop
checks against recorded actions::

    evaluate open-loop BAG_OR_FOLDER [...] --out DIR [--model M] [-p name:=value ...]
    evaluate closed-loop --episodes N [--seed S] [--policy model|scripted] [--latency-ms L ...]
                         --out DIR [--model M] [--episode-s T]
                         [--ask "Where is the cube?" --ask-count K] [--video none|first|all]

- ``open-loop``: every bag (a bag, or a folder of bags) is replayed by ``replay`` in its own
  process; the row holds its action accuracy against the bag's reference (per-joint MAE/RMSE, in
  joint units and normalised by the joint's recorded range, arms and grippers apart) next to the
  hold-the-state baseline.
- ``closed-loop``: seeds ``S .. S+N-1`` (cube placements), for each latency, each one
  ``closed_loop`` episode (sim + policy node + monitor, on its own ROS domain) that ends at success
  or after ``--episode-s`` simulated seconds; the report gives the success rate with its 95 % Wilson
  interval per policy and latency. With ``--ask "Where is the cube?" --ask-count K`` every episode
  asks K times while the arm reaches and the report adds the answer accuracy (correct / asked,
  pooled over the group's episodes) beside the success rate. ``--video first|all``: the first
  episode, or every episode, writes ``episodes/<id>/episode.mp4`` (top camera with overlays).

Ray (:mod:`oxygen_ros.evaluate.scheduler`): an embedded local instance by default; ``--address``
joins a cluster; ``--workers`` episodes at once, each reserving ``--cpus-per-episode`` /
``--gpus-per-episode``. A failed or timed-out episode is a row with its error; rerunning into the
same ``--out`` skips the finished episodes (:mod:`oxygen_ros.evaluate.results`).

``placement``: ``evaluate placement --model M [--seeds N]`` asks, without the node, whether a
sim-trained policy sees the cube: its first chunk and answer at the start pose across placements
against the oracle's (:mod:`oxygen_ros.train.placement`; a few seconds).

``rollout``: ``evaluate rollout --model M [--seeds N]`` asks, without the node, whether a failing
closed loop is the policy's or the stack's: the policy steps the sim in this process, no latency
(:mod:`oxygen_ros.evaluate.rollout`; about 25 s per episode on 2 cores).

``compare``: ``evaluate compare [LABEL=]DIR ... --out OUT`` puts finished closed-loop runs (other
models, engine settings, the oracle) in one table and one ``success_rate.png``, each run a group
under its label, e.g. the learned policy's latency curve beside the oracle's.

Exit status: 0 every episode completed; 1 some failed or timed out (listed in the report);
2 unusable input; 130 interrupted by Ctrl-C or SIGTERM (the running episodes are stopped with
their nodes; finished episodes are kept).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from oxygen_ros.evaluate.episodes import (
    CLOSED_LOOP,
    OPEN_LOOP,
    VIDEO_CHOICES,
    Episode,
    EvaluateError,
    closed_loop_episodes,
    find_bags,
    open_loop_episodes,
)
from oxygen_ros.evaluate.results import OutputFolder, aggregate, compared_rows, format_aggregate
from oxygen_ros.sim.closed_loop.asks import is_checkable
from oxygen_ros.sim.task.language import CUBE_QUESTION

_T = TypeVar("_T")

__all__ = ["build_parser", "main"]

DEFAULT_TIMEOUT_S = 900.0
"""Default wall-clock limit of one episode, seconds."""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="output folder (a rerun resumes it)")
    p.add_argument("--overwrite", action="store_true", help="start the folder's evaluation again")
    p.add_argument(
        "--address", default=None, help="Ray cluster to join (e.g. auto, ray://head:10001); default: a local instance"
    )
    p.add_argument("--workers", type=int, default=2, help="episodes at once")
    p.add_argument("--cpus-per-episode", type=float, default=1.0, help="Ray num_cpus per episode")
    p.add_argument(
        "--gpus-per-episode", type=float, default=0.0, help="Ray num_gpus per episode (0.5: two episodes share a GPU)"
    )
    p.add_argument(
        "--episode-timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="wall-clock limit of one episode; it is stopped and reported as timed out",
    )
    p.add_argument("--model", default=None, help="checkpoint folder or preset for the policy")
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto")


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of ``evaluate`` (see the module doc)."""
    p = argparse.ArgumentParser(
        prog="evaluate",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    sub = p.add_subparsers(dest="kind", required=True)
    o = sub.add_parser("open-loop", help="action accuracy of replayed bags")
    o.add_argument("bags", nargs="+", type=Path, help="bags, or folders of bags")
    _common(o)
    o.add_argument("--params-file", type=Path, default=None, help="node parameter YAML")
    o.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE")
    o.add_argument(
        "--reference-topic",
        default=None,
        help="JointState topic the actions are compared with (replay's default: "
        "/commanded_action, else the joint states)",
    )
    o.add_argument(
        "--reference-joints",
        default=None,
        metavar="NAMES",
        help="joint names of reference messages that have none (comma-separated)",
    )
    o.add_argument(
        "--gripper-joints",
        default=None,
        metavar="NAMES",
        help='joints reported as grippers (default: names containing "gripper")',
    )
    o.add_argument("--timing", choices=("fast", "recorded"), default="fast")
    o.add_argument("--max-frames", type=int, default=0)
    o.add_argument("--frame-period", type=float, default=0.0)
    o.add_argument("--no-plots", action="store_true", help="no per-bag plots (the summary plot stays)")
    c = sub.add_parser("closed-loop", help="task success in the MuJoCo sim")
    c.add_argument("--episodes", type=int, required=True, help="seeds per latency")
    c.add_argument("--seed", type=int, default=0, help="first seed (cube placement)")
    _common(c)
    c.add_argument(
        "--policy",
        choices=("model", "scripted"),
        default="model",
        help="the oxygen node with --model, or the scripted oracle",
    )
    c.add_argument(
        "--latency-ms",
        type=float,
        nargs="+",
        default=[0.0],
        help="added policy latencies, sim ms: the sim executes each chunk that much later (one set of episodes each)",
    )
    c.add_argument(
        "--episode-s",
        type=float,
        default=12.0,
        help="simulated seconds from the first command to the end of a failed episode",
    )
    c.add_argument("--rtf", type=float, default=None, help="sim real-time factor (closed_loop's default)")
    c.add_argument(
        "--ask",
        default="",
        help=f"ask sent in every episode (closed_loop --ask; {CUBE_QUESTION!r} is scored); default none",
    )
    c.add_argument("--ask-count", type=int, default=1, help="asks per episode (closed_loop --ask-count; 1)")
    c.add_argument(
        "--video",
        choices=VIDEO_CHOICES,
        default="none",
        help="episode.mp4 in the episode folder (closed_loop --video): for none, the first episode, or all",
    )
    c.add_argument("--oxygen-param", action="append", default=[], metavar="NAME:=VALUE")
    c.add_argument(
        "--loop-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="any other closed_loop argument, e.g. --loop-arg=--rtc (repeatable)",
    )
    cmp = sub.add_parser("compare", help="one report and plot of several finished closed-loop evaluations")
    cmp.add_argument("runs", nargs="+", metavar="[LABEL=]DIR", help="finished closed-loop --out folders")
    cmp.add_argument("--out", type=Path, required=True, help="folder of the combined report")
    cmp.add_argument("--overwrite", action="store_true", help="replace a previous comparison in --out")
    pl = sub.add_parser("placement", help="does the policy's first chunk and answer follow the cube? (no ROS)")
    pl.add_argument("--model", required=True, help="checkpoint folder (a sim-trained policy)")
    pl.add_argument("--seeds", type=int, default=20, help="placements 0 .. N-1 (default: %(default)s)")
    pl.add_argument("--seed", type=int, default=0, help="first placement seed (default: %(default)s)")
    pl.add_argument("--json", type=Path, help="also write the summary and per-seed answers here")
    ro = sub.add_parser("rollout", help="the policy steps the sim in this process: the policy or the stack? (no ROS)")
    who = ro.add_mutually_exclusive_group(required=True)
    who.add_argument("--model", help="checkpoint folder (a sim-trained policy)")
    who.add_argument("--scripted", action="store_true", help="the scripted oracle through the same loop (reference)")
    ro.add_argument("--seeds", type=int, default=5, help="placements --seed .. --seed+N-1 (default: %(default)s)")
    ro.add_argument("--seed", type=int, default=0, help="first placement seed (default: %(default)s)")
    ro.add_argument("--episode-s", type=float, default=12.0, help="simulated seconds per episode (default: 12)")
    ro.add_argument(
        "--replan-steps", type=int, default=10, help="control steps between chunks (default: %(default)s, 0.2 s)"
    )
    ro.add_argument("--json", type=Path, help="also write the summary and every episode here")
    return p


LOOP_ARGS_SET_HERE = (
    "--policy",
    "--latency-ms",
    "--seed",
    "--episode-s",
    "--ask",
    "--ask-count",
    "--video",
    "--timeout",
    "--json",
    "--log-dir",
    "--domain-id",
    "--model",
    "--rtf",
    "--oxygen-param",
)
"""``closed_loop`` options ``evaluate`` sets itself (refused in ``--loop-arg``: the rows would
say otherwise)."""


def _model(args: argparse.Namespace) -> str | None:
    """``--model`` as given, or its absolute path when it names a file or folder (episodes run in
    other working directories)."""
    if args.model and Path(args.model).expanduser().exists():
        return str(Path(args.model).expanduser().resolve())
    model: str | None = args.model
    return model


def _forwarded(args: argparse.Namespace) -> list[str]:
    """The per-episode command's options (also what a rerun must match).

    Raises:
        EvaluateError: a ``--loop-arg`` that ``evaluate`` sets itself, or ``--policy model``
            without ``--model``.
    """
    fw: list[str] = []
    model = _model(args)
    if model:
        fw += ["--model", model]
    if args.kind == "open-loop":
        if args.params_file:
            fw += ["--params-file", str(args.params_file.resolve())]
        for prm in args.param:
            fw += ["-p", prm]
        if args.reference_topic is not None:
            fw += ["--reference-topic", args.reference_topic]
        for flag, value in (("--reference-joints", args.reference_joints), ("--gripper-joints", args.gripper_joints)):
            if value is not None:
                fw += [flag, value]
        fw += ["--timing", args.timing]
        if args.max_frames:
            fw += ["--max-frames", str(args.max_frames)]
        if args.frame_period:
            fw += ["--frame-period", f"{args.frame_period:g}"]
        if args.no_plots:
            fw.append("--no-plots")
        return fw
    if args.policy == "model" and not args.model:
        raise EvaluateError(
            "--policy model needs --model (a checkpoint folder, or a preset such as pi05-tiny for random weights)"
        )
    for a in args.loop_arg:
        if a.split("=", 1)[0] in LOOP_ARGS_SET_HERE:
            raise EvaluateError(f"--loop-arg={a}: evaluate sets {a.split('=', 1)[0]} itself (use its own option)")
    if args.rtf is not None:
        fw += ["--rtf", f"{args.rtf:g}"]
    for prm in args.oxygen_param:
        fw += ["--oxygen-param", prm]
    return fw + list(args.loop_arg)


def _check_args(module_parser: argparse.ArgumentParser, argv: list[str], what: str) -> None:
    """Parse an episode's arguments now, so a bad option fails once, before any episode runs."""
    try:
        module_parser.parse_args(argv)
    except SystemExit as exc:
        raise EvaluateError(f"the {what} arguments {argv} are not valid (see the message above)") from exc


def _episodes(args: argparse.Namespace, fw: list[str]) -> list[Episode]:
    if args.kind == "open-loop":
        from oxygen_ros.replay.replay import build_parser as replay_parser

        eps = open_loop_episodes(find_bags(args.bags), fw, _model(args) or "(params file)")
        _check_args(replay_parser(), [a.replace("{out}", "/tmp/x") for a in eps[0].args], "replay")
        return eps
    if args.episodes < 1:
        raise EvaluateError(f"--episodes must be >= 1, got {args.episodes}")
    if args.ask and args.policy == "scripted":
        raise EvaluateError("--ask: the scripted policy answers no ask (use --policy model)")
    if args.ask_count > 1 and not is_checkable(args.ask):
        raise EvaluateError(f"--ask-count {args.ask_count} needs --ask {CUBE_QUESTION!r} (the checkable question)")
    from oxygen_ros.evaluate.runner import GRACE_S
    from oxygen_ros.sim.closed_loop.run import build_parser as loop_parser

    # the loop stops itself (and reports) before the episode's process is stopped from outside
    loop_timeout = max(10.0, args.episode_timeout_s - GRACE_S - 10.0)
    model = "scripted" if args.policy == "scripted" else _model(args)
    assert model is not None  # _forwarded (run first) refused --policy model without --model
    eps = closed_loop_episodes(
        range(args.seed, args.seed + args.episodes),
        args.policy,
        args.latency_ms,
        args.episode_s,
        loop_timeout,
        fw,
        model,
        args.ask,
        args.ask_count,
        args.video,
    )
    _check_args(loop_parser(), [a.replace("{out}", "/tmp/x") for a in eps[0].args], "closed_loop")
    return eps


def main(argv: list[str] | None = None) -> int:
    """Console script ``evaluate``; returns the exit status (see the module doc)."""
    args = build_parser().parse_args(argv)
    if args.kind == "compare":
        return _compare(args)
    if args.kind == "placement":
        return _placement(args)
    if args.kind == "rollout":
        return _rollout(args)
    from oxygen_ros.evaluate.scheduler import RayOptions, import_ray, run_episodes

    try:
        import_ray(embedded=not args.address)  # before anything is written: without Ray, say what to install
        ray_opts = RayOptions(args.address, args.workers, args.cpus_per_episode, args.gpus_per_episode)
        if not args.episode_timeout_s > 0:
            raise EvaluateError(f"--episode-timeout-s must be > 0, got {args.episode_timeout_s}")
        fw = _forwarded(args)
        episodes = _episodes(args, fw)
        kind = OPEN_LOOP if args.kind == "open-loop" else CLOSED_LOOP
        folder = OutputFolder(args.out, {"kind": kind, "options": fw}, args.overwrite)
    except (EvaluateError, ValueError, OSError) as exc:
        print(f"evaluate: error: {exc}", file=sys.stderr)
        return 2
    rows: dict[str, dict[str, Any]] = {}
    todo = []
    for ep in episodes:
        done = folder.finished(ep)
        if done is not None:
            rows[ep.id] = done
        else:
            todo.append(ep)
    if rows:
        print(
            f"evaluate: {len(rows)} of {len(episodes)} episodes already finished in {args.out}; running {len(todo)}",
            file=sys.stderr,
        )

    progress = sys.stderr.isatty() if args.progress == "auto" else args.progress == "on"

    def on_row(row: dict[str, Any]) -> None:
        folder.save_row(row)
        rows[row["episode"]] = row
        if row["status"] != "ok":
            print(f"\nevaluate: episode {row['episode']} {row['status']}: {row['error']}", file=sys.stderr)
        elif not progress:  # no bar (a pipe, a log file): one line per finished episode
            print(f"evaluate: episode {row['episode']} ok ({len(rows)}/{len(episodes)})", file=sys.stderr, flush=True)

    from oxygen_ros.sim.closed_loop.processes import sigterm_as_interrupt

    try:  # SIGTERM stops the running episodes with their nodes, as Ctrl-C does
        with sigterm_as_interrupt():
            run_episodes(
                todo, folder.episodes_dir, ray_opts, args.episode_timeout_s, on_row, progress, skipped=len(rows)
            )
    except ValueError as exc:  # resources the Ray instance cannot give
        print(f"evaluate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"evaluate: interrupted; {len(rows)} finished episodes are kept in {args.out}", file=sys.stderr)
        return 130
    return _finish(folder, [rows[ep.id] for ep in episodes], kind)


def _compare(args: argparse.Namespace) -> int:
    """``evaluate compare``: the rows of finished closed-loop runs under their labels (a run given
    as ``LABEL=DIR``, else the folder's name), aggregated and plotted as one evaluation."""
    runs = []
    for item in args.runs:
        label, sep, folder = item.rpartition("=")
        runs.append((label if sep else Path(folder).name, Path(folder)))
    try:
        table = compared_rows(runs)
        folder = OutputFolder(
            args.out, {"kind": "compare", "runs": [[lb, str(d.resolve())] for lb, d in runs]}, args.overwrite
        )
    except (EvaluateError, OSError) as exc:
        print(f"evaluate: error: {exc}", file=sys.stderr)
        return 2
    return _finish(folder, table, CLOSED_LOOP)


def _in_process(work: Callable[[], _T]) -> tuple[_T | None, int]:
    """Run an in-process check (``placement``, ``rollout``): its result and 0, or None and the exit
    status with the error printed — 2 for bad input (a checkpoint that does not load, a bad value),
    1 when the simulator is not installed."""
    try:
        return work(), 0
    except (ValueError, OSError) as exc:  # CheckpointError is a ValueError
        print(f"evaluate: error: {exc}", file=sys.stderr)
        return None, 2
    except ModuleNotFoundError as exc:
        print(f"evaluate: error: {exc}; install requirements-sim.txt", file=sys.stderr)
        return None, 1


def _placement(args: argparse.Namespace) -> int:
    """``evaluate placement``: :func:`~oxygen_ros.train.placement.placement_check` of ``--model``
    over seeds ``--seed .. --seed+--seeds-1``, in this process (no node, no Ray)."""
    from oxygen_ros.core.policy import Pi05Policy
    from oxygen_ros.train.placement import placement_check, placement_line

    check, status = _in_process(
        lambda: placement_check(
            Pi05Policy.from_pretrained(args.model, device="cpu"), range(args.seed, args.seed + args.seeds)
        )
    )
    if check is None:
        return status
    for seed, answer, truth in zip(check.seeds, check.answers, check.truths, strict=True):
        print(f"seed {seed:4d}: answers {answer.strip()!r:18} truth {truth!r}")
    print(placement_line(check.summary))
    if args.json:
        answers = [{"seed": s, "answer": a, "truth": t} for s, a, t in zip(check.seeds, check.answers, check.truths)]
        args.json.write_text(json.dumps({"summary": check.summary, "answers": answers}, indent=1))
    return 0


def _rollout(args: argparse.Namespace) -> int:
    """``evaluate rollout``: :func:`~oxygen_ros.evaluate.rollout.rollout` of ``--model`` (or the
    scripted oracle) over seeds ``--seed .. --seed+--seeds-1``, in this process (no node, no Ray)."""
    from oxygen_ros.evaluate.rollout import SCRIPTED, RolloutEpisode, rollout, rollout_summary

    if args.seeds < 1:
        print("evaluate: error: --seeds must be >= 1", file=sys.stderr)
        return 2

    def run() -> list[RolloutEpisode]:
        from oxygen_ros.core.policy import Pi05Policy

        policy: Any = SCRIPTED if args.scripted else Pi05Policy.from_pretrained(args.model, device="cpu")
        return rollout(
            policy,
            range(args.seed, args.seed + args.seeds),
            episode_s=args.episode_s,
            replan_steps=args.replan_steps,
            on_episode=lambda episode: print(episode.line(), flush=True),
        )

    episodes, status = _in_process(run)
    if episodes is None:
        return status
    summary = rollout_summary(episodes)
    lo, hi = summary["wilson_95"]
    print(
        f"rollout in this process ({'scripted oracle' if args.scripted else args.model}, no ROS, no latency): "
        f"success {summary['successes']}/{summary['episodes']} [{lo:.2f}, {hi:.2f}]; grasp target missed by "
        f"{summary['median_grasp_miss_cm']:.1f} cm (median); right gripper commanded closed (< 0.5) in "
        f"{summary['gripper_closed']}/{summary['episodes']}"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


def _finish(folder: OutputFolder, table: list[dict[str, Any]], kind: str) -> int:
    from oxygen_ros.evaluate.plots import save_plots

    written = folder.write_table(table, kind)
    agg = aggregate(table, kind)
    text = format_aggregate(agg)
    (folder.root / "report.txt").write_text(text + "\n")
    (folder.root / "report.json").write_text(json.dumps(agg, indent=1, default=str))
    written += [folder.root / "report.txt", folder.root / "report.json"]
    written += save_plots(agg, table, folder.root)
    print(text)
    for path in written:
        print(f"  wrote {path}")
    return 0 if not agg["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
