"""What one evaluation episode is: a bag replayed open-loop, or one seeded closed-loop sim episode.

An :class:`Episode` names the command that runs it (``replay`` or ``closed_loop``, as a new process
of this Python) and the table columns it is known by before it runs (bag, seed, policy, latency).
Episode ids are stable and sortable, so the same inputs give the same table in the same order and a
rerun into the same output folder finds the episodes it already finished.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Episode", "EvaluateError", "closed_loop_episodes", "find_bags", "open_loop_episodes"]

OPEN_LOOP = "open_loop"
CLOSED_LOOP = "closed_loop"
REPLAY_MODULE = "oxygen_ros.replay.replay"
CLOSED_LOOP_MODULE = "oxygen_ros.sim.closed_loop.run"
RUNNER_MODULE = "oxygen_ros.evaluate.runner"
VIDEO_CHOICES = ("none", "first", "all")
"""``evaluate closed-loop --video``: no video, the first episode's only, or every episode's."""


class EvaluateError(ValueError):
    """Unusable evaluation input (no bags, bad option values, a folder holding another evaluation)."""


@dataclass(frozen=True)
class Episode:
    """One episode: its id, kind, the columns known before it runs and the command that runs it.

    Attributes:
        id: stable id, also the episode's folder name under ``<out>/episodes/``.
        kind: ``'open_loop'`` (a bag through ``replay``) or ``'closed_loop'`` (one sim episode).
        columns: table columns fixed by the inputs (``bag``; or ``seed``, ``policy``,
            ``latency_ms``).
        module: the Python module run with ``python -m``.
        args: its arguments; ``{out}`` in an argument is replaced by the episode's folder.
    """

    id: str
    kind: str
    columns: dict[str, Any]
    module: str
    args: tuple[str, ...] = field(default=())

    def command(self, out_dir: Path, python: str | None = None) -> list[str]:
        """The command line that runs the episode, writing into ``out_dir``: the module through
        :mod:`oxygen_ros.evaluate.runner`, which first clears the signal mask inherited from a
        Ray worker (it blocks SIGINT, so neither the episode nor its nodes could be stopped
        cleanly)."""
        return [
            python or sys.executable,
            "-m",
            RUNNER_MODULE,
            self.module,
            *(a.replace("{out}", str(out_dir)) for a in self.args),
        ]


def _is_bag(path: Path) -> bool:
    return (path.is_dir() and (path / "metadata.yaml").is_file()) or (
        path.is_file() and path.suffix in (".mcap", ".db3")
    )


def find_bags(paths: Sequence[Path]) -> list[Path]:
    """The bags named by ``paths``: a bag itself (a rosbag2 folder with ``metadata.yaml``, or an
    ``.mcap`` / ``.db3`` file), or a folder whose direct children are bags (sorted by name).

    Raises:
        EvaluateError: a path does not exist, or names no bag at all.
    """
    bags: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise EvaluateError(f"{p} does not exist")
        if _is_bag(p):
            bags.append(p)
            continue
        found = sorted(c for c in p.iterdir() if _is_bag(c)) if p.is_dir() else []
        if not found:
            raise EvaluateError(
                f"{p} is neither a bag (a folder with metadata.yaml, or an .mcap file) nor a folder of bags"
            )
        bags += found
    return bags


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "bag"


def open_loop_episodes(bags: Sequence[Path], replay_args: Sequence[str] = (), model: str = "") -> list[Episode]:
    """One ``replay`` episode per bag (ids from the bag names, made unique in order).

    Args:
        bags: bag paths (see :func:`find_bags`).
        replay_args: extra ``replay`` arguments for every episode (``--model``, ``-p`` ...).
        model: the ``model`` column (the checkpoint or preset).
    """
    episodes, seen = [], set()
    for bag in bags:
        base = _slug(bag.stem if bag.is_file() else bag.name)
        eid, n = base, 1
        while eid in seen:
            n += 1
            eid = f"{base}-{n}"
        seen.add(eid)
        args = (str(bag.resolve()), "--out", "{out}", "--overwrite", "--progress", "off", "--quiet-text", *replay_args)
        episodes.append(Episode(eid, OPEN_LOOP, {"model": model, "bag": str(bag)}, REPLAY_MODULE, args))
    return episodes


def closed_loop_episodes(
    seeds: Sequence[int],
    policy: str,
    latencies_ms: Sequence[float],
    episode_s: float,
    episode_timeout_s: float,
    loop_args: Sequence[str] = (),
    model: str = "",
    ask: str = "",
    ask_count: int = 1,
    video: str = "none",
) -> list[Episode]:
    """One ``closed_loop`` episode per (latency, seed), each ending at success or ``episode_s``.

    Args:
        seeds: cube placement seeds (gym-aloha's ``sample_box_pose``).
        policy: ``'model'`` (the oxygen node) or ``'scripted'`` (the oracle).
        latencies_ms: added policy latencies, milliseconds (one episode per seed for each).
        episode_s: simulated seconds from the first executed command to the end of a failed episode.
        episode_timeout_s: wall-clock limit handed to ``closed_loop --timeout`` (it stops its nodes
            and reports when it is reached).
        loop_args: extra ``closed_loop`` arguments (``--model``, ``--rtf``, ``--oxygen-param`` ...).
        model: the ``model`` column (the checkpoint or preset; ``scripted`` for the oracle).
        ask / ask_count: ``closed_loop --ask`` / ``--ask-count`` of every episode ("" = no ask;
            ``"Where is the cube?"`` gets each episode's answers scored).
        video: ``"none"``, ``"first"`` (the first episode only) or ``"all"``: those episodes write
            ``episode.mp4`` into their own folder (``closed_loop --video``).

    Raises:
        EvaluateError: no seed, a negative latency, a non-positive episode length, an ask count
            below 1 or an unknown ``video``.
    """
    if not seeds:
        raise EvaluateError("no episode to run (--episodes 0)")
    if any(lat < 0 for lat in latencies_ms):
        raise EvaluateError(f"latencies must be >= 0 ms, got {list(latencies_ms)}")
    if not episode_s > 0:
        raise EvaluateError(f"--episode-s must be > 0, got {episode_s}")
    if ask_count < 1:
        raise EvaluateError(f"--ask-count must be >= 1, got {ask_count}")
    if video not in VIDEO_CHOICES:
        raise EvaluateError(f"--video must be one of {list(VIDEO_CHOICES)}, got {video!r}")
    asks = ("--ask", ask) + (("--ask-count", str(ask_count)) if ask and ask_count != 1 else ())
    episodes: list[Episode] = []
    for lat in dict.fromkeys(float(v) for v in latencies_ms):  # a latency given twice runs once
        for seed in seeds:
            eid = f"{policy}-lat{lat:g}ms-seed{seed:04d}"
            args = (
                "--policy",
                policy,
                "--latency-ms",
                f"{lat:g}",
                "--seed",
                str(seed),
                "--episode-s",
                f"{episode_s:g}",
                *asks,
                *(("--video", "{out}/episode.mp4") if video == "all" or (video == "first" and not episodes) else ()),
                "--timeout",
                f"{episode_timeout_s:g}",
                "--json",
                "{out}/report.json",
                "--log-dir",
                "{out}/logs",
                *loop_args,
            )
            episodes.append(
                Episode(
                    eid,
                    CLOSED_LOOP,
                    {"model": model, "seed": seed, "policy": policy, "latency_ms": float(lat)},
                    CLOSED_LOOP_MODULE,
                    args,
                )
            )
    return episodes
