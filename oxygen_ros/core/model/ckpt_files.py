"""Checkpoint side files of both layouts: JSON helpers and normalisation statistics.

* openpi PyTorch folders: ``config.json`` as written by openpi
  ``examples/convert_jax_model_to_pytorch.py`` (``action_dim``, ``action_horizon``,
  ``paligemma_variant``, ``action_expert_variant``, ``precision``, optionally ``max_token_len``)
  and ``assets/<asset_id>/norm_stats.json`` (``{"norm_stats": {"state": {mean, std, q01, q99},
  "actions": {…}}}``, openpi ``shared/normalize.py``).
* LeRobot ``pi05`` folders: ``config.json`` of ``PI05Config`` (LeRobot
  ``policies/pi05/configuration_pi05.py``: ``type``, ``chunk_size``, ``max_action_dim``,
  ``num_inference_steps``, ``tokenizer_max_length``, ``paligemma_variant`` …) and the processor
  pipelines of ``policies/pi05/processor_pi05.py``: ``policy_preprocessor.json`` whose step 2
  ``normalizer_processor`` keeps ``observation.state.<stat>`` / ``action.<stat>`` tensors in
  ``policy_preprocessor_step_2_normalizer_processor.safetensors``, and ``policy_postprocessor.json``
  whose step 0 ``unnormalizer_processor`` keeps ``action.<stat>``
  (``policy_postprocessor_step_0_unnormalizer_processor.safetensors``).
* ``oxygen_config.json`` (ours, :meth:`ModelConfig.to_dict`): see :mod:`.ckpt_config`, which
  turns these files into a :class:`ModelConfig`.

Norm-stats dicts use openpi names: ``"state"`` and ``"actions"``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..config import ModelConfig
from ..types import NormStats
from .keymap import CheckpointError

OXYGEN_CONFIG = "oxygen_config.json"
PRE_JSON, POST_JSON = "policy_preprocessor.json", "policy_postprocessor.json"
PRE_STATS = "policy_preprocessor_step_2_normalizer_processor.safetensors"
POST_STATS = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
_LEROBOT_NAMES = {"state": "observation.state", "actions": "action"}
_STATS = ("mean", "std", "q01", "q99")


def checkpoint_folder(path_or_preset: str | Path) -> Path | None:
    """The checkpoint folder ``path_or_preset`` names, or ``None`` for a model preset name.

    A folder wins over a preset of the same name. Anything else is an error, so that a mistyped
    path says so instead of "unknown preset".

    Raises:
        CheckpointError: the path does not exist (the known presets are listed too), or is a file.
    """
    from ..config import PRESETS

    p = Path(str(path_or_preset)).expanduser()
    if p.is_dir():
        return p
    if str(path_or_preset) in PRESETS:
        return None
    if p.exists():
        raise CheckpointError(f"model {str(path_or_preset)!r} is a file, not a checkpoint folder (pass the folder "
                              f"holding model.safetensors and config.json)")
    raise CheckpointError(f"model {str(path_or_preset)!r}: checkpoint folder {p.resolve()} does not exist "
                          f"(and it is not a model preset: {sorted(PRESETS)})")


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON object file; raises :class:`CheckpointError` naming the file if invalid."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON, creating parent folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def lerobot_features(cfg: ModelConfig, stats: dict[str, NormStats]) -> tuple[dict[str, Any], dict[str, Any]]:
    """LeRobot ``input_features`` / ``output_features`` of a π0.5 config with these stats."""
    s = cfg.vision.image_size
    inputs: dict[str, Any] = {f"observation.images.{k}": {"type": "VISUAL", "shape": [3, s, s]}
                              for k in cfg.image_slots}
    inputs["observation.state"] = {"type": "STATE", "shape": [stats["state"].dim if "state" in stats else 32]}
    adim = stats["actions"].dim if "actions" in stats else cfg.action_dim
    return inputs, {"action": {"type": "ACTION", "shape": [adim]}}



# ------------------------------------------------------------------------------------ norm stats
def _stats(d: dict[str, Any], where: str) -> NormStats:
    try:
        return NormStats.from_dict(d)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{where}: {e}") from e


def read_openpi_stats(folder: Path, asset_id: str | None = None) -> tuple[dict[str, NormStats], str | None]:
    """Stats from ``assets/<asset_id>/norm_stats.json``; ``asset_id=None`` finds the only one.

    Returns:
        (``{"state": …, "actions": …}`` — empty when the folder has no stats, asset id or None).

    Raises:
        CheckpointError: the named asset is missing, several assets exist and none was chosen, or
            the file is malformed (file and entry named).
    """
    assets = folder / "assets"
    if asset_id is not None:
        path = assets / asset_id / "norm_stats.json"
        if not path.is_file():
            raise CheckpointError(f"norm stats for asset_id={asset_id!r} not found: {path}")
    else:
        found = sorted(assets.rglob("norm_stats.json")) if assets.is_dir() else []
        if not found:
            return {}, None
        if len(found) > 1:
            ids = [str(p.parent.relative_to(assets)) for p in found]
            raise CheckpointError(f"{assets} holds several norm stats {ids}; pass asset_id=")
        path = found[0]
        asset_id = str(path.parent.relative_to(assets))
    data = read_json(path)
    entries = data.get("norm_stats", data)
    if not isinstance(entries, dict):
        raise CheckpointError(f"{path}: 'norm_stats' must be an object")
    return {k: _stats(v, f"{path} [{k}]") for k, v in entries.items() if isinstance(v, dict)}, asset_id


def write_openpi_stats(folder: Path, stats: dict[str, NormStats], asset_id: str) -> None:
    """Write ``assets/<asset_id>/norm_stats.json`` (openpi format)."""
    write_json(folder / "assets" / asset_id / "norm_stats.json",
               {"norm_stats": {k: v.to_dict() for k, v in stats.items()}})


def _step_file(folder: Path, pipeline: str, registry: str, fallback: str) -> tuple[Path | None, dict]:
    """(state file, step config) of the first ``registry`` step of a LeRobot pipeline json."""
    pj = folder / pipeline
    if not pj.is_file():
        path = folder / fallback
        return (path if path.is_file() else None), {}
    for step in read_json(pj).get("steps", []):
        if step.get("registry_name") == registry:
            if "state_file" not in step:
                return None, step.get("config", {})
            path = folder / step["state_file"]
            if not path.is_file():
                raise CheckpointError(f"{pj}: {registry} state_file {step['state_file']!r} does not exist")
            return path, step.get("config", {})
    return None, {}


def _group(flat: dict[str, torch.Tensor], feature: str) -> dict[str, list[float]]:
    pre = feature + "."
    return {k[len(pre):]: flat[k].float().reshape(-1).tolist() for k in flat
            if k.startswith(pre) and "." not in k[len(pre):]}


def read_lerobot_stats(folder: Path) -> tuple[dict[str, NormStats], dict[str, Any]]:
    """Stats from the LeRobot pre/post-processor state files.

    State comes from the preprocessor ``normalizer_processor``; actions from the postprocessor
    ``unnormalizer_processor`` (falling back to the preprocessor). A base checkpoint without stats
    gives ``{}``.

    Returns:
        (stats, ``{"norm_map": …, "state_file": …, "action_file": …}``).

    Raises:
        CheckpointError: a declared state file is missing or its stats are malformed.
    """
    pre_path, pre_cfg = _step_file(folder, PRE_JSON, "normalizer_processor", PRE_STATS)
    post_path, post_cfg = _step_file(folder, POST_JSON, "unnormalizer_processor", POST_STATS)
    pre = load_file(str(pre_path)) if pre_path else {}
    post = load_file(str(post_path)) if post_path else {}
    out: dict[str, NormStats] = {}
    info: dict[str, Any] = {"norm_map": pre_cfg.get("norm_map") or post_cfg.get("norm_map"),
                            "state_file": None, "action_file": None}
    state = _group(pre, _LEROBOT_NAMES["state"])
    if state:
        out["state"] = _stats(state, f"{pre_path} [observation.state]")
        info["state_file"] = pre_path.name if pre_path else None
    for flat, path in ((post, post_path), (pre, pre_path)):
        action = _group(flat, _LEROBOT_NAMES["actions"])
        if action:
            out["actions"] = _stats(action, f"{path} [action]")
            info["action_file"] = path.name if path else None
            break
    return out, info


def require_norm_stats(stats: dict[str, NormStats], folder: Path, layout: str,
                       norm_info: dict[str, Any] | None = None, asset_id: str | None = None) -> None:
    """Raise unless ``stats`` has both ``state`` and ``actions`` (what a policy needs).

    Raises:
        CheckpointError: naming the missing quantities and the file(s) the loader read or expected
            for them (openpi ``assets/<asset_id>/norm_stats.json``; LeRobot's processor files), and
            the ``norm_stats`` console tool that writes them from one's own bags.
    """
    missing = [k for k in ("state", "actions") if k not in stats]
    if not missing:
        return
    if layout == "openpi":
        where = f"{folder / 'assets' / (asset_id or '<asset_id>') / 'norm_stats.json'} with entries 'state' and 'actions'"
    else:
        info = norm_info or {}
        pre = info.get("state_file") or "policy_preprocessor_step_<i>_normalizer_processor.safetensors"
        post = info.get("action_file") or POST_STATS
        where = (f"{folder / PRE_JSON} naming a normalizer_processor state file ({folder / pre}) with "
                 f"observation.state.q01/q99, and {folder / post} (or the preprocessor file) with action.q01/q99")
    raise CheckpointError(f"{folder}: no normalisation statistics for {' and '.join(missing)}; expected {where}. "
                          f"Compute them from your robot's bags with `norm_stats` (docs/checkpoint.md: 'Norm stats from your bags')")


def write_lerobot_stats(folder: Path, stats: dict[str, NormStats], cfg: ModelConfig) -> None:
    """Write the pi05 processor pipelines and their normaliser state files (LeRobot format).

    Raises:
        ValueError: a stats name other than ``state`` / ``actions``.
    """
    unknown = sorted(set(stats) - set(_LEROBOT_NAMES))
    if unknown:
        raise ValueError(f"LeRobot layout stores only 'state' and 'actions' stats, got also {unknown}")
    flat = {f"{_LEROBOT_NAMES[n]}.{s}": torch.from_numpy(np.asarray(getattr(v, s), dtype=np.float32).copy())
            for n, v in stats.items() for s in _STATS}
    inputs, outputs = lerobot_features(cfg, stats)
    norm_map = {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}
    norm = {"eps": 1e-8, "features": {**inputs, **outputs}, "norm_map": norm_map}
    pre_steps: list[dict[str, Any]] = [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "normalizer_processor", "config": norm},
        {"registry_name": "pi05_prepare_state_tokenizer_processor_step",
         "config": {"max_state_dim": 32, "task_key": "task"}},
        {"registry_name": "tokenizer_processor",
         "config": {"tokenizer_name": "google/paligemma-3b-pt-224", "max_length": cfg.max_token_len,
                    "task_key": "task", "padding_side": "right", "padding": "max_length", "truncation": True}},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
    ]
    post_steps: list[dict[str, Any]] = [
        {"registry_name": "unnormalizer_processor",
         "config": {"eps": 1e-8, "features": outputs, "norm_map": norm_map}},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
    ]
    if flat:
        pre_steps[2]["state_file"] = PRE_STATS
        save_file(flat, str(folder / PRE_STATS))
        act = {k: v for k, v in flat.items() if k.startswith("action.")}
        if act:
            post_steps[0]["state_file"] = POST_STATS
            save_file(act, str(folder / POST_STATS))
    write_json(folder / PRE_JSON, {"name": "policy_preprocessor", "steps": pre_steps})
    write_json(folder / POST_JSON, {"name": "policy_postprocessor", "steps": post_steps})


__all__ = ["checkpoint_folder", "OXYGEN_CONFIG", "PRE_JSON", "POST_JSON", "PRE_STATS", "POST_STATS", "read_json", "write_json",
           "lerobot_features", "read_openpi_stats", "write_openpi_stats", "read_lerobot_stats", "write_lerobot_stats",
           "require_norm_stats"]
