"""Record the ALOHA MuJoCo simulation running a scripted pick-and-lift into a rosbag2 (mcap) folder.

Console script ``record_sim_bag``. Written with the ``rosbags`` library (its own CDR serializer and
the ROS 2 Kilted typestore; these message types hash identically in Jazzy), no rclpy needed.

Topics (all stamps are simulated time from the fixed epoch ``EPOCH_NS``; bag log time = header
stamp, so the bag is deterministic for the same flags and library versions):

- ``/cam_high/image_raw/compressed``, ``/cam_left_wrist/image_raw/compressed``,
  ``/cam_right_wrist/image_raw/compressed``: ``sensor_msgs/CompressedImage`` JPEG (format
  ``"rgb8; jpeg compressed bgr8"``) of the MJCF cameras ``top``, ``left_wrist``, ``right_wrist``
  at ``--camera-rate``;
- ``/joint_states``: ``sensor_msgs/JointState``, the 14 ``JOINT_NAMES`` with position and velocity,
  every control step (``--fps``);
- ``/commanded_action``: ``sensor_msgs/JointState``, the 14 position targets sent at that stamp
  (computed from the state stamped the same; applied for the next control period; with
  ``--action-noise`` the sim applies them plus a perturbation, and this topic keeps the oracle's
  own command: the label that brings the arm back);
- ``/instruction``: ``std_msgs/String``, at t = 0 and every ``INSTRUCTION_PERIOD_S``;
- ``/ask``: ``std_msgs/String``, the language asks of ``ASKS`` that fall inside the recording;
- ``/language/cube_region``, ``/language/phase``: ``std_msgs/String``, the language targets of
  :mod:`oxygen_ros.sim.task.language` from the sim's true state (the answer to "Where is the cube?"
  and the phase narration), stamped with each camera frame.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from oxygen_ros.sim.sample_writer import SampleBagWriter, check_replaceable
from oxygen_ros.sim.scene import (
    CAMERA_SLOTS,
    CONTROL_RATE_HZ,
    CUBE_REST_Z,
    DEFAULT_CAMERAS,
    DEFAULT_IMAGE_SIZE,
    JOINT_NAMES,
)

EPOCH_NS = 1_700_000_000 * 10**9
"""Stamp of the first message (2023-11-14T22:13:20Z), nanoseconds since the Unix epoch."""

CAMERA_TOPICS: dict[str, str] = {
    "top": "/cam_high/image_raw/compressed",
    "left_wrist": "/cam_left_wrist/image_raw/compressed",
    "right_wrist": "/cam_right_wrist/image_raw/compressed",
}
"""MJCF camera -> topic (ALOHA's camera names); other cameras get ``/cam_<name>/image_raw/compressed``."""

JOINT_STATES_TOPIC = "/joint_states"
COMMAND_TOPIC = "/commanded_action"
INSTRUCTION_TOPIC = "/instruction"
ASK_TOPIC = "/ask"
CUBE_REGION_TOPIC = "/language/cube_region"
PHASE_TOPIC = "/language/phase"
DEFAULT_INSTRUCTION = "pick up the red cube"
INSTRUCTION_PERIOD_S = 2.0
ASKS: tuple[tuple[float, str], ...] = (
    (0.5, "What do you see?"),
    (3.0, "Where is the cube?"),
    (7.0, "Where is the cube?"),
    (9.0, "Describe what the robot just did."),
)
"""(seconds after start, text) of the language asks: "Where is the cube?" has a right answer (the
``/language/cube_region`` target at that stamp: on the table at 3 s, in the gripper at 7 s)."""

DEFAULT_OUT = Path("data/aloha_sim_sample")
MAX_START_JITTER = 0.5
"""Largest ``start_jitter`` accepted, radians (the script lifts the cube from every start tried
within ±0.3 rad of each arm joint)."""
MAX_ACTION_NOISE = 0.1
"""Largest ``action_noise`` accepted, radians (standard deviation of the perturbation): at 0.1 the
perturbed arm strays up to 0.45 rad from the script and the oracle still lifts the cube from every
(jittered) start tried; at 0.2 it strays up to 1.5 rad, often pushes the cube away, and lifts it
in 2 episodes of 8."""
NOISE_TIME_CONSTANT_S = 0.3
"""Correlation time of the perturbation (an Ornstein-Uhlenbeck process): slow enough to move the
arm off its course, not a jitter its position controller filters away."""
NOISE_FULL_UNTIL_S, NOISE_OFF_AT_S = 3.0, 4.0
"""The perturbation acts at full strength during the reach (the script's first 3 s), fades out
linearly by 4 s and is off from then on, so the descent, grasp and lift run as scripted."""
SIM_REQUIREMENTS = "pip install mujoco==3.8.1 gym-aloha==0.1.5"


def camera_topic(camera: str) -> str:
    """Topic of an MJCF camera's compressed image stream."""
    return CAMERA_TOPICS.get(camera, f"/cam_{camera}/image_raw/compressed")


def parse_size(text: str) -> tuple[int, int]:
    """Parse ``WIDTHxHEIGHT`` (e.g. ``320x240``) or ``N`` (square) into ``(height, width)``.

    Raises:
        argparse.ArgumentTypeError: malformed or non-positive size.
    """
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or min(parts) <= 0:
        raise argparse.ArgumentTypeError(f"size must be WIDTHxHEIGHT or N, got {text!r}")
    return parts[1], parts[0]


@dataclass
class RecordResult:
    """What a recording wrote: bag folder, message count per topic, bag size in bytes, wall time s."""

    path: Path
    counts: dict[str, int] = field(default_factory=dict)
    size_bytes: int = 0
    wall_s: float = 0.0


def start_offset(seed: int, start_jitter: float) -> np.ndarray | None:
    """The ``[14]`` start-pose offset of episode ``seed`` for :meth:`SimScene.reset`, or None for 0.

    Each arm joint gets a uniform draw from ``[-start_jitter, start_jitter]`` radians from a
    generator seeded by ``seed`` (apart from the cube placement's); the grippers get 0.
    """
    if start_jitter <= 0.0:
        return None
    rng = np.random.default_rng([int(seed), 0x5A17])
    offset = rng.uniform(-start_jitter, start_jitter, len(JOINT_NAMES))
    offset[[6, 13]] = 0.0
    return offset


def action_noise(seed: int, sigma: float, n_steps: int, fps: float) -> np.ndarray | None:
    """The ``[n_steps, 14]`` perturbation (radians) added to the applied command of episode ``seed``,
    or None for ``sigma`` 0.

    DART's noise injection (Laskey et al. 2017): the demonstrator's commands are executed with a
    perturbation while its own commands are recorded, so the demonstrations visit states off the
    nominal course and label them with the way back — the states a learned policy's own errors lead
    to. Each of the 12 arm joints follows an Ornstein-Uhlenbeck process (stationary standard
    deviation ``sigma``, correlation time ``NOISE_TIME_CONSTANT_S``, starting at 0, seeded by
    ``seed`` apart from the placement and the start jitter), scaled by the envelope
    ``NOISE_FULL_UNTIL_S`` / ``NOISE_OFF_AT_S``; the grippers get 0.
    """
    if sigma <= 0.0:
        return None
    rng = np.random.default_rng([int(seed), 0xDA27])
    decay = float(np.exp(-1.0 / (fps * NOISE_TIME_CONSTANT_S)))
    arm = np.ones(len(JOINT_NAMES), dtype=bool)
    arm[[6, 13]] = False
    x = np.zeros(len(JOINT_NAMES))
    out = np.zeros((n_steps, len(JOINT_NAMES)))
    for k in range(n_steps):
        t = k / fps
        out[k] = x * float(np.clip((NOISE_OFF_AT_S - t) / (NOISE_OFF_AT_S - NOISE_FULL_UNTIL_S), 0.0, 1.0))
        x[arm] = decay * x[arm] + np.sqrt(1.0 - decay**2) * sigma * rng.standard_normal(int(arm.sum()))
    return out


def _due(tick: int, rate: Fraction, fps: Fraction) -> bool:
    """Whether a ``rate`` Hz stream emits at control tick ``tick`` of an ``fps`` Hz loop.

    The stream emits at the first tick at or after each of its periods (tick 0 included), so any
    rate up to ``fps`` gives exactly ``rate`` messages per second of ticks on average.
    """
    return (tick * rate) % fps < rate


def record(
    out: Path,
    seconds: float = 10.0,
    fps: float = CONTROL_RATE_HZ,
    camera_rate: float = 10.0,
    size: tuple[int, int] = DEFAULT_IMAGE_SIZE,
    seed: int = 0,
    cameras: Sequence[str] = DEFAULT_CAMERAS,
    instruction: str = DEFAULT_INSTRUCTION,
    jpeg_quality: int = 85,
    overwrite: bool = False,
    progress: bool = True,
    start_jitter: float = 0.0,
    action_noise_rad: float = 0.0,
) -> RecordResult:
    """Run the scripted simulation and write the bag folder ``out`` (metadata.yaml + one .mcap).

    Args:
        out: bag folder to create.
        seconds: recorded duration; ``round(seconds * fps)`` control steps.
        fps: control rate in Hz (joint states and commands); a whole number of 2 ms physics steps.
        camera_rate: camera rate in Hz, ``0 < camera_rate <= fps``.
        size: image ``(height, width)`` in pixels.
        seed: cube placement seed.
        cameras: MJCF cameras to record.
        instruction: text published on ``/instruction``.
        jpeg_quality: OpenCV JPEG quality, 1..100.
        overwrite: replace an existing ``out``; the old one is removed only after the new bag is
            complete.
        progress: show a tqdm progress bar.
        start_jitter: radians; each of the 12 arm joints starts at gym-aloha's start pose plus an
            offset drawn uniformly from ``[-start_jitter, start_jitter]`` (seeded by ``seed``;
            grippers unchanged). With 0 every episode leaves from the same pose, and then the arm
            pose at any instant tells where the script is heading — a policy trained on such
            demonstrations can imitate them without ever looking at the cube.
        action_noise_rad: radians; the sim applies each command plus :func:`action_noise` (seeded
            by ``seed``) during the reach, while ``/commanded_action`` keeps the oracle's command.

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is false, or ``out`` is not a bag folder
            (holds anything but bag files), so ``overwrite`` will not delete it.
        ValueError: bad rates, duration, size, JPEG quality, camera, jitter or noise.
        ImportError: mujoco / gym-aloha are not installed.
    """
    from tqdm import tqdm

    from oxygen_ros.sim.scene import SimScene
    from oxygen_ros.sim.task.language import cube_region, phase
    from oxygen_ros.sim.task.script import ScriptedPickLift
    from oxygen_ros.sim.task.success import LANDED_TOL_M

    out = Path(out)
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
        check_replaceable(out)
    if len(set(cameras)) != len(cameras):
        raise ValueError(f"duplicate camera in {list(cameras)}")
    fps_q, cam_q = Fraction(str(fps)), Fraction(str(camera_rate))
    if fps_q <= 0:
        raise ValueError(f"control rate must be positive, got {fps} Hz")
    if not 0 < cam_q <= fps_q:
        raise ValueError(f"camera rate must be in (0, fps={fps}] Hz, got {camera_rate}")
    n_steps = round(seconds * fps)
    if n_steps < 1:
        raise ValueError(f"--seconds {seconds} at {fps} Hz records no control step")
    if not 1 <= jpeg_quality <= 100:
        raise ValueError(f"JPEG quality must be in 1..100, got {jpeg_quality}")
    if not 0.0 <= start_jitter <= MAX_START_JITTER:
        raise ValueError(f"start jitter must be in [0, {MAX_START_JITTER}] rad, got {start_jitter}")
    if not 0.0 <= action_noise_rad <= MAX_ACTION_NOISE:
        raise ValueError(f"action noise must be in [0, {MAX_ACTION_NOISE}] rad, got {action_noise_rad}")

    t_wall = time.perf_counter()
    scene = SimScene(cameras=cameras, image_size=size, control_rate_hz=fps)
    # Written next to ``out`` and moved into place when complete; the inner folder carries the final
    # name because rosbags names the .mcap file after its folder.
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    bag: SampleBagWriter | None = None
    try:
        types = {camera_topic(c): "sensor_msgs/msg/CompressedImage" for c in cameras}
        types[JOINT_STATES_TOPIC] = types[COMMAND_TOPIC] = "sensor_msgs/msg/JointState"
        types[INSTRUCTION_TOPIC] = types[ASK_TOPIC] = "std_msgs/msg/String"
        types[CUBE_REGION_TOPIC] = types[PHASE_TOPIC] = "std_msgs/msg/String"
        bag = SampleBagWriter(tmp / out.name, types, JOINT_NAMES)
        bag.writer.set_custom_data("oxygen_ros.source", f"gym-aloha transfer_cube, scripted pick-and-lift, seed {seed}")
        bag.writer.set_custom_data("oxygen_ros.camera_slots", " ".join(f"{k}={v}" for k, v in CAMERA_SLOTS.items()))
        bag.writer.set_custom_data("oxygen_ros.start_jitter_rad", f"{start_jitter:g}")
        bag.writer.set_custom_data("oxygen_ros.action_noise_rad", f"{action_noise_rad:g}")
        bag.writer.set_custom_data("oxygen_ros.gripper_units", "normalised opening, 0 closed .. 1 open")
        scene.reset(seed, start_offset(seed, start_jitter))
        motion = ScriptedPickLift(scene)
        noise = action_noise(seed, action_noise_rad, n_steps, float(fps_q))
        asks = sorted(ASKS)
        period_ns = Fraction(10**9) / fps_q
        next_instruction = 0.0
        landed = False
        for k in tqdm(range(n_steps), desc=f"recording {out.name}", unit="step", disable=not progress):
            stamp_ns = EPOCH_NS + round(k * period_ns)
            t = (stamp_ns - EPOCH_NS) / 1e9
            if t + 1e-9 >= next_instruction:
                bag.text(INSTRUCTION_TOPIC, instruction, stamp_ns)
                next_instruction += INSTRUCTION_PERIOD_S
            while asks and asks[0][0] <= t + 1e-9:
                bag.text(ASK_TOPIC, asks.pop(0)[1], stamp_ns)
            bag.joints(JOINT_STATES_TOPIC, scene.joint_positions(), scene.joint_velocities(), stamp_ns)
            cube = scene.cube_position
            landed = landed or abs(float(cube[2]) - CUBE_REST_Z) < LANDED_TOL_M
            if _due(k, cam_q, fps_q):
                for cam, rgb in scene.render().items():
                    bag.jpeg(camera_topic(cam), rgb, f"{cam}_camera", jpeg_quality, stamp_ns)
                bag.text(CUBE_REGION_TOPIC, cube_region(cube, landed), stamp_ns)
                bag.text(PHASE_TOPIC, phase(t, cube), stamp_ns)
            command = motion(t)
            bag.joints(COMMAND_TOPIC, command, None, stamp_ns)
            scene.step(command if noise is None else command + noise[k])
        bag.writer.close()
    except BaseException:
        if bag is not None:
            bag.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        scene.close()

    if out.exists():  # a bag folder, checked by check_replaceable above
        shutil.rmtree(out)
    (tmp / out.name).rename(out)
    tmp.rmdir()
    size_bytes = sum(p.stat().st_size for p in out.iterdir())
    return RecordResult(out, dict(bag.counts), size_bytes, time.perf_counter() - t_wall)


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of ``record_sim_bag``."""
    p = argparse.ArgumentParser(prog="record_sim_bag", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="bag folder to write (default: %(default)s)")
    p.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        help="duration in sim seconds; the script moves for 10 s, then holds (default: %(default)s)",
    )
    p.add_argument(
        "--fps",
        type=float,
        default=CONTROL_RATE_HZ,
        help="control / joint-state rate in Hz (default: %(default)s)",
    )
    p.add_argument("--camera-rate", type=float, default=10.0, help="camera rate in Hz (default: %(default)s)")
    p.add_argument(
        "--size",
        type=parse_size,
        default=DEFAULT_IMAGE_SIZE,
        metavar="WxH",
        help=f"image width x height, or N for NxN (default: {DEFAULT_IMAGE_SIZE[1]}x{DEFAULT_IMAGE_SIZE[0]})",
    )
    p.add_argument("--seed", type=int, default=0, help="cube placement seed (default: %(default)s)")
    p.add_argument(
        "--cameras",
        default=",".join(DEFAULT_CAMERAS),
        help="comma-separated MJCF cameras (default: %(default)s)",
    )
    p.add_argument("--instruction", default=DEFAULT_INSTRUCTION, help="task instruction text (default: %(default)r)")
    p.add_argument("--jpeg-quality", type=int, default=85, help="JPEG quality 1..100 (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing bag folder")
    p.add_argument(
        "--start-jitter",
        type=float,
        default=0.0,
        metavar="RAD",
        help="start each arm joint up to this far from the start pose, seeded (default: %(default)s)",
    )
    p.add_argument(
        "--action-noise",
        type=float,
        default=0.0,
        metavar="RAD",
        help="execute the oracle's reach with a seeded, slowly varying perturbation of this size, recording "
        "its own commands (DART; default: %(default)s)",
    )
    p.add_argument(
        "--no-progress", action="store_true", help="hide the progress bar (hidden anyway when stderr is not a terminal)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 simulator not installed, 2 bad arguments/existing bag)."""
    args = build_parser().parse_args(argv)
    try:
        result = record(
            args.out,
            seconds=args.seconds,
            fps=args.fps,
            camera_rate=args.camera_rate,
            size=args.size,
            seed=args.seed,
            cameras=[c for c in args.cameras.split(",") if c],
            instruction=args.instruction,
            jpeg_quality=args.jpeg_quality,
            overwrite=args.overwrite,
            start_jitter=args.start_jitter,
            action_noise_rad=args.action_noise,
            progress=not args.no_progress and sys.stderr.isatty(),  # no bar frames into a pipe
        )
    except (FileExistsError, ValueError) as exc:
        print(f"record_sim_bag: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(f"record_sim_bag: error: {exc}; the simulator needs {SIM_REQUIREMENTS}", file=sys.stderr)
        return 1
    print(f"wrote {result.path} ({result.size_bytes / 1e6:.2f} MB) in {result.wall_s:.1f} s")
    for topic, n in sorted(result.counts.items()):
        print(f"  {topic}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
