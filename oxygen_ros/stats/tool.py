"""``norm_stats``: normalisation statistics for a checkpoint, from your own robot's bags.

    norm_stats BAG [BAG ...] --params-file robot.yaml --action-topic /commanded_action \\
               --out /models/pi05_myrobot [--layout auto|openpi|lerobot] [--asset-id robot]

The node's parameter file names the joint-state topic, the joints (``joint_names``, in the
checkpoint's order) and the action space; ``--action-topic`` is the recorded command stream
(``sensor_msgs/JointState`` — positions, or velocities for the velocity joints of a velocity
space — or ``std_msgs/Float64MultiArray`` in ``joint_names`` order; a teleoperation leader's
joint states work). Each bag is one episode. The statistics are q01/q99 and mean/std of the
model-space state and actions (see :mod:`oxygen_ros.stats.compute`), written where the loader
reads them: ``assets/<asset_id>/norm_stats.json`` (openpi) or the LeRobot processor files.
Exit status 2 with a message for a missing bag/topic/joint or an invalid parameter file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from oxygen_ros.core.action_space import ActionSpace  # numpy only: torch and rclpy come after argparse
from oxygen_ros.core.types import NormStats
from oxygen_ros.stats.compute import Episode

__all__ = ["StatsError", "read_episode", "main"]

_JS, _ARR = "sensor_msgs/msg/JointState", "std_msgs/msg/Float64MultiArray"


class StatsError(RuntimeError):
    """The statistics cannot be computed; the message names the bag, topic, joint or parameter."""


def _topic(name: str) -> str:
    return name if name.startswith("/") else "/" + name


def _pick(msg: Any, names: tuple[str, ...], fields: list[str]) -> np.ndarray | None:
    """Values of ``names`` from a JointState (``fields[i]`` = position / velocity), None if absent."""
    index: dict[str, int] = {}
    for i, n in enumerate(msg.name):
        index.setdefault(n, i)
    if any(n not in index for n in names):
        return None
    out = np.empty(len(names))
    for i, (n, f) in enumerate(zip(names, fields)):
        arr = getattr(msg, f)
        if len(arr) <= index[n]:
            return None
        out[i] = arr[index[n]]
    return out if np.isfinite(out).all() else None


def read_episode(
    path: Path, state_topic: str, action_topic: str, space: ActionSpace, progress: bool = True
) -> tuple[Episode, dict[str, int]]:
    """States and commands of one bag (log times), with counts of unusable messages per topic.

    Raises:
        StatsError: the bag cannot be read, a topic is absent or of the wrong type, or no message
            of a topic carries every configured joint (the missing joints are listed).
    """
    from tqdm import tqdm

    from oxygen_ros.bags.reader import BagError, BagInput, typestore

    names, state_names = space.joint_names, space.state_names
    state_fields = ["position"] * len(state_names)
    action_fields = ["velocity" if v else "position" for v in space.velocity]
    ts = typestore()
    try:
        bag = BagInput(path)
    except BagError as exc:
        raise StatsError(str(exc)) from exc
    with bag:
        for topic, param, ok in (
            (state_topic, "joint_state_topic", (_JS,)),
            (action_topic, "--action-topic", (_JS, _ARR)),
        ):
            info = bag.topics.get(topic)
            if info is None:
                raise StatsError(f"{path}: no topic {topic} ({param}); the bag has {sorted(bag.topics)}")
            if info.msgtype not in ok:
                raise StatsError(f"{path}: {topic} ({param}) is {info.msgtype}, expected one of {list(ok)}")
        rows: dict[str, tuple[list[float], list[np.ndarray]]] = {state_topic: ([], []), action_topic: ([], [])}
        dropped = {state_topic: 0, action_topic: 0}
        first_names: dict[str, list[str]] = {}
        bar = tqdm(
            total=bag.count([state_topic, action_topic]),
            unit="msg",
            desc=path.name,
            disable=not progress,
            file=sys.stderr,
            leave=False,
        )
        for topic, t_ns, raw in bag.messages([state_topic, action_topic]):
            bar.update()
            msgtype = bag.topics[topic].msgtype
            msg = ts.deserialize_cdr(raw, msgtype)
            vec: np.ndarray | None
            if msgtype == _ARR:
                vec = np.asarray(msg.data, np.float64)
                want = len(state_names if topic == state_topic else names)
                vec = vec if vec.shape == (want,) and np.isfinite(vec).all() else None
            else:
                first_names.setdefault(topic, list(msg.name))
                vec = (
                    _pick(msg, state_names, state_fields) if topic == state_topic else _pick(msg, names, action_fields)
                )
            if vec is None:
                dropped[topic] += 1
                continue
            rows[topic][0].append(t_ns / 1e9)
            rows[topic][1].append(vec)
        bar.close()
        if bag.read_error:
            raise StatsError(bag.read_error)
    for topic in (state_topic, action_topic):
        if not rows[topic][1] and dropped[topic]:
            have = first_names.get(topic)
            if have is None:
                what = f"holds no finite Float64MultiArray of {len(names)} values (joint_names)"
            elif missing := [n for n in (state_names if topic == state_topic else names) if n not in have]:
                what = f"lacks joints {missing} (it has {have})"
            else:
                what = f"has no finite values (position, or velocity for velocity joints) for joints {list(names)}"
            raise StatsError(f"{path}: every message on {topic} {what}")
    s_t, s = rows[state_topic]
    a_t, a = rows[action_topic]
    ep = Episode(
        np.asarray(s_t),
        np.asarray(s).reshape(-1, len(state_names)),
        np.asarray(a_t),
        np.asarray(a).reshape(-1, len(names)),
    )
    return ep, dropped


def _layout(out: Path, asked: str) -> str:
    if asked != "auto":
        return asked
    from oxygen_ros.core.model.keymap import detect_layout
    from oxygen_ros.core.model.weights import weight_index

    try:
        return detect_layout(set(weight_index(out)))
    except Exception:  # noqa: BLE001 - no checkpoint there (yet): openpi's layout
        return "openpi"


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(
        prog="norm_stats", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("bags", type=Path, nargs="+", help="rosbag2 folders (mcap/sqlite3) or .mcap files, one episode each")
    p.add_argument(
        "--params-file", type=Path, default=None, help="the node's parameter file (joints, topics, action space)"
    )
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE")
    p.add_argument(
        "--action-topic", default="/commanded_action", help="recorded commands (JointState or Float64MultiArray)"
    )
    p.add_argument("--out", type=Path, required=True, help="checkpoint folder to write the stats into")
    p.add_argument(
        "--layout",
        choices=("auto", "openpi", "lerobot"),
        default="auto",
        help="auto: the layout of the checkpoint in --out (openpi if there is none)",
    )
    p.add_argument("--asset-id", default="robot", help="openpi assets/<asset_id>/norm_stats.json")
    p.add_argument("--horizon", type=int, default=0, help="delta chunk length (0: the checkpoint's, else 50)")
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace statistics already in --out (each replaced file is kept as <file>.bak[.N])",
    )
    return p


def zero_range_joints(stats: dict[str, NormStats], space: ActionSpace) -> list[str]:
    """``'<state|actions> <joint>'`` for every dimension whose q01 == q99 (or std == 0): it never
    moved in the bags, so normalisation maps it to a constant and the policy cannot use it."""
    out = []
    for name, st in stats.items():
        for j, joint in enumerate(space.state_names if name == "state" else space.joint_names):
            if st.q99[j] - st.q01[j] <= 0 or st.std[j] <= 0:
                out.append(f"{name} {joint}")
    return out


def _horizon(out: Path, asked: int) -> int:
    if asked > 0:
        return asked
    for name in ("oxygen_config.json", "config.json"):
        path = out / name
        if path.is_file():
            d = json.loads(path.read_text())
            h = d.get("action_horizon") or d.get("chunk_size")
            if isinstance(h, int) and h > 0:
                return h
    return 50


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 ok, 2 bad input or statistics that exist
    in ``--out`` without ``--overwrite``)."""
    args = build_parser().parse_args(argv)

    from oxygen_ros.core.config import ConfigError
    from oxygen_ros.ros.params.node_config import ParamsFileError, load_node_config
    from oxygen_ros.stats.compute import episode_stats
    from oxygen_ros.stats.write import backup, stats_targets, write_stats

    progress = sys.stderr.isatty() if args.progress == "auto" else args.progress == "on"
    try:
        layout = _layout(args.out, args.layout)
        existing = [f for f in stats_targets(args.out, layout, args.asset_id) if f.is_file()]
        if existing and not args.overwrite:
            raise StatsError(
                f"{args.out} already holds normalisation statistics ({', '.join(map(str, existing))}): "
                "they may be the checkpoint's own; write elsewhere with --out, or pass --overwrite to "
                "replace them (each replaced file is kept as <file>.bak)"
            )
        cfg = load_node_config(args.params_file, args.param)
        space = ActionSpace(cfg.action_space, cfg.joint_names, cfg.state_joint_names)
        episodes: list[Episode] = []
        drops: dict[str, int] = {}
        for bag in args.bags:
            ep, dropped = read_episode(bag, _topic(cfg.joint_state_topic), _topic(args.action_topic), space, progress)
            episodes.append(ep)
            for k, v in dropped.items():
                drops[k] = drops.get(k, 0) + v
        horizon = _horizon(args.out, args.horizon)
        stats = episode_stats(episodes, space, horizon)
        backups = [(f, backup(f)) for f in existing]
        files = write_stats(args.out, stats, layout, args.asset_id)
    except (StatsError, ParamsFileError, ConfigError, ValueError) as exc:
        print(f"norm_stats: error: {exc}", file=sys.stderr)
        return 2
    n_s = sum(len(e.state) for e in episodes)
    n_a = sum(len(e.actions) for e in episodes)
    print(
        f"norm stats from {len(episodes)} bag(s): {n_s} states, {n_a} commands (action space {space.kind}"
        f"{f', delta chunks of {horizon}' if space.kind == 'delta' else ''}); unusable messages: "
        f"{ {k: v for k, v in drops.items() if v} or 'none' }"
    )
    flat = zero_range_joints(stats, space)
    for name, st in stats.items():
        for j, joint in enumerate(space.state_names if name == "state" else space.joint_names):
            mark = "  <- zero range" if f"{name} {joint}" in flat else ""
            print(
                f"  {name:7s} {joint:24s} q01 {st.q01[j]: .5f}  q99 {st.q99[j]: .5f}  mean {st.mean[j]: .5f}  "
                f"std {st.std[j]: .5f}{mark}"
            )
    if flat:
        print(
            f"norm_stats: warning: zero range (q01 == q99) for {len(flat)} dimension(s): {', '.join(flat)} — "
            "they never moved in these bags, so the policy sees a constant there; record episodes in which "
            "they move",
            file=sys.stderr,
        )
    for old, bak in backups:
        print(f"replaced {old} (the previous file is kept as {bak})")
    print(f"wrote ({layout} layout): " + ", ".join(str(f) for f in files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
