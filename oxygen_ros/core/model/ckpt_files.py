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

Every file is untrusted input (:mod:`oxygen_ros.core.untrusted`): JSON size-, depth- and
type-checked field by field, a file name read from a file confined to the checkpoint folder, stats
finite; every malformed file raises :class:`CheckpointError` naming it (and the key).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from ..config import ModelConfig
from ..types import NormStats
from ..untrusted import CheckpointError, inside, json_field, open_safetensors, read_json, short

OXYGEN_CONFIG = "oxygen_config.json"
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
PRE_JSON, POST_JSON = "policy_preprocessor.json", "policy_postprocessor.json"
PRE_STATS = "policy_preprocessor_step_2_normalizer_processor.safetensors"
POST_STATS = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
_LEROBOT_NAMES = {"state": "observation.state", "actions": "action"}
_STATS = ("mean", "std", "q01", "q99")
#: Longest norm-stats vector accepted (real ones: the robot's joints, at most the padded 32).
MAX_STATS_DIM = 1024
#: safetensors dtypes a weight or statistic may have: floating point (converted on load). Integer,
#: boolean and float8 tensors are refused, not cast (docs/checkpoint.md: quantized weights need
#: scales that π0.5 checkpoints do not carry; casting them would silently give a different model).
FLOAT_DTYPES: tuple[str, ...] = ("F32", "BF16", "F16", "F64")


def checkpoint_folder(path_or_preset: str | os.PathLike[str]) -> Path | None:
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
        raise CheckpointError(
            f"model {str(path_or_preset)!r} is a file, not a checkpoint folder (pass the folder "
            f"holding model.safetensors and config.json)"
        )
    raise CheckpointError(
        f"model {str(path_or_preset)!r}: checkpoint folder {p.resolve()} does not exist "
        f"(and it is not a model preset: {sorted(PRESETS)})"
    )


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON, creating parent folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def lerobot_features(cfg: ModelConfig, stats: dict[str, NormStats]) -> tuple[dict[str, Any], dict[str, Any]]:
    """LeRobot ``input_features`` / ``output_features`` of a π0.5 config with these stats."""
    s = cfg.vision.image_size
    inputs: dict[str, Any] = {
        f"observation.images.{k}": {"type": "VISUAL", "shape": [3, s, s]} for k in cfg.image_slots
    }
    inputs["observation.state"] = {"type": "STATE", "shape": [stats["state"].dim if "state" in stats else 32]}
    adim = stats["actions"].dim if "actions" in stats else cfg.action_dim
    return inputs, {"action": {"type": "ACTION", "shape": [adim]}}


# ------------------------------------------------------------------------------------ norm stats
def _stats(d: dict[str, Any], where: str) -> NormStats:
    """NormStats of one quantity, refused unless 1-D, of one length in [1, MAX_STATS_DIM], finite,
    with ``q01 <= q99`` (``where``: file and entry, for the message)."""
    try:
        ns = NormStats.from_dict(d)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{where}: {e}") from e
    if not 1 <= ns.dim <= MAX_STATS_DIM:
        raise CheckpointError(f"{where}: {ns.dim} values per statistic; expected 1 to {MAX_STATS_DIM}")
    for name in _STATS:
        bad = np.flatnonzero(~np.isfinite(getattr(ns, name)))
        if bad.size:
            raise CheckpointError(f"{where}: {name}[{bad[0]}] = {getattr(ns, name)[bad[0]]} is not finite")
    bad = np.flatnonzero(ns.q99 < ns.q01)
    if bad.size:
        i = int(bad[0])
        raise CheckpointError(f"{where}: q01[{i}] = {ns.q01[i]} is above q99[{i}] = {ns.q99[i]}")
    return ns


def _json_stats(entry: Any, where: str) -> NormStats:
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: must be an object with q01/q99 (mean/std) lists, got {short(entry)}")
    for name in _STATS:
        values = json_field(entry, name, "list", where)
        for i, v in enumerate(values or []):
            json_field({f"{name}[{i}]": v}, f"{name}[{i}]", "number", where)
    return _stats(entry, where)


def _find_norm_stats(assets: Path) -> list[Path]:
    """Every ``norm_stats.json`` under ``assets``, symlinked folders not followed."""
    return sorted(
        Path(root) / "norm_stats.json" for root, _dirs, files in os.walk(assets) if "norm_stats.json" in files
    )


