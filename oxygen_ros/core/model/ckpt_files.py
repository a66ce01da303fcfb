"""Checkpoint side files: model configs and normalisation statistics of both layouts.

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
* ``oxygen_config.json`` (ours, :meth:`ModelConfig.to_dict`) wins over both when present.

Norm-stats dicts use openpi names: ``"state"`` and ``"actions"``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..config import ConfigError, GemmaConfig, ModelConfig, get_preset
from ..types import NormStats
from .keymap import CheckpointError

OXYGEN_CONFIG = "oxygen_config.json"
PRE_JSON, POST_JSON = "policy_preprocessor.json", "policy_postprocessor.json"
PRE_STATS = "policy_preprocessor_step_2_normalizer_processor.safetensors"
POST_STATS = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
#: openpi ``models/gemma.py`` ``get_config`` sizes of the variants π0.5 uses.
VARIANTS: dict[str, GemmaConfig] = {
    "gemma_2b": GemmaConfig(width=2048, depth=18, mlp_dim=16384),
    "gemma_300m": GemmaConfig(width=1024, depth=18, mlp_dim=4096),
}
_LEROBOT_NAMES = {"state": "observation.state", "actions": "action"}
_STATS = ("mean", "std", "q01", "q99")


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


# ---------------------------------------------------------------------------------------- configs
def _from_variants(vlm: str, expert: str, src: str, **fields: Any) -> ModelConfig:
    for field_name, v in (("paligemma_variant", vlm), ("action_expert_variant", expert)):
        if v not in VARIANTS:
            raise CheckpointError(f"{src}: {field_name}={v!r} is not supported (known: {sorted(VARIANTS)}); "
                                  f"write {OXYGEN_CONFIG} for other architectures")
    base = get_preset("pi05")
    name = "pi05" if (vlm, expert) == ("gemma_2b", "gemma_300m") else f"pi05[{vlm}+{expert}]"
    try:
        return dataclasses.replace(base, name=name, vlm=VARIANTS[vlm], expert=VARIANTS[expert],
                                   **{k: v for k, v in fields.items() if v is not None}).validate()
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{src}: {e}") from e


def config_from_openpi(d: dict[str, Any], src: str = "config.json") -> ModelConfig:
    """ModelConfig from an openpi PyTorch ``config.json`` (pi05 with gemma_2b/gemma_300m)."""
    if d.get("pi05") is False:
        raise CheckpointError(f"{src}: pi05=false (a π0 checkpoint); only π0.5 is supported")
    return _from_variants(d.get("paligemma_variant", "gemma_2b"), d.get("action_expert_variant", "gemma_300m"),
                          src, action_dim=d.get("action_dim"), action_horizon=d.get("action_horizon"),
                          max_token_len=d.get("max_token_len"), discrete_state_input=d.get("discrete_state_input"))


def config_from_lerobot(d: dict[str, Any], src: str = "config.json") -> ModelConfig:
    """ModelConfig from a LeRobot ``PI05Config`` ``config.json`` (``type`` must be ``pi05``)."""
    if d.get("type") != "pi05":
        raise CheckpointError(f"{src}: type={d.get('type')!r}, expected 'pi05' (LeRobot PI05Config)")
    res = d.get("image_resolution")
    image_size = None
    if res is not None:
        if len(res) != 2 or res[0] != res[1]:
            raise CheckpointError(f"{src}: image_resolution={res!r} must be square")
        image_size = int(res[0])
    cfg = _from_variants(d.get("paligemma_variant", "gemma_2b"), d.get("action_expert_variant", "gemma_300m"),
                         src, action_dim=d.get("max_action_dim"), action_horizon=d.get("chunk_size"),
                         num_denoise_steps=d.get("num_inference_steps"),
                         max_token_len=d.get("tokenizer_max_length"), time_min_period=d.get("min_period"),
                         time_max_period=d.get("max_period"))
    if image_size is not None and image_size != cfg.vision.image_size:
        cfg = cfg.replace(vision=dataclasses.replace(cfg.vision, image_size=image_size))
    return cfg


def _merge(base: dict[str, Any], over: dict[str, Any], where: str) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if k not in base:
            raise CheckpointError(f"{where}: unknown key {k!r} (known: {sorted(base)})")
        out[k] = _merge(base[k], v, f"{where}.{k}") if isinstance(base[k], dict) and isinstance(v, dict) else v
    return out


def resolve_config(folder: Path, layout: str, shapes: dict[str, tuple[int, ...]] | None = None
                   ) -> tuple[ModelConfig, str, dict[str, Any], list[str]]:
    """The model config of a checkpoint folder.

    1. ``config.json`` of the layout (openpi or LeRobot ``PI05Config``) gives the architecture
       variant and the non-tensor settings (horizon, steps, prompt length); without it, the
       ``pi05`` preset;
    2. with ``shapes``, every dimension the tensors determine replaces it
       (:func:`.ckpt_shapes.config_from_shapes`) — a ``config.json`` that names ``gemma_2b`` for a
       tiny model still loads;
    3. ``oxygen_config.json``, when present, overrides field by field: the full file that
       :func:`~.weights.save_pretrained` writes (it has ``name``: used as it is, nothing derived),
       or a partial one without ``name``, such as ``{"vision": {"num_heads": 2}}`` for what shapes
       cannot tell.

    Returns:
        (config, source: ``"config.json"`` / ``"oxygen_config.json"`` / ``"config.json+oxygen_config.json"``,
        the raw layout ``config.json`` or ``{}``, the fields taken from tensor shapes as
        ``"vlm.width: 2048 -> 64"`` lines).

    Raises:
        CheckpointError: no usable config, an unsupported/invalid field (named), unknown keys in
            ``oxygen_config.json``, or a dimension that neither shapes nor ``oxygen_config.json``
            determine (the message says exactly what to add).
    """
    from .ckpt_shapes import config_from_shapes, diff_configs

    raw = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    over = read_json(folder / OXYGEN_CONFIG) if (folder / OXYGEN_CONFIG).is_file() else None
    if not raw and over is None:
        raise CheckpointError(f"{folder}: neither {OXYGEN_CONFIG} nor config.json found")
    if over is not None and "name" in over:  # a complete config (what save_pretrained writes)
        try:
            return ModelConfig.from_dict(over), OXYGEN_CONFIG, raw, []
        except (ConfigError, TypeError, KeyError) as e:
            raise CheckpointError(f"{folder / OXYGEN_CONFIG}: {e}") from e
    src = str(folder / "config.json")
    base = get_preset("pi05")
    if raw:
        try:
            base = config_from_lerobot(raw, src) if layout == "lerobot" else config_from_openpi(raw, src)
        except CheckpointError:
            if over is None:  # e.g. our own "oxygen:<name>" variants: oxygen_config.json says the rest
                raise
    cfg, unresolved = base, []
    if shapes:
        cfg, _changes, unresolved = config_from_shapes(base, shapes, layout)
    source = "config.json"
    if over is not None:
        source = f"config.json+{OXYGEN_CONFIG}" if raw else OXYGEN_CONFIG
        unresolved = [u for u in unresolved if not _given(over, u)]
        try:
            cfg = ModelConfig.from_dict(_merge(cfg.to_dict(), over, OXYGEN_CONFIG))
        except (ConfigError, TypeError, KeyError, ValueError) as e:
            raise CheckpointError(f"{folder / OXYGEN_CONFIG}: {e}") from e
    if unresolved:
        names = ", ".join(unresolved)
        example = "{\"vision\": {\"num_heads\": N}}" if unresolved[0] == "vision.num_heads" else \
            "{\"vlm\": {\"num_heads\": N, \"head_dim\": D}}"
        raise CheckpointError(
            f"{folder}: the tensors do not have the sizes of the variants config.json names, and {names} "
            f"cannot be read from tensor shapes; add it to {folder / OXYGEN_CONFIG}, e.g. {example} "
            f"(a partial {OXYGEN_CONFIG} overrides the derived config field by field)")
    derived = diff_configs(base, cfg)
    if derived:
        cfg = dataclasses.replace(cfg, name=f"{base.name}[{folder.name}]")
    try:
        cfg = cfg.validate()
    except ConfigError as e:
        raise CheckpointError(f"{folder}: {e}") from e
    return cfg, source, raw, derived


def _given(over: dict[str, Any], field: str) -> bool:
    owner, _, name = field.partition(".")
    name = name.split("/")[0].split(" ")[0]
    sub = over.get(owner)
    return isinstance(sub, dict) and name in sub


def _variant_name(g: GemmaConfig, fallback: str) -> str:
    return next((n for n, v in VARIANTS.items() if v == g), fallback)


def openpi_config_json(cfg: ModelConfig, precision: str) -> dict[str, Any]:
    """openpi-style ``config.json`` (non-standard sizes get ``oxygen:<name>`` variant names)."""
    return {"action_dim": cfg.action_dim, "action_horizon": cfg.action_horizon,
            "paligemma_variant": _variant_name(cfg.vlm, f"oxygen:{cfg.name}"),
            "action_expert_variant": _variant_name(cfg.expert, f"oxygen:{cfg.name}"),
            "precision": precision, "max_token_len": cfg.max_token_len, "pi05": True}


def _features(cfg: ModelConfig, stats: dict[str, NormStats]) -> tuple[dict[str, Any], dict[str, Any]]:
    s = cfg.vision.image_size
    inputs: dict[str, Any] = {f"observation.images.{k}": {"type": "VISUAL", "shape": [3, s, s]}
                              for k in cfg.image_slots}
    inputs["observation.state"] = {"type": "STATE", "shape": [stats["state"].dim if "state" in stats else 32]}
    adim = stats["actions"].dim if "actions" in stats else cfg.action_dim
    return inputs, {"action": {"type": "ACTION", "shape": [adim]}}


def lerobot_config_json(cfg: ModelConfig, stats: dict[str, NormStats], precision: str) -> dict[str, Any]:
    """LeRobot ``PI05Config``-style ``config.json`` (fields of ``configuration_pi05.py``)."""
    inputs, outputs = _features(cfg, stats)
    return {"type": "pi05", "n_obs_steps": 1, "input_features": inputs, "output_features": outputs,
            "device": None, "use_amp": False, "push_to_hub": False,
            "paligemma_variant": _variant_name(cfg.vlm, f"oxygen:{cfg.name}"),
            "action_expert_variant": _variant_name(cfg.expert, f"oxygen:{cfg.name}"),
            "dtype": precision, "chunk_size": cfg.action_horizon, "n_action_steps": cfg.action_horizon,
            "max_state_dim": 32, "max_action_dim": cfg.action_dim, "num_inference_steps": cfg.num_denoise_steps,
            "min_period": cfg.time_min_period, "max_period": cfg.time_max_period,
            "image_resolution": [cfg.vision.image_size] * 2, "empty_cameras": 0,
            "tokenizer_max_length": cfg.max_token_len,
            "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}}


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
                          f"Compute them from your robot's bags with `norm_stats` (README: 'Norm stats from your bags')")


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
    inputs, outputs = _features(cfg, stats)
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


__all__ = ["OXYGEN_CONFIG", "VARIANTS", "read_json", "write_json", "config_from_openpi", "config_from_lerobot",
           "resolve_config", "openpi_config_json", "lerobot_config_json", "read_openpi_stats",
           "write_openpi_stats", "read_lerobot_stats", "write_lerobot_stats", "require_norm_stats"]
