"""Record demonstrations: the scripted oracle in the ALOHA sim over many cube placements.

Console script ``record_demos``. Each episode is one rosbag2 (mcap) folder written by
:func:`oxygen_ros.sim.record_bag.record` — cameras, ``/joint_states``, ``/commanded_action``,
``/instruction`` and the language targets ``/language/cube_region`` and ``/language/phase`` from
the sim's true state — so the dataset is read by ``rosbags``, ``ros2 bag info`` and ``replay``
alike. Layout::

    <out>/episode_0000/   seed = first_seed
    <out>/episode_0001/   seed = first_seed + 1
    ...
    <out>/demos.json      {"first_seed", "episodes", "size", "camera_rate_hz", "seconds", "seeds"}

Episodes already complete in ``<out>`` (a bag folder with its ``metadata.yaml``) are kept, so an
interrupted run resumes. The default first seed (1000) keeps training placements apart from the
evaluation seeds (``evaluate closed-loop`` starts at 0).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from oxygen_ros.sim.record_bag import parse_size, record

__all__ = ["INDEX", "episode_folder", "main", "record_demos"]

INDEX = "demos.json"
DEFAULT_FIRST_SEED = 1000


def episode_folder(out: Path, index: int) -> Path:
    """The bag folder of episode ``index`` (0-based) under ``out``."""
    return Path(out) / f"episode_{index:04d}"


def _one(out: Path, index: int, seed: int, seconds: float, size: tuple[int, int], camera_rate: float) -> int:
    record(
        episode_folder(out, index),
        seconds=seconds,
        size=size,
        seed=seed,
        camera_rate=camera_rate,
        progress=False,
        overwrite=True,
    )
    return index


def record_demos(
    out: Path,
    episodes: int = 200,
    first_seed: int = DEFAULT_FIRST_SEED,
    seconds: float = 10.0,
    size: tuple[int, int] = (120, 160),
    camera_rate: float = 10.0,
    workers: int = 1,
    progress: bool = True,
) -> list[Path]:
    """Record ``episodes`` oracle episodes (seeds ``first_seed …``) into ``out``; returns their folders.

    Args:
        out: dataset folder (created).
        episodes: number of episodes (>= 1).
        first_seed: cube placement seed of episode 0.
        seconds: episode length in sim seconds (the script moves for 10 s).
        size: camera image ``(height, width)`` — the sim node's default 120x160.
        camera_rate: camera frames per sim second.
        workers: episodes recorded in parallel (processes).
        progress: tqdm bar over episodes.

    Raises:
        ValueError: bad counts or sizes (from :func:`record` too).
    """
    from tqdm import tqdm

    if episodes < 1 or workers < 1:
        raise ValueError(f"episodes and workers must be >= 1, got {episodes}, {workers}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [i for i in range(episodes) if not (episode_folder(out, i) / "metadata.yaml").is_file()]
    bar = tqdm(total=episodes, initial=episodes - len(todo), desc="demonstrations", unit="ep", disable=not progress)
    if workers == 1:  # in this process: nothing to fork
        for i in todo:
            _one(out, i, first_seed + i, seconds, size, camera_rate)
            bar.update(1)
    else:
        # spawn, never fork: the caller may hold threads (torch's pool, rclpy, pytest's plugins)
        # whose locks a forked child inherits taken, and then waits on forever
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            jobs = [pool.submit(_one, out, i, first_seed + i, seconds, size, camera_rate) for i in todo]
            for job in as_completed(jobs):
                job.result()
                bar.update(1)
    bar.close()
    index = {
        "first_seed": first_seed,
        "episodes": episodes,
        "seeds": [first_seed + i for i in range(episodes)],
        "size": list(size),
        "camera_rate_hz": camera_rate,
        "seconds": seconds,
        "source": "gym-aloha transfer_cube, scripted pick-and-lift (oxygen_ros.sim.task.script)",
    }
    (out / INDEX).write_text(json.dumps(index, indent=1))
    return [episode_folder(out, i) for i in range(episodes)]


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of ``record_demos``."""
    p = argparse.ArgumentParser(prog="record_demos", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="dataset folder (episode bags + demos.json)")
    p.add_argument("--episodes", type=int, default=200, help="episodes to record (default: %(default)s)")
    p.add_argument(
        "--first-seed", type=int, default=DEFAULT_FIRST_SEED, help="seed of episode 0 (default: %(default)s)"
    )
    p.add_argument("--seconds", type=float, default=10.0, help="sim seconds per episode (default: %(default)s)")
    p.add_argument(
        "--size", type=parse_size, default=(120, 160), metavar="WxH", help="camera image size (default: 160x120)"
    )
    p.add_argument("--camera-rate", type=float, default=10.0, help="camera Hz (default: %(default)s)")
    p.add_argument("--workers", type=int, default=1, help="parallel processes (default: %(default)s)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns 0, 1 (simulator not installed) or 2 (bad arguments)."""
    args = build_parser().parse_args(argv)
    try:
        folders = record_demos(
            args.out,
            episodes=args.episodes,
            first_seed=args.first_seed,
            seconds=args.seconds,
            size=args.size,
            camera_rate=args.camera_rate,
            workers=args.workers,
            progress=sys.stderr.isatty(),
        )
    except ValueError as exc:
        print(f"record_demos: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(f"record_demos: error: {exc}; install requirements-sim.txt", file=sys.stderr)
        return 1
    print(f"{len(folders)} episodes in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