def read_openpi_stats(folder: Path, asset_id: str | None = None) -> tuple[dict[str, NormStats], str | None]:
    """Stats from ``assets/<asset_id>/norm_stats.json``; ``asset_id=None`` finds the only one.

    Returns:
        (``{"state": …, "actions": …}`` — empty when the folder has no stats, asset id or None).

    Raises:
        CheckpointError: the named asset is missing, several assets exist and none was chosen, the
            file lies outside the folder (a symlink), or it is malformed (file and entry named:
            not JSON, wrong types, non-finite values, q01 > q99).
    """
    assets = folder / "assets"
    if asset_id is not None:
        path = assets / asset_id / "norm_stats.json"
        if not path.is_file():
            raise CheckpointError(f"norm stats for asset_id={asset_id!r} not found: {path}")
    else:
        found = _find_norm_stats(assets) if assets.is_dir() else []
        if not found:
            return {}, None
        if len(found) > 1:
            ids = [str(p.parent.relative_to(assets)) for p in found]
            raise CheckpointError(f"{assets} holds several norm stats {ids}; pass asset_id=")
        path = found[0]
        asset_id = str(path.parent.relative_to(assets))
    inside(folder, str(path.relative_to(folder)), f"{path} (norm stats of asset {asset_id!r})")
    data = read_json(path)
    entries = json_field(data, "norm_stats", "object", str(path), data)
    for k in ("state", "actions"):
        if k in entries:
            json_field(entries, k, "object", f"{path} ['norm_stats']")
    return {k: _json_stats(v, f"{path} [{k}]") for k, v in entries.items() if isinstance(v, dict)}, asset_id


def write_openpi_stats(folder: Path, stats: dict[str, NormStats], asset_id: str) -> None:
    """Write ``assets/<asset_id>/norm_stats.json`` (openpi format)."""
    write_json(
        folder / "assets" / asset_id / "norm_stats.json", {"norm_stats": {k: v.to_dict() for k, v in stats.items()}}
    )


def pipeline_steps(path: Path) -> list[dict[str, Any]]:
    """The ``steps`` of a LeRobot processor pipeline JSON, each checked to be an object whose
    ``registry_name`` is a string and ``config`` an object.

    Raises:
        CheckpointError: naming the file and the step: not JSON, ``steps`` not a list, a step of
            the wrong type.
    """
    steps: list[dict[str, Any]] = json_field(read_json(path), "steps", "list", str(path), [])
    for i, step in enumerate(steps):
        where = f"{path} steps[{i}]"
        if not isinstance(step, dict):
            raise CheckpointError(f"{where}: must be an object, got {short(step)}")
        json_field(step, "registry_name", "str", where)
        json_field(step, "config", "object", where)
    return steps


def _step_file(folder: Path, pipeline: str, registry: str, fallback: str) -> tuple[Path | None, dict[str, Any]]:
    """(state file, step config) of the first ``registry`` step of a LeRobot pipeline json."""
    pj = folder / pipeline
    if not pj.is_file():
        path = folder / fallback
        return (path if path.is_file() else None), {}
    for i, step in enumerate(pipeline_steps(pj)):
        if step.get("registry_name") == registry:
            config = step.get("config", {})
            json_field(config, "norm_map", "object", f"{pj} steps[{i}].config", nullable=True)
            if "state_file" not in step:
                return None, config
            path = inside(folder, step["state_file"], f"{pj} steps[{i}].state_file")
            if not path.is_file():
                raise CheckpointError(f"{pj}: {registry} state_file {step['state_file']!r} does not exist")
            return path, config
    return None, {}


def _read_stats_file(path: Path | None) -> dict[str, torch.Tensor]:
    """The state / action statistics of a normaliser state file (``observation.state.<stat>``,
    ``action.<stat>``; other entries are not read): floating point, 1-D, at most ``MAX_STATS_DIM``
    long, checked in the header before anything is read."""
    if path is None:
        return {}
    out = {}
    wanted = {f"{feature}.{stat}" for feature in _LEROBOT_NAMES.values() for stat in _STATS}
    with open_safetensors(path) as f:
        for k in f.keys():
            if k not in wanted:
                continue
            sl = f.get_slice(k)
            dtype, shape = sl.get_dtype(), list(sl.get_shape())
            if dtype not in FLOAT_DTYPES or len(shape) != 1 or not 1 <= shape[0] <= MAX_STATS_DIM:
                raise CheckpointError(
                    f"{path}: {k} is {dtype} {shape}; norm stats are 1-D floating-point "
                    f"vectors ({', '.join(FLOAT_DTYPES)}) of 1 to {MAX_STATS_DIM} values"
                )
            out[k] = f.get_tensor(k)
    return out


def _group(flat: dict[str, torch.Tensor], feature: str) -> dict[str, list[float]]:
    pre = feature + "."
    return {
        k[len(pre) :]: flat[k].float().reshape(-1).tolist()
        for k in flat
        if k.startswith(pre) and "." not in k[len(pre) :]
    }


def read_lerobot_stats(folder: Path) -> tuple[dict[str, NormStats], dict[str, Any]]:
    """Stats from the LeRobot pre/post-processor state files.

    State comes from the preprocessor ``normalizer_processor``; actions from the postprocessor
    ``unnormalizer_processor`` (falling back to the preprocessor). A base checkpoint without stats
    gives ``{}``.

    Returns:
        (stats, ``{"norm_map": …, "state_file": …, "action_file": …}``).

    Raises:
        CheckpointError: a pipeline JSON is malformed, a declared state file lies outside the
            folder or is missing, a state file is not safetensors, or its stats are malformed
            (not 1-D floating point, non-finite, q01 > q99); the file and key are named.
    """
    pre_path, pre_cfg = _step_file(folder, PRE_JSON, "normalizer_processor", PRE_STATS)
    post_path, post_cfg = _step_file(folder, POST_JSON, "unnormalizer_processor", POST_STATS)
    pre, post = _read_stats_file(pre_path), _read_stats_file(post_path)
    out: dict[str, NormStats] = {}
    info: dict[str, Any] = {
        "norm_map": pre_cfg.get("norm_map") or post_cfg.get("norm_map"),
        "state_file": None,
        "action_file": None,
    }
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


