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
from ..untrusted import CheckpointError, json_field, read_json, short
from .ckpt_files import OXYGEN_CONFIG, lerobot_features

#: openpi ``models/gemma.py`` ``get_config`` sizes of the variants π0.5 uses.
VARIANTS: dict[str, GemmaConfig] = {
    "gemma_2b": GemmaConfig(width=2048, depth=18, mlp_dim=16384),
    "gemma_300m": GemmaConfig(width=1024, depth=18, mlp_dim=4096),
}


#: Inclusive range of every model setting a checkpoint's files may set (``config.json``,
#: ``oxygen_config.json``, tensor shapes) and the real π0.5's value: generous, but a value outside is
#: refused at load (field, value, range and file named) instead of building an absurd model.
#: Integer bounds are ints; float bounds floats.
BOUNDS: dict[str, tuple[float, float, float]] = {
    "action_horizon": (1, 1000, 50),
    "action_dim": (1, 256, 32),
    "num_denoise_steps": (1, 100, 10),
    "max_token_len": (1, 4096, 200),
    "vocab_size": (1, 1 << 20, 257152),
    "num_state_bins": (2, 4096, 256),
    "time_min_period": (1e-6, 1e6, 4e-3),
    "time_max_period": (1e-6, 1e6, 4.0),
    "vision.image_size": (1, 1024, 224),
    "vision.patch_size": (1, 64, 14),
    "vision.hidden_size": (1, 8192, 1152),
    "vision.intermediate_size": (1, 65536, 4304),
    "vision.num_layers": (1, 128, 27),
    "vision.num_heads": (1, 256, 16),
    "vision.layer_norm_eps": (1e-12, 0.1, 1e-6),
}
for _stack, _width, _mlp in (("vlm", 2048, 16384), ("expert", 1024, 4096)):
    BOUNDS.update(
        {
            f"{_stack}.width": (1, 16384, _width),
            f"{_stack}.depth": (1, 256, 18),
            f"{_stack}.mlp_dim": (1, 131072, _mlp),
            f"{_stack}.num_heads": (1, 256, 8),
            f"{_stack}.num_kv_heads": (1, 256, 1),
            f"{_stack}.head_dim": (2, 1024, 256),
            f"{_stack}.rope_theta": (1.0, 1e9, 1e4),
            f"{_stack}.rms_norm_eps": (1e-12, 0.1, 1e-6),
        }
    )
#: At most this many image tokens per camera slot ((image_size / patch_size)², π0.5: 256), and slots.
MAX_IMAGE_TOKENS, MAX_IMAGE_SLOTS = 4096, 16


def _bound(path: str, value: Any) -> str | None:
    """Why ``value`` is not allowed for the model setting ``path`` (``BOUNDS``), or None."""
    lo, hi, ref = BOUNDS[path]
    is_int = isinstance(lo, int)
    ok = isinstance(value, (int,) if is_int else (int, float)) and not isinstance(value, bool) and lo <= value <= hi
    if ok:
        return None
    if is_int:
        return f"must be an int in [{lo}, {hi}] (π0.5: {ref})"
    return f"must be a number in [{lo:g}, {hi:g}] (π0.5: {ref:g})"


