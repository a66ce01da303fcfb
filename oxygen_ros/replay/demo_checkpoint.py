"""The demo's random-weight checkpoint: built once, cached, checked on every use.

The weights are random (no real π0.5 weights exist on the development machines) but
everything else is real: the ``pi05-small`` architecture, the openpi checkpoint layout written
by ``save_pretrained``, the project's own tokenizer, and normalisation statistics computed from a
bag (q01/q99, mean, std of the joint-state positions for ``state`` and of the recorded commands
for ``actions``), so unnormalised actions land in the robot's joint ranges.

Cache: ``$OXYGEN_ROS_CACHE/<preset>-random/`` (default ``~/.cache/oxygen_ros``), with a
``oxygen_demo.json`` fingerprint (preset, seed, stats digest). A cached folder is used only if
its fingerprint matches and it loads strictly; otherwise it is rebuilt (written next to it and
renamed into place, so an interrupted build never leaves a half checkpoint behind).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from oxygen_ros.bags.reader import BagError, BagInput
from oxygen_ros.core.types import NormStats

if TYPE_CHECKING:  # torch is imported only when a checkpoint is loaded or built
    from oxygen_ros.core.policy import Pi05Policy

__all__ = ["bag_norm_stats", "cache_root", "ensure_checkpoint"]

FINGERPRINT = "oxygen_demo.json"
FORMAT = 1


def cache_root() -> Path:
    """``$OXYGEN_ROS_CACHE`` or ``~/.cache/oxygen_ros``."""
    env = os.environ.get("OXYGEN_ROS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "oxygen_ros"


def _stats(rows: list[np.ndarray]) -> NormStats:
    a = np.stack(rows).astype(np.float64)
    return NormStats(
        mean=a.mean(0).astype(np.float32),
        std=a.std(0).astype(np.float32),
        q01=np.quantile(a, 0.01, axis=0).astype(np.float32),
        q99=np.quantile(a, 0.99, axis=0).astype(np.float32),
    )


def bag_norm_stats(
    bag: str | os.PathLike[str],
    joint_names: Sequence[str],
    state_topic: str = "/joint_states",
    action_topic: str = "/commanded_action",
) -> dict[str, NormStats]:
    """Normalisation stats ``{"state", "actions"}`` from a bag's JointState positions.

    ``actions`` come from ``action_topic``; a bag without it uses the joint states for both.
    Messages that lack a joint or hold non-finite values are skipped.

    Raises:
        BagError: unreadable bag, or fewer than 2 usable joint states.
    """
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import JointState

    from oxygen_ros.ros.convert import JointStateError, joint_state_to_vector

    rows: dict[str, list[np.ndarray]] = {state_topic: [], action_topic: []}
    with BagInput(bag) as b:
        topics = [t for t in rows if t in b.topics and b.topics[t].msgtype == "sensor_msgs/msg/JointState"]
        for topic, _, raw in b.messages(topics):
            try:
                rows[topic].append(joint_state_to_vector(deserialize_message(raw, JointState), joint_names))
            except (JointStateError, RuntimeError):
                continue
        if b.read_error:
            raise BagError(b.read_error)
    if len(rows[state_topic]) < 2:
        raise BagError(
            f"{bag}: need at least 2 usable {state_topic} messages with joints "
            f"{list(joint_names)} for normalisation stats, found {len(rows[state_topic])}"
        )
    actions = rows[action_topic] if len(rows[action_topic]) >= 2 else rows[state_topic]
    return {"state": _stats(rows[state_topic]), "actions": _stats(actions)}


def _fingerprint(preset: str, seed: int, stats: dict[str, NormStats]) -> dict[str, Any]:
    blob = json.dumps({k: v.to_dict() for k, v in sorted(stats.items())}, sort_keys=True)
    return {"format": FORMAT, "preset": preset, "seed": seed, "stats_sha256": hashlib.sha256(blob.encode()).hexdigest()}


def _load(folder: Path) -> Pi05Policy:
    from oxygen_ros.core.policy import Pi05Policy

    return Pi05Policy.from_pretrained(folder)  # device as the node's default: CUDA if available


def ensure_checkpoint(
    stats: dict[str, NormStats],
    preset: str = "pi05-small",
    seed: int = 0,
    root: Path | None = None,
    log: Callable[[str], None] = print,
) -> tuple[Path, Pi05Policy]:
    """Return ``(folder, policy)`` of the cached random-weight checkpoint, building it if needed.

    Args:
        stats: normalisation stats to store (see :func:`bag_norm_stats`).
        preset: model preset; seed: weight seed; root: cache root (default :func:`cache_root`).
        log: progress messages.

    Raises:
        OSError: the cache folder cannot be written.
    """
    import torch

    from oxygen_ros.core.config import get_preset
    from oxygen_ros.core.model.weights import random_pretrained, save_pretrained
    from oxygen_ros.core.tokenizer import build_tokenizer

    root = Path(root) if root is not None else cache_root()
    folder = root / f"{preset}-random"
    want = _fingerprint(preset, seed, stats)
    if folder.is_dir():
        try:
            have = json.loads((folder / FINGERPRINT).read_text())
        except (OSError, ValueError):
            have = None
        if have == want:
            try:
                policy = _load(folder)
                log(f"using the cached random-weight {preset} checkpoint {folder}")
                return folder, policy
            except Exception as exc:  # noqa: BLE001 - any load failure means: rebuild
                log(f"cached checkpoint {folder} does not load ({type(exc).__name__}: {exc}); rebuilding")
        else:
            log(f"cached checkpoint {folder} was built for other settings; rebuilding")
    log(
        f"building a random-weight {preset} checkpoint (seed {seed}) with normalisation stats from "
        f"the bag into {folder} (first run only)"
    )
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{folder.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        cfg = get_preset(preset)
        with torch.random.fork_rng(devices=[]):
            model = random_pretrained(cfg, seed=seed)
        save_pretrained(model, tmp, stats, layout="openpi", tokenizer=build_tokenizer(cfg.vocab_size))
        (tmp / FINGERPRINT).write_text(json.dumps(want, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        return folder, _load(folder)  # strict load of what was just written
    except Exception:
        shutil.rmtree(folder, ignore_errors=True)  # never leave a checkpoint that does not load
        raise