def action_convention_files(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``config.json`` and the ``policy_preprocessor.json`` steps of a folder, with the fields that
    state its action convention type-checked (LeRobot ``use_relative_actions``,
    ``relative_exclude_joints``, ``action_feature_names``; the ``relative_actions_processor``
    step's ``enabled``, ``exclude_joints``, ``action_names``). Absent files give ``{}`` / ``[]``.

    Raises:
        CheckpointError: either file is malformed, or one of those fields has the wrong type (a
            string ``"false"`` must not read as true); file and key named.
    """
    cj, pj = folder / "config.json", folder / PRE_JSON
    raw = read_json(cj) if cj.is_file() else {}
    steps = pipeline_steps(pj) if pj.is_file() else []
    checks = [(raw, str(cj), "use_relative_actions", "relative_exclude_joints", "action_feature_names")]
    checks += [
        (s.get("config", {}), f"{pj} steps[{i}].config", "enabled", "exclude_joints", "action_names")
        for i, s in enumerate(steps)
        if s.get("registry_name") in ("relative_actions_processor", "delta_actions_processor")
    ]
    for d, where, flag, *lists in checks:
        json_field(d, flag, "bool", where)
        for key in lists:
            for i, v in enumerate(json_field(d, key, "list", where, nullable=True) or []):
                json_field({f"{key}[{i}]": v}, f"{key}[{i}]", "str", where)
    return raw, steps


def require_norm_stats(
    stats: dict[str, NormStats],
    folder: Path,
    layout: str,
    norm_info: dict[str, Any] | None = None,
    asset_id: str | None = None,
) -> None:
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
        where = (
            f"{folder / 'assets' / (asset_id or '<asset_id>') / 'norm_stats.json'} with entries 'state' and 'actions'"
        )
    else:
        info = norm_info or {}
        pre = info.get("state_file") or "policy_preprocessor_step_<i>_normalizer_processor.safetensors"
        post = info.get("action_file") or POST_STATS
        where = (
            f"{folder / PRE_JSON} naming a normalizer_processor state file ({folder / pre}) with "
            f"observation.state.q01/q99, and {folder / post} (or the preprocessor file) with action.q01/q99"
        )
    raise CheckpointError(
        f"{folder}: no normalisation statistics for {' and '.join(missing)}; expected {where}. "
        f"Compute them from your robot's bags with `norm_stats` (docs/checkpoint.md: 'Norm stats from your bags')"
    )


def write_lerobot_stats(folder: Path, stats: dict[str, NormStats], cfg: ModelConfig) -> None:
    """Write the pi05 processor pipelines and their normaliser state files (LeRobot format).

    Raises:
        ValueError: a stats name other than ``state`` / ``actions``.
    """
    unknown = sorted(set(stats) - set(_LEROBOT_NAMES))
    if unknown:
        raise ValueError(f"LeRobot layout stores only 'state' and 'actions' stats, got also {unknown}")
    flat = {
        f"{_LEROBOT_NAMES[n]}.{s}": torch.from_numpy(np.asarray(getattr(v, s), dtype=np.float32).copy())
        for n, v in stats.items()
        for s in _STATS
    }
    inputs, outputs = lerobot_features(cfg, stats)
    norm_map = {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}
    norm = {"eps": 1e-8, "features": {**inputs, **outputs}, "norm_map": norm_map}
    pre_steps: list[dict[str, Any]] = [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "normalizer_processor", "config": norm},
        {
            "registry_name": "pi05_prepare_state_tokenizer_processor_step",
            "config": {"max_state_dim": 32, "task_key": "task"},
        },
        {
            "registry_name": "tokenizer_processor",
            "config": {
                "tokenizer_name": "google/paligemma-3b-pt-224",
                "max_length": cfg.max_token_len,
                "task_key": "task",
                "padding_side": "right",
                "padding": "max_length",
                "truncation": True,
            },
        },
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
    ]
    post_steps: list[dict[str, Any]] = [
        {"registry_name": "unnormalizer_processor", "config": {"eps": 1e-8, "features": outputs, "norm_map": norm_map}},
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


__all__ = [
    "checkpoint_folder",
    "OXYGEN_CONFIG",
    "WEIGHTS",
    "INDEX",
    "PRE_JSON",
    "POST_JSON",
    "PRE_STATS",
    "POST_STATS",
    "MAX_STATS_DIM",
    "FLOAT_DTYPES",
    "inside",
    "read_json",
    "write_json",
    "pipeline_steps",
    "action_convention_files",
    "lerobot_features",
    "read_openpi_stats",
    "write_openpi_stats",
    "read_lerobot_stats",
    "write_lerobot_stats",
    "require_norm_stats",
]
