"""Training samples from demonstration bags (``record_demos``): one sample per camera frame.

Each episode bag is read with ``rosbags`` (:class:`~oxygen_ros.bags.reader.BagInput`); JPEGs are
decoded exactly as the node decodes them (:func:`~oxygen_ros.ros.convert.images.compressed_to_rgb`)
and resized into the model's slots exactly as the policy does
(:func:`~oxygen_ros.core.processing.prepare_images`), so training sees the pixels inference sees.
Per frame (the top camera's stamps):

- images ``[S, 3, size, size]`` uint8 (the policy's ``[-1, 1]`` pixels are ``u / 255 * 2 - 1``);
- the joint state at the frame's stamp (``/joint_states``, same stamp in these bags);
- the action chunk: the commands at the next ``H`` control steps (``/commanded_action``; point ``i``
  is the command for ``stamp + (i + 1) * period``, the node's chunk time base), the last command
  repeated past the episode end;
- the language targets of the frame (``/language/cube_region``, ``/language/phase``).

Samples are cached as one ``.npz`` next to the episodes (keyed by the model's slots, image size and
horizon), so a second ``train`` run starts at once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oxygen_ros.core.config import ModelConfig
from oxygen_ros.core.processing import prepare_images
from oxygen_ros.sim.record_bag import (
    CAMERA_TOPICS,
    COMMAND_TOPIC,
    CUBE_REGION_TOPIC,
    INSTRUCTION_TOPIC,
    JOINT_STATES_TOPIC,
    PHASE_TOPIC,
)
from oxygen_ros.sim.scene import CAMERA_SLOTS, JOINT_NAMES
from oxygen_ros.sim.task.language import CUBE_REGIONS, PHASES

__all__ = ["DemoData", "DemoError", "episode_folders", "load_demos", "read_episode"]

CACHE_FORMAT = 1


class DemoError(ValueError):
    """A demonstration folder or bag is unusable; the message names it and why."""


@dataclass
class DemoData:
    """All training frames of a demonstration set (``N`` frames from ``E`` episodes).

    Attributes:
        images: ``[N, S, 3, size, size]`` uint8 model-slot images (slot order of the model).
        image_masks: ``[N, S]`` bool, False for a slot the recording lacks.
        state: ``[N, 14]`` float32 joint state (robot units).
        step: ``[N]`` int64 control step of the frame within its episode.
        episode: ``[N]`` int64 episode index.
        commands: ``[E, T, 14]`` float32 commanded joint targets per control step.
        region: ``[N]`` int64 index into ``CUBE_REGIONS``; phase: ``[N]`` int64 index into ``PHASES``.
        instructions: ``[E]`` task text per episode.
    """

    images: np.ndarray
    image_masks: np.ndarray
    state: np.ndarray
    step: np.ndarray
    episode: np.ndarray
    commands: np.ndarray
    region: np.ndarray
    phase: np.ndarray
    instructions: list[str]

    def __len__(self) -> int:
        return int(self.state.shape[0])

    def chunks(self, rows: np.ndarray, horizon: int) -> np.ndarray:
        """Action chunks ``[len(rows), horizon, 14]`` float32 of frames ``rows`` (robot units)."""
        steps = self.step[rows][:, None] + 1 + np.arange(horizon)[None, :]
        steps = np.minimum(steps, self.commands.shape[1] - 1)
        out: np.ndarray = self.commands[self.episode[rows][:, None], steps]
        return out

    def concat(self, other: DemoData) -> DemoData:
        """Frames of ``self`` then of ``other`` (its episodes renumbered after ``self``'s; the
        shorter command table padded with its last command, as episodes are)."""
        t = max(self.commands.shape[1], other.commands.shape[1])

        def pad(c: np.ndarray) -> np.ndarray:
            return np.concatenate([c, np.repeat(c[:, -1:], t - c.shape[1], axis=1)], axis=1)

        frames = ("images", "image_masks", "state", "step", "region", "phase")
        return DemoData(
            **{k: np.concatenate([getattr(self, k), getattr(other, k)]) for k in frames},
            episode=np.concatenate([self.episode, other.episode + len(self.instructions)]),
            commands=np.concatenate([pad(self.commands), pad(other.commands)]),
            instructions=[*self.instructions, *other.instructions],
        )

    def split(self, held_out: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Frame indices ``(train, held_out)`` for the episodes ``held_out``."""
        mask = np.isin(self.episode, np.asarray(list(held_out), dtype=np.int64))
        return np.flatnonzero(~mask), np.flatnonzero(mask)


def episode_folders(demos: str | Path) -> list[Path]:
    """The episode bag folders of a ``record_demos`` folder, in episode order.

    Raises:
        DemoError: no such folder, or no episode in it.
    """
    root = Path(demos)
    if not root.is_dir():
        raise DemoError(f"demonstrations folder {root} does not exist (record it with `record_demos --out {root}`)")
    eps = sorted(p for p in root.iterdir() if p.is_dir() and (p / "metadata.yaml").is_file())
    if not eps:
        raise DemoError(f"{root} holds no episode bag (folders with a metadata.yaml)")
    return eps


