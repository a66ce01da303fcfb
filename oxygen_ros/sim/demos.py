"""Record demonstrations: the scripted oracle in the ALOHA sim over many cube placements.

Console script ``record_demos``. Each episode is one rosbag2 (mcap) folder written by
:func:`oxygen_ros.sim.record_bag.record` — cameras, ``/joint_states``, ``/commanded_action``,
``/instruction`` and the language targets ``/language/cube_region`` and ``/language/phase`` from
the sim's true state — so the dataset is read by ``rosbags``, ``ros2 bag info`` and ``replay``
alike. Layout::

    <out>/episode_0000/   seed = first_seed
    <out>/episode_0001/   seed = first_seed + 1
    ...
    <out>/demos.json      {"first_seed", "episodes", "size", "camera_rate_hz", "seconds", "seeds",
                           "start_jitter_rad", "action_noise_rad"}

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

from oxygen_ros.sim.record_bag import MAX_ACTION_NOISE, MAX_START_JITTER, parse_size, record

__all__ = ["INDEX", "episode_folder", "main", "record_demos"]

INDEX = "demos.json"
DEFAULT_FIRST_SEED = 1000


def episode_folder(out: Path, index: int) -> Path:
    """The bag folder of episode ``index`` (0-based) under ``out``."""
    return Path(out) / f"episode_{index:04d}"


def _one(
    out: Path,
    index: int,
    seed: int,
    seconds: float,
    size: tuple[int, int],
    camera_rate: float,
    start_jitter: float,
    action_noise: float,
) -> int:
    record(
        episode_folder(out, index),
        seconds=seconds,
        size=size,
        seed=seed,
        camera_rate=camera_rate,
        progress=False,
        overwrite=True,
        start_jitter=start_jitter,
        action_noise_rad=action_noise,
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
    start_jitter: float = 0.0,
    action_noise: float = 0.0,
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
        start_jitter: radians; each episode's arms start this far (at most, per joint, seeded by
            the episode's seed) from the start pose — see :func:`record`. Episodes already in
            ``out`` must have been recorded with the same value.
        action_noise: radians; each episode's reach is executed with a seeded perturbation of this
            size while the oracle's own commands are recorded (DART) — see :func:`record`. Episodes
            already in ``out`` must have been recorded with the same value.

    Raises:
        ValueError: bad counts, sizes or jitter (from :func:`record` too), or ``out`` holds
            episodes recorded with another ``first_seed``, ``start_jitter`` or ``action_noise``.
    """
    from tqdm import tqdm

    if episodes < 1 or workers < 1:
        raise ValueError(f"episodes and workers must be >= 1, got {episodes}, {workers}")
    if not 0.0 <= start_jitter <= MAX_START_JITTER:
        raise ValueError(f"start jitter must be in [0, {MAX_START_JITTER}] rad, got {start_jitter}")
    if not 0.0 <= action_noise <= MAX_ACTION_NOISE:
        raise ValueError(f"action noise must be in [0, {MAX_ACTION_NOISE}] rad, got {action_noise}")
    out = Path(out)
    if (out / INDEX).is_file():  # resuming: the kept episodes must match what is asked now
        old = json.loads((out / INDEX).read_text())
        asked = (("first_seed", first_seed), ("start_jitter_rad", start_jitter), ("action_noise_rad", action_noise))
        for key, value in asked:
            if old.get(key, None if key == "first_seed" else 0.0) != value:
                raise ValueError(f"{out} holds episodes with {key} {old.get(key)}, asked {value}; use another --out")
    out.mkdir(parents=True, exist_ok=True)
    index = {
        "first_seed": first_seed,
        "episodes": episodes,
        "seeds": [first_seed + i for i in range(episodes)],
        "size": list(size),
        "camera_rate_hz": camera_rate,
        "seconds": seconds,
        "start_jitter_rad": start_jitter,
        "action_noise_rad": action_noise,
        "source": "gym-aloha transfer_cube, scripted pick-and-lift (oxygen_ros.sim.task.script)",
    }
    # written first, so an interrupted run is resumed only with the same seeds, jitter and noise
    (out / INDEX).write_text(json.dumps(index, indent=1))
    todo = [i for i in range(episodes) if not (episode_folder(out, i) / "metadata.yaml").is_file()]
    bar = tqdm(total=episodes, initial=episodes - len(todo), desc="demonstrations", unit="ep", disable=not progress)
    if workers == 1:  # in this process: nothing to fork
        for i in todo:
            _one(out, i, first_seed + i, seconds, size, camera_rate, start_jitter, action_noise)
            bar.update(1)
    else:
        # spawn, never fork: the caller may hold threads (torch's pool, rclpy, pytest's plugins)
        # whose locks a forked child inherits taken, and then waits on forever
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            args = (seconds, size, camera_rate, start_jitter, action_noise)
            jobs = [pool.submit(_one, out, i, first_seed + i, *args) for i in todo]
            for job in as_completed(jobs):
                job.result()
                bar.update(1)
    bar.close()
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
    p.add_argument(
        "--start-jitter",
        type=float,
        default=0.0,
        metavar="RAD",
        help="start each arm joint up to this far from the start pose, seeded per episode, so the arm "
        "pose does not give the cube away (default: %(default)s)",
    )
    p.add_argument(
        "--action-noise",
        type=float,
        default=0.0,
        metavar="RAD",
        help="execute each reach with a seeded perturbation of this size and record the oracle's own "
        f"commands, so the data shows the way back to the course (DART; at most {MAX_ACTION_NOISE}; "
        "default: %(default)s)",
    )
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
            start_jitter=args.start_jitter,
            action_noise=args.action_noise,
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
