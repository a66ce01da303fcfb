"""``make demo``: the bundled ALOHA sim bag through the unified engine, with a report.

1. loads the bundled trained policy (``data/pi05_sim_aloha``: ``pi05-sim`` trained by ``train`` on
   the sim's scripted demonstrations, see its model card); ``--model random`` builds (first run) or
   reuses a random-weight ``pi05-small`` checkpoint instead, with the project's tokenizer and
   normalisation stats from the bag (:mod:`.demo_checkpoint`);
2. replays the bag offline through the unified engine with the node's parameter file
   (``config/oxygen.yaml``), one frame per camera frame, as fast as the CPU allows, streaming the
   language tasks to the terminal (conversation answers to the bag's asks, periodic memory notes);
3. prints the report (timing, and the open-loop action accuracy against the bag's commanded actions
   next to a hold-the-state baseline) and writes the output bag, report and plots to ``--out``.

With ``--model /path/to/pi05`` another checkpoint is used (greedy text). Random weights produce
meaningless text; greedy decoding of them only repeats the last prompt token (spaces), so with
``--model random`` the demo samples at temperature 2 to make the token stream visible.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["DEMO_PARAMS", "build_parser", "demo_threads", "main", "sample_bag", "shipped_policy"]

DEMO_PARAMS: tuple[str, ...] = (
    "tasks.conversation.temperature:=2.0",
    "tasks.conversation.max_new_tokens:=24",
    "tasks.memory.temperature:=2.0",
    "tasks.memory.max_new_tokens:=16",
)
"""Overrides for random weights only (see the module doc); a real ``--model`` runs without them."""


def sample_bag() -> Path:
    """The bundled sample bag: ``$OXYGEN_ROS_SAMPLE_BAG``, the source tree's ``data/``, or the
    installed share folder."""
    import os

    env = os.environ.get("OXYGEN_ROS_SAMPLE_BAG")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[2] / "data" / "aloha_sim_sample"
    if here.is_dir():
        return here
    return Path(sys.prefix) / "share" / "oxygen_ros" / "data" / "aloha_sim_sample"


def shipped_policy() -> Path:
    """The bundled trained sim policy: the source tree's ``data/pi05_sim_aloha`` or the installed
    share folder."""
    here = Path(__file__).resolve().parents[2] / "data" / "pi05_sim_aloha"
    if here.is_dir():
        return here
    return Path(sys.prefix) / "share" / "oxygen_ros" / "data" / "pi05_sim_aloha"


def demo_threads() -> int:
    """Torch CPU threads for the demo: all cores but one (at least 1).

    PyTorch's OpenMP threads spin-wait for each other; with as many threads as cores, any other
    busy process stalls every operator (on 2 shared cores a frame took 1-6 s with 2 threads and
    0.33 s with 1), so one core is left to the rest of the machine.
    """
    import os

    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, n - 1)


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of the demo."""
    p = argparse.ArgumentParser(
        prog="oxygen_demo", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--bag", type=Path, default=None, help="bag to replay (default: the bundled sample)")
    p.add_argument(
        "--model",
        default=None,
        help="checkpoint folder, or 'random' for a cached random-weight pi05-small (default: the bundled "
        "trained sim policy)",
    )
    p.add_argument(
        "--out", type=Path, default=Path("out") / "oxygen_demo", help="output folder (replaced on every run)"
    )
    p.add_argument("--params-file", type=Path, default=None, help="node parameter YAML (default: config/oxygen.yaml)")
    p.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="NAME:=VALUE",
        help="extra parameter override (repeatable)",
    )
    p.add_argument("--timing", choices=("fast", "recorded"), default="fast")
    p.add_argument(
        "--frame-period", type=float, default=0.0, help="least bag seconds between frames (0 = every camera frame)"
    )
    p.add_argument("--max-frames", type=int, default=0)
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit status (0 ok, 2 unusable input, 3 incomplete result)."""
    args = build_parser().parse_args(argv)
    t0 = time.perf_counter()
    from oxygen_ros.bags.reader import BagError
    from oxygen_ros.replay.prepare import ReplaySetupError, default_params_file, load_node_config
    from oxygen_ros.replay.replay import ReplayError, ReplayOptions, replay

    threads = demo_threads()
    bag = args.bag or sample_bag()
    params_file = args.params_file or default_params_file()
    print(f"oxygen_ros demo: replaying {bag} through the unified engine (parameters: {params_file})")
    policy, overrides = None, [f"num_threads:={threads}", *args.param]
    import torch

    torch.set_num_threads(threads)
    try:
        if args.model == "random":
            from oxygen_ros.replay.demo_checkpoint import bag_norm_stats, ensure_checkpoint
            from oxygen_ros.replay.prepare import TopicMap

            cfg = load_node_config(params_file, overrides)
            topics = TopicMap.from_config(cfg)
            stats = bag_norm_stats(bag, cfg.joint_names, topics.joint_state)
            folder, policy = ensure_checkpoint(stats)
            overrides = [*DEMO_PARAMS, f"model:={folder}", *overrides]
        else:
            overrides = [f"model:={args.model or shipped_policy()}", *overrides]
        print("parameter overrides: " + " ".join(f"-p {o}" for o in overrides))
        opts = ReplayOptions(
            bag=bag,
            out=args.out,
            params_file=params_file,
            params=tuple(overrides),
            timing=args.timing,
            frame_period_s=args.frame_period,
            max_frames=args.max_frames,
            progress=args.progress,
            overwrite=True,
        )
        result = replay(opts, policy=policy)
    except (ReplayError, ReplaySetupError, BagError) as exc:
        print(f"oxygen_demo: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("oxygen_demo: interrupted", file=sys.stderr)
        return 130
    print()
    print(result.report)
    print(
        f"\noutputs in {args.out}/: output_bag/ (mcap: action chunks + text), report.txt, "
        "report.json, " + ", ".join(f.name for f in result.files if f.suffix == ".png")
    )
    print(f"demo finished in {time.perf_counter() - t0:.0f} s")
    return 0 if result.ok else 3


if __name__ == "__main__":
    sys.exit(main())