def read_episode(
    folder: Path, slots: tuple[str, ...], image_size: int
) -> tuple[dict[str, np.ndarray], np.ndarray, str]:
    """Frames, commands and instruction of one episode bag.

    Returns:
        (frames: ``images`` ``[F, S, 3, size, size]`` uint8, ``image_masks`` ``[F, S]``, ``state``
        ``[F, 14]``, ``step`` ``[F]``, ``region`` ``[F]``, ``phase`` ``[F]``; commands ``[T, 14]``;
        instruction).

    Raises:
        DemoError: unreadable bag, a missing topic, or a frame without its joint state or targets.
    """
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import CompressedImage, JointState
    from std_msgs.msg import String

    from oxygen_ros.bags.reader import BagError, BagInput
    from oxygen_ros.ros.convert.images import compressed_to_rgb
    from oxygen_ros.ros.convert.joints import joint_state_to_vector

    cam_topic = {slot: CAMERA_TOPICS[cam] for slot, cam in CAMERA_SLOTS.items() if slot in slots}
    texts = (INSTRUCTION_TOPIC, CUBE_REGION_TOPIC, PHASE_TOPIC)
    topics = [*cam_topic.values(), JOINT_STATES_TOPIC, COMMAND_TOPIC, *texts]
    state_at: dict[int, np.ndarray] = {}
    commands: list[np.ndarray] = []
    images: dict[int, dict[str, np.ndarray | None]] = {}
    text: dict[str, dict[int, str]] = {t: {} for t in texts}
    try:
        with BagInput(folder) as bag:
            missing = [t for t in topics if t not in bag.topics or bag.topics[t].count == 0]
            if missing:
                raise DemoError(f"{folder}: topics {missing} missing (recorded with `record_demos`?)")
            for topic, stamp, raw in bag.messages(topics):
                if topic == JOINT_STATES_TOPIC:
                    state_at[stamp] = joint_state_to_vector(deserialize_message(raw, JointState), JOINT_NAMES)
                elif topic == COMMAND_TOPIC:
                    commands.append(joint_state_to_vector(deserialize_message(raw, JointState), JOINT_NAMES))
                elif topic in text:
                    text[topic][stamp] = deserialize_message(raw, String).data
                else:
                    slot = next(s for s, t in cam_topic.items() if t == topic)
                    rgb = compressed_to_rgb(deserialize_message(raw, CompressedImage))
                    images.setdefault(stamp, {})[slot] = rgb
            if bag.read_error:
                raise DemoError(bag.read_error)
    except BagError as exc:
        raise DemoError(str(exc)) from exc
    stamps = sorted(state_at)
    step_of = {s: i for i, s in enumerate(stamps)}
    frames = sorted(images)
    rows: dict[str, list[np.ndarray]] = {"images": [], "image_masks": []}
    for stamp in frames:
        if stamp not in step_of or stamp not in text[CUBE_REGION_TOPIC] or stamp not in text[PHASE_TOPIC]:
            raise DemoError(f"{folder}: the frame at {stamp} ns has no joint state or language target at its stamp")
        pixels, masks = prepare_images(images[stamp], slots, image_size)
        rows["images"].append(np.rint((pixels + 1.0) * 127.5).astype(np.uint8))
        rows["image_masks"].append(masks)
    out = {
        "images": np.stack(rows["images"]),
        "image_masks": np.stack(rows["image_masks"]),
        "state": np.stack([state_at[s] for s in frames]).astype(np.float32),
        "step": np.array([step_of[s] for s in frames], dtype=np.int64),
        "region": np.array([CUBE_REGIONS.index(text[CUBE_REGION_TOPIC][s]) for s in frames], dtype=np.int64),
        "phase": np.array([PHASES.index(text[PHASE_TOPIC][s]) for s in frames], dtype=np.int64),
    }
    instruction = text[INSTRUCTION_TOPIC][min(text[INSTRUCTION_TOPIC])] if text[INSTRUCTION_TOPIC] else ""
    if len(commands) != len(stamps):
        raise DemoError(f"{folder}: {len(commands)} commands for {len(stamps)} joint states")
    return out, np.stack(commands).astype(np.float32), instruction


def _cache_key(folders: list[Path], cfg: ModelConfig) -> str:
    blob = json.dumps(
        {
            "format": CACHE_FORMAT,
            "episodes": [f.name for f in folders],
            "slots": list(cfg.image_slots),
            "size": cfg.vision.image_size,
        }
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_demos(demos: str | Path, cfg: ModelConfig, progress: bool = True, max_episodes: int = 0) -> DemoData:
    """Read (or load the cached) training frames of the ``record_demos`` folder ``demos``.

    Args:
        demos: dataset folder; cfg: the model (slots and image size); progress: tqdm bar;
        max_episodes: use only the first this many episodes (0 = all).

    Raises:
        DemoError: see :func:`episode_folders` and :func:`read_episode`.
    """
    from tqdm import tqdm

    folders = episode_folders(demos)
    if max_episodes > 0:
        folders = folders[:max_episodes]
    cache = Path(demos) / f".cache-{_cache_key(folders, cfg)}.npz"
    if cache.is_file():
        z = np.load(cache, allow_pickle=False)
        return DemoData(**{k: z[k] for k in z.files if k != "instructions"}, instructions=list(z["instructions"]))
    parts: dict[str, list[np.ndarray]] = {}
    commands, instructions = [], []
    for e, folder in enumerate(tqdm(folders, desc="reading demonstrations", unit="ep", disable=not progress)):
        frames, cmd, instruction = read_episode(folder, cfg.image_slots, cfg.vision.image_size)
        frames["episode"] = np.full(len(frames["step"]), e, dtype=np.int64)
        for k, v in frames.items():
            parts.setdefault(k, []).append(v)
        commands.append(cmd)
        instructions.append(instruction)
    longest = max(c.shape[0] for c in commands)
    padded = np.stack([np.concatenate([c, np.repeat(c[-1:], longest - len(c), 0)]) for c in commands])
    data = DemoData(**{k: np.concatenate(v) for k, v in parts.items()}, commands=padded, instructions=instructions)
    tmp = cache.with_suffix(".partial.npz")
    np.savez(tmp, **{k: getattr(data, k) for k in parts}, commands=padded, instructions=np.array(instructions))
    tmp.rename(cache)
    return data
