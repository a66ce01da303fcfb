"""Model configs of checkpoint folders: openpi / LeRobot ``config.json``, tensor shapes and
``oxygen_config.json``, resolved into one :class:`ModelConfig` (file formats: :mod:`.ckpt_files`).

* openpi PyTorch ``config.json`` (openpi ``examples/convert_jax_model_to_pytorch.py``):
  ``action_dim``, ``action_horizon``, ``paligemma_variant``, ``action_expert_variant``,
  ``precision``, optionally ``max_token_len`` / ``discrete_state_input``;
* LeRobot ``PI05Config`` ``config.json`` (``policies/pi05/configuration_pi05.py``): ``type``,
  ``chunk_size``, ``max_action_dim``, ``num_inference_steps``, ``tokenizer_max_length``, variants …;
* ``oxygen_config.json`` (ours): complete (with ``name``, as ``save_pretrained`` writes it) or a
  partial field-by-field override.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..config import ConfigError, GemmaConfig, ModelConfig, get_preset
from ..types import NormStats
from .ckpt_files import OXYGEN_CONFIG, lerobot_features, read_json
from .keymap import CheckpointError

#: openpi ``models/gemma.py`` ``get_config`` sizes of the variants π0.5 uses.
VARIANTS: dict[str, GemmaConfig] = {
    "gemma_2b": GemmaConfig(width=2048, depth=18, mlp_dim=16384),
    "gemma_300m": GemmaConfig(width=1024, depth=18, mlp_dim=4096),
}


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


def lerobot_config_json(cfg: ModelConfig, stats: dict[str, NormStats], precision: str) -> dict[str, Any]:
    """LeRobot ``PI05Config``-style ``config.json`` (fields of ``configuration_pi05.py``)."""
    inputs, outputs = lerobot_features(cfg, stats)
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


__all__ = ["VARIANTS", "config_from_openpi", "config_from_lerobot", "resolve_config", "openpi_config_json",
           "lerobot_config_json"]
