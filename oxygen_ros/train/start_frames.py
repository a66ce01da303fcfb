"""Start frames of many cube placements: the frames that only the cameras can label.

A demonstration set of ``E`` episodes holds ``E`` placements, and at the first frames of an episode
(the arm still at, or just leaving, its start pose) nothing but the cameras tells where the cube
is. A policy trained only on the episodes can learn those few frames by heart (each start pose,
jittered or not, belongs to one episode) instead of learning to look. This module renders such
frames for many more placements than the demonstrations hold, by default all from the nominal
start pose — so that between two frames of the same step only the cube differs, and nothing but
the cube's pixels can tell their labels apart (a jittered start pose, unique to its frame, lets the
policy learn each frame by heart from its state: measured, see docs/train.md) — and labelled as a
recorded frame is:

- the scripted oracle is run from the reset (``start_jitter`` / ``action_noise`` as
  ``record_demos`` applies them; 0 by default) for ``step`` control steps (``step`` = 0 for half
  the frames, otherwise a camera frame in the first ``max_seconds``), then the cameras are rendered,
  JPEG-encoded and decoded exactly as ``record_demos`` and the node do, and resized into the model's
  slots (:func:`~oxygen_ros.core.processing.prepare_images`);
- the action chunk is the oracle's commands for the next ``H`` control steps (point ``i`` at
  ``step + i + 1``, the node's chunk time base, as :meth:`DemoData.chunks` reads a recording);
- the language targets are the sim's true cube region and the phase narration at that instant.

:func:`render_start_frames` returns a :class:`~oxygen_ros.train.dataset.DemoData` (one "episode"
per placement) that ``train --start-frames N`` mixes into every batch. Rendered once and cached as
an ``.npz`` in the demonstrations folder, keyed by everything that shapes the frames.
Needs the simulator (``requirements-sim.txt``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from oxygen_ros.core.config import ModelConfig
from oxygen_ros.train.dataset import DemoData

__all__ = ["DEFAULT_FIRST_SEED", "MAX_SECONDS", "render_start_frames", "start_step"]

DEFAULT_FIRST_SEED = 100_000
"""Placements of the start frames: seeds from here (apart from ``evaluate``'s 0.. and ``record_demos``' 1000..)."""
MAX_SECONDS = 0.6
"""Latest frame rendered, seconds after the reset (the reach has barely begun)."""
CACHE_FORMAT = 1


def start_step(seed: int, fps: float, camera_rate: float, max_seconds: float = MAX_SECONDS) -> int:
    """Control step of placement ``seed``'s frame: 0 for half the seeds (a seeded draw), otherwise a
    camera frame (a multiple of ``fps / camera_rate`` steps) in ``(0, max_seconds]``."""
    rng = np.random.default_rng([int(seed), 0x57A7])
    every = max(1, round(fps / camera_rate))
    later = int(max_seconds * fps) // every
    if later < 1 or rng.random() < 0.5:
        return 0
    return every * int(rng.integers(1, later + 1))


def _render(
    seeds: Sequence[int],
    cfg: ModelConfig,
    size: tuple[int, int],
    fps: float,
    camera_rate: float,
    start_jitter: float,
    noise_rad: float,
    horizon: int,
    jpeg_quality: int,
    progress: bool,
) -> DemoData:
    import cv2
    from tqdm import tqdm

    from oxygen_ros.core.processing import prepare_images
    from oxygen_ros.sim.record_bag import DEFAULT_INSTRUCTION, action_noise, start_offset
    from oxygen_ros.sim.scene import CAMERA_SLOTS, SimScene
    from oxygen_ros.sim.task.language import CUBE_REGIONS, PHASES, cube_region, phase
    from oxygen_ros.sim.task.script import ScriptedPickLift

    slots = {slot: cam for slot, cam in CAMERA_SLOTS.items() if slot in cfg.image_slots}
    scene = SimScene(cameras=tuple(slots.values()), image_size=size, control_rate_hz=fps)
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("images", "image_masks", "state", "step", "region", "phase")}
    commands = []
    try:
        for seed in tqdm(seeds, desc="rendering start frames", unit="frame", disable=not progress):
            scene.reset(seed, start_offset(seed, start_jitter))
            script = ScriptedPickLift(scene)
            step = start_step(seed, fps, camera_rate)
            cmd = np.stack([script(k / fps) for k in range(step + horizon + 1)])
            noise = action_noise(seed, noise_rad, step, fps)
            for k in range(step):
                scene.step(cmd[k] if noise is None else cmd[k] + noise[k])  # float64, as recorded
            rendered = scene.render()
            decoded: dict[str, np.ndarray | None] = {}
            for slot, cam in slots.items():
                bgr = cv2.cvtColor(rendered[cam], cv2.COLOR_RGB2BGR)
                ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality])
                if not ok:
                    raise RuntimeError(f"JPEG encoding of camera {cam} failed")
                back = cv2.imdecode(buf, cv2.IMREAD_COLOR)
                if back is None:
                    raise RuntimeError(f"JPEG decoding of camera {cam} failed")
                decoded[slot] = cv2.cvtColor(back, cv2.COLOR_BGR2RGB)
            pixels, masks = prepare_images(decoded, cfg.image_slots, cfg.vision.image_size)
            rows["images"].append(np.rint((pixels + 1.0) * 127.5).astype(np.uint8))
            rows["image_masks"].append(masks)
            rows["state"].append(scene.joint_positions().astype(np.float32))
            rows["step"].append(np.int64(step))
            cube = scene.cube_position
            rows["region"].append(np.int64(CUBE_REGIONS.index(cube_region(cube, landed=False))))
            rows["phase"].append(np.int64(PHASES.index(phase(step / fps, cube))))
            commands.append(cmd.astype(np.float32))
    finally:
        scene.close()
    longest = max(len(c) for c in commands)
    padded = np.stack([np.concatenate([c, np.repeat(c[-1:], longest - len(c), 0)]) for c in commands])
    out = {k: np.stack(v) for k, v in rows.items()}
    return DemoData(
        **out,
        episode=np.arange(len(seeds), dtype=np.int64),
        commands=padded,
        instructions=[DEFAULT_INSTRUCTION] * len(seeds),
    )


def render_start_frames(
    demos: str | Path,
    cfg: ModelConfig,
    count: int,
    first_seed: int = DEFAULT_FIRST_SEED,
    start_jitter: float = 0.0,
    action_noise_rad: float = 0.0,
    progress: bool = True,
) -> DemoData:
    """Render (or load the cached) start frames of ``count`` placements for training on ``demos``.

    Args:
        demos: the ``record_demos`` folder; its ``demos.json`` gives the camera size and rate.
        cfg: the model (slots, image size, action horizon ``H``).
        count: placements (one frame each), seeds ``first_seed .. first_seed + count - 1``.
        start_jitter: radians of start-pose jitter (``record_bag.start_offset``; 0: the nominal pose).
        action_noise_rad: radians of DART perturbation of the oracle's reach (``record_bag.action_noise``).

    Returns:
        :class:`DemoData` with ``count`` frames, each its own episode (commands ``[count, T, 14]``).

    Raises:
        DemoError: ``demos`` has no readable ``demos.json``.
        ValueError: ``count`` < 1, or a jitter or noise ``record_bag`` refuses.
        ImportError: the simulator is not installed.
    """
    from oxygen_ros.sim.demos import INDEX
    from oxygen_ros.sim.record_bag import MAX_ACTION_NOISE, MAX_START_JITTER
    from oxygen_ros.sim.scene import CONTROL_RATE_HZ
    from oxygen_ros.train.dataset import DemoError

    if count < 1:
        raise ValueError(f"start frames: need at least 1 placement, got {count}")
    try:
        index = json.loads((Path(demos) / INDEX).read_text())
        size = (int(index["size"][0]), int(index["size"][1]))
        camera_rate = float(index["camera_rate_hz"])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise DemoError(f"{demos}: no usable {INDEX} for the start frames' camera size and rate ({exc})") from exc
    jitter, noise = float(start_jitter), float(action_noise_rad)
    if not 0.0 <= jitter <= MAX_START_JITTER:
        raise ValueError(f"start jitter must be in [0, {MAX_START_JITTER}] rad, got {jitter}")
    if not 0.0 <= noise <= MAX_ACTION_NOISE:
        raise ValueError(f"action noise must be in [0, {MAX_ACTION_NOISE}] rad, got {noise}")
    seeds = list(range(first_seed, first_seed + count))
    key = json.dumps(
        {
            "format": CACHE_FORMAT,
            "seeds": [first_seed, count],
            "jitter": jitter,
            "noise": noise,
            "size": size,
            "camera_rate": camera_rate,
            "slots": list(cfg.image_slots),
            "image_size": cfg.vision.image_size,
            "horizon": cfg.action_horizon,
        }
    )
    cache = Path(demos) / f".start-frames-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"
    if cache.is_file():
        z = np.load(cache, allow_pickle=False)
        return DemoData(**{k: z[k] for k in z.files if k != "instructions"}, instructions=list(z["instructions"]))
    data = _render(seeds, cfg, size, CONTROL_RATE_HZ, camera_rate, jitter, noise, cfg.action_horizon, 85, progress)
    tmp = cache.with_suffix(".partial.npz")
    arrays = {k: v for k, v in data.__dict__.items() if k != "instructions"}
    np.savez(tmp, **arrays, instructions=np.array(data.instructions))
    tmp.rename(cache)
    return data
