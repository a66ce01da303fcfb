"""Write normalisation statistics where the checkpoint loader reads them.

* openpi layout: ``<folder>/assets/<asset_id>/norm_stats.json`` (openpi ``shared/normalize.py``
  format: ``{"norm_stats": {"state": {mean, std, q01, q99}, "actions": {…}}}``);
* LeRobot layout: the normaliser state files of the processor pipelines (LeRobot
  ``processor/normalize_processor.py``: ``observation.state.<stat>`` / ``action.<stat>`` tensors).
  In an existing LeRobot folder only those entries are replaced — the pipeline JSONs and any other
  entries stay as they are; a folder without pipelines gets the π0.5 ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from oxygen_ros.core.config import get_preset
from oxygen_ros.core.model import ckpt_files as cf
from oxygen_ros.core.types import NormStats

LAYOUTS = ("openpi", "lerobot")
_NAMES = {"state": "observation.state", "actions": "action"}
_STATS = ("mean", "std", "q01", "q99")


def _steps_files(folder: Path, pipeline: str, registry: str) -> list[Path]:
    path = folder / pipeline
    if not path.is_file():
        return []
    out = []
    for i, step in enumerate(cf.pipeline_steps(path)):  # CheckpointError naming a malformed file
        if step.get("registry_name") == registry and "state_file" in step:
            out.append(cf.inside(folder, step["state_file"], f"{path} steps[{i}].state_file"))  # never outside
    return out


def _update(path: Path, stats: dict[str, NormStats], which: tuple[str, ...]) -> None:
    flat = load_file(str(path)) if path.is_file() else {}
    for name in which:
        for s in _STATS:
            flat[f"{_NAMES[name]}.{s}"] = torch.from_numpy(np.asarray(getattr(stats[name], s), np.float32).copy())
    save_file(flat, str(path))


def stats_targets(folder: str | Path, layout: str = "openpi", asset_id: str = "robot") -> list[Path]:
    """The files :func:`write_stats` writes into ``folder`` (existing or not), in its order.

    Raises:
        ValueError: unknown layout; CheckpointError: a malformed LeRobot pipeline file.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} must be one of {LAYOUTS}")
    folder = Path(folder)
    if layout == "openpi":
        return [folder / "assets" / asset_id / "norm_stats.json"]
    pre = _steps_files(folder, cf.PRE_JSON, "normalizer_processor")
    if not pre:
        return [folder / cf.PRE_JSON, folder / cf.POST_JSON, folder / cf.PRE_STATS, folder / cf.POST_STATS]
    return pre + _steps_files(folder, cf.POST_JSON, "unnormalizer_processor")


def backup(path: Path) -> Path:
    """Copy ``path`` to ``<path>.bak``, or the first free ``<path>.bak.N`` (N = 1, 2, …) — an older
    backup is never replaced. Returns the backup's path."""
    target = path.with_name(path.name + ".bak")
    n = 0
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.bak.{n}")
    shutil.copy2(path, target)
    return target


def write_stats(
    folder: str | Path, stats: dict[str, NormStats], layout: str = "openpi", asset_id: str = "robot"
) -> list[Path]:
    """Write ``stats`` (``{"state", "actions"}``) into ``folder`` in the given layout (the files of
    :func:`stats_targets`; whether existing ones may be replaced is the caller's decision).

    Returns:
        The files written.

    Raises:
        ValueError: unknown layout or stats other than ``state`` / ``actions``.
    """
    targets = stats_targets(folder, layout, asset_id)
    unknown = sorted(set(stats) - set(_NAMES))
    if unknown:
        raise ValueError(f"only 'state' and 'actions' stats are written, got also {unknown}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if layout == "openpi":
        cf.write_openpi_stats(folder, stats, asset_id)
        return targets
    pre = _steps_files(folder, cf.PRE_JSON, "normalizer_processor")
    if not pre:
        cf.write_lerobot_stats(folder, stats, get_preset("pi05"))
        return targets
    for path in pre:
        _update(path, stats, ("state", "actions"))
    for path in _steps_files(folder, cf.POST_JSON, "unnormalizer_processor"):
        _update(path, stats, ("actions",))
    return targets


__all__ = ["LAYOUTS", "backup", "stats_targets", "write_stats"]