def check_bounds(cfg: ModelConfig, src: str) -> None:
    """Refuse a model config with a setting outside :data:`BOUNDS` (or too many image tokens / slots).

    Raises:
        CheckpointError: ``{src}: <field>=<value> is out of range: must be … in [lo, hi] (π0.5: …)``.
    """
    for path in BOUNDS:
        value = cfg
        for part in path.split("."):
            value = getattr(value, part)
        why = _bound(path, value)
        if why:
            raise CheckpointError(f"{src}: {path}={short(value)} is out of range: {why}")
    v = cfg.vision
    if (v.image_size // v.patch_size) ** 2 > MAX_IMAGE_TOKENS or not 1 <= len(cfg.image_slots) <= MAX_IMAGE_SLOTS:
        raise CheckpointError(
            f"{src}: vision.image_size={v.image_size} / patch_size={v.patch_size} with "
            f"{len(cfg.image_slots)} image_slots is out of range: at most {MAX_IMAGE_TOKENS} "
            f"image tokens per slot and {MAX_IMAGE_SLOTS} slots (π0.5: 256 tokens, 3 slots)"
        )


def check_types(over: dict[str, Any], like: dict[str, Any], where: str) -> None:
    """Check an ``oxygen_config.json`` object field by field against ``like`` (a
    :meth:`ModelConfig.to_dict`): known keys only, sub-configs objects, ints ints (not booleans),
    floats finite numbers, ``image_slots`` a list of strings, ``name`` a string.

    Raises:
        CheckpointError: ``{where}.<field>`` named with the type it must have and what it got.
    """
    for key in over:
        if key not in like:
            raise CheckpointError(f"{where}: unknown key {key!r} (known: {sorted(like)})")
        ref = like[key]
        kind = {bool: "bool", int: "int", float: "number", str: "str", dict: "object", list: "list"}[type(ref)]
        value = json_field(over, key, kind, where)
        if isinstance(ref, dict):
            check_types(value, ref, f"{where}.{key}")
        elif isinstance(ref, list):
            for i, item in enumerate(value):
                json_field({f"{key}[{i}]": item}, f"{key}[{i}]", "str", where)


class _UnknownVariant(CheckpointError):
    """config.json names a Gemma variant other than ``VARIANTS`` (oxygen_config.json may say the rest)."""


#: config.json key -> (ModelConfig field, JSON kind) of each layout.
_OPENPI_FIELDS = {
    "action_dim": ("action_dim", "int"),
    "action_horizon": ("action_horizon", "int"),
    "max_token_len": ("max_token_len", "int"),
    "discrete_state_input": ("discrete_state_input", "bool"),
}
_LEROBOT_FIELDS = {
    "max_action_dim": ("action_dim", "int"),
    "chunk_size": ("action_horizon", "int"),
    "num_inference_steps": ("num_denoise_steps", "int"),
    "tokenizer_max_length": ("max_token_len", "int"),
    "min_period": ("time_min_period", "number"),
    "max_period": ("time_max_period", "number"),
}


def _fields(d: dict[str, Any], table: dict[str, tuple[str, str]], src: str) -> dict[str, Any]:
    """The ModelConfig fields a layout's config.json sets, each type- and range-checked."""
    out: dict[str, Any] = {}
    for key, (name, kind) in table.items():
        value = json_field(d, key, kind, src)
        why = _bound(name, value) if value is not None and name in BOUNDS else None
        if why:
            also = "" if key == name else f" (the model's {name})"
            raise CheckpointError(f"{src}: {key}={short(value)}{also} is out of range: {why}")
        if value is not None:
            out[name] = value
    return out


def _from_variants(d: dict[str, Any], src: str, fields: dict[str, Any]) -> ModelConfig:
    names = {}
    for key in ("paligemma_variant", "action_expert_variant"):
        names[key] = json_field(d, key, "str", src, "gemma_2b" if key == "paligemma_variant" else "gemma_300m")
        if names[key] not in VARIANTS:
            raise _UnknownVariant(
                f"{src}: {key}={names[key]!r} is not supported (known: {sorted(VARIANTS)}); "
                f"write {OXYGEN_CONFIG} for other architectures"
            )
    vlm, expert = names["paligemma_variant"], names["action_expert_variant"]
    name = "pi05" if (vlm, expert) == ("gemma_2b", "gemma_300m") else f"pi05[{vlm}+{expert}]"
    try:
        return dataclasses.replace(
            get_preset("pi05"), name=name, vlm=VARIANTS[vlm], expert=VARIANTS[expert], **fields
        ).validate()
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{src}: {e}") from e


def config_from_openpi(d: dict[str, Any], src: str = "config.json") -> ModelConfig:
    """ModelConfig from an openpi PyTorch ``config.json`` (pi05 with gemma_2b/gemma_300m).

    Raises:
        CheckpointError: ``pi05: false``, an unknown variant, or a field of the wrong type or out
            of :data:`BOUNDS` (file, key and value named).
    """
    if json_field(d, "pi05", "bool", src) is False:
        raise CheckpointError(f"{src}: pi05=false (a π0 checkpoint); only π0.5 is supported")
    return _from_variants(d, src, _fields(d, _OPENPI_FIELDS, src))


def config_from_lerobot(d: dict[str, Any], src: str = "config.json") -> ModelConfig:
    """ModelConfig from a LeRobot ``PI05Config`` ``config.json`` (``type`` must be ``pi05``).

    Raises:
        CheckpointError: another ``type``, an unknown variant, a non-square ``image_resolution``,
            or a field of the wrong type or out of :data:`BOUNDS` (file, key and value named).
    """
    if d.get("type") != "pi05":
        raise CheckpointError(f"{src}: type={short(d.get('type'))}, expected 'pi05' (LeRobot PI05Config)")
    fields = _fields(d, _LEROBOT_FIELDS, src)
    res = json_field(d, "image_resolution", "list", src)
    if res is not None:
        if len(res) != 2 or res[0] != res[1]:
            raise CheckpointError(f"{src}: image_resolution={short(res)} must be square: [size, size]")
        why = _bound("vision.image_size", res[0])
        if why:
            raise CheckpointError(f"{src}: image_resolution={short(res)} is out of range: the side {why}")
    cfg = _from_variants(d, src, fields)
    if res is not None and res[0] != cfg.vision.image_size:
        try:
            cfg = cfg.replace(vision=dataclasses.replace(cfg.vision, image_size=res[0]))
        except ConfigError as e:
            raise CheckpointError(f"{src}: image_resolution={short(res)}: {e}") from e
    return cfg


def _merge(base: dict[str, Any], over: dict[str, Any], where: str) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if k not in base:
            raise CheckpointError(f"{where}: unknown key {k!r} (known: {sorted(base)})")
        out[k] = _merge(base[k], v, f"{where}.{k}") if isinstance(base[k], dict) and isinstance(v, dict) else v
    return out


def resolve_config(
    folder: Path, layout: str, shapes: dict[str, tuple[int, ...]] | None = None
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
        CheckpointError: no usable config, an unsupported/invalid field or one of the wrong type
            (file and field named), a setting outside :data:`BOUNDS` (field, value, range, file),
            unknown keys in ``oxygen_config.json``, or a dimension that neither shapes nor
            ``oxygen_config.json`` determine (the message says exactly what to add).
    """
    from .ckpt_shapes import config_from_shapes, diff_configs

    raw = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    over = read_json(folder / OXYGEN_CONFIG) if (folder / OXYGEN_CONFIG).is_file() else None
    if not raw and over is None:
        raise CheckpointError(f"{folder}: neither {OXYGEN_CONFIG} nor config.json found")
    ox = folder / OXYGEN_CONFIG
    src = str(folder / "config.json")
    base = get_preset("pi05")
    if raw:  # checked even when a complete oxygen_config.json makes it unused
        try:
            base = config_from_lerobot(raw, src) if layout == "lerobot" else config_from_openpi(raw, src)
        except _UnknownVariant:
            if over is None:  # e.g. our own "oxygen:<name>" variants: oxygen_config.json says the rest
                raise
    if over is not None and "name" in over:  # a complete config (what save_pretrained writes)
        check_types(over, get_preset("pi05").to_dict(), str(ox))
        try:
            cfg = ModelConfig.from_dict(over)
        except (ConfigError, TypeError, KeyError) as e:
            raise CheckpointError(f"{ox}: {e}") from e
        check_bounds(cfg, str(ox))
        return cfg, OXYGEN_CONFIG, raw, []
    cfg = base
    unresolved: list[str] = []
    if shapes:
        cfg, _changes, unresolved = config_from_shapes(base, shapes, layout)
        check_bounds(cfg, f"{folder}: the weights' tensor shapes")
    source = "config.json"
    if over is not None:
        source = f"config.json+{OXYGEN_CONFIG}" if raw else OXYGEN_CONFIG
        unresolved = [u for u in unresolved if not _given(over, u)]
        check_types(over, cfg.to_dict(), str(ox))
        try:
            cfg = ModelConfig.from_dict(_merge(cfg.to_dict(), over, OXYGEN_CONFIG))
        except (ConfigError, TypeError, KeyError, ValueError) as e:
            raise CheckpointError(f"{ox}: {e}") from e
        check_bounds(cfg, str(ox))
    if unresolved:
        names = ", ".join(unresolved)
        example = (
            '{"vision": {"num_heads": N}}'
            if unresolved[0] == "vision.num_heads"
            else '{"vlm": {"num_heads": N, "head_dim": D}}'
        )
        raise CheckpointError(
            f"{folder}: the tensors do not have the sizes of the variants config.json names, and {names} "
            f"cannot be read from tensor shapes; add it to {folder / OXYGEN_CONFIG}, e.g. {example} "
            f"(a partial {OXYGEN_CONFIG} overrides the derived config field by field)"
        )
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
    return {
        "action_dim": cfg.action_dim,
        "action_horizon": cfg.action_horizon,
        "paligemma_variant": _variant_name(cfg.vlm, f"oxygen:{cfg.name}"),
        "action_expert_variant": _variant_name(cfg.expert, f"oxygen:{cfg.name}"),
        "precision": precision,
        "max_token_len": cfg.max_token_len,
        "pi05": True,
    }


def lerobot_config_json(cfg: ModelConfig, stats: dict[str, NormStats], precision: str) -> dict[str, Any]:
    """LeRobot ``PI05Config``-style ``config.json`` (fields of ``configuration_pi05.py``)."""
    inputs, outputs = lerobot_features(cfg, stats)
    return {
        "type": "pi05",
        "n_obs_steps": 1,
        "input_features": inputs,
        "output_features": outputs,
        "device": None,
        "use_amp": False,
        "push_to_hub": False,
        "paligemma_variant": _variant_name(cfg.vlm, f"oxygen:{cfg.name}"),
        "action_expert_variant": _variant_name(cfg.expert, f"oxygen:{cfg.name}"),
        "dtype": precision,
        "chunk_size": cfg.action_horizon,
        "n_action_steps": cfg.action_horizon,
        "max_state_dim": 32,
        "max_action_dim": cfg.action_dim,
        "num_inference_steps": cfg.num_denoise_steps,
        "min_period": cfg.time_min_period,
        "max_period": cfg.time_max_period,
        "image_resolution": [cfg.vision.image_size] * 2,
        "empty_cameras": 0,
        "tokenizer_max_length": cfg.max_token_len,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"},
    }


__all__ = [
    "VARIANTS",
    "BOUNDS",
    "MAX_IMAGE_TOKENS",
    "MAX_IMAGE_SLOTS",
    "check_bounds",
    "check_types",
    "config_from_openpi",
    "config_from_lerobot",
    "resolve_config",
    "openpi_config_json",
    "lerobot_config_json",
]
