"""Load, save and fabricate π0.5 weights in the openpi and LeRobot checkpoint layouts.

* :func:`load_pretrained` — strict, meta-device load (one materialisation, no random init);
* :func:`save_pretrained` — the same layouts back (exact round trip);
* :func:`random_pretrained` — deterministic random weights for tests and the demo.

Key mapping: :mod:`.keymap`; configs: :mod:`.ckpt_config`; norm stats: :mod:`.ckpt_files`. Follows openpi
``models_pytorch/pi0_pytorch.py`` (``PI0Pytorch`` state dict, ``to_bfloat16_for_selected_params``)
and LeRobot ``policies/pi05`` (``PI05Policy``: the same module under ``model.``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import save_file
from torch import nn

from ..config import ModelConfig
from ..types import NormStats
from ..untrusted import open_safetensors
from . import ckpt_config as cc
from . import ckpt_files as cf
from .ckpt_files import FLOAT_DTYPES, INDEX, WEIGHTS
from .ckpt_shapes import check_dtypes, read_finite, read_headers, weight_index
from .gemma import MoTRunner
from .keymap import (
    LM_HEAD_KEY,
    OWN_EMBED_KEY,
    CheckpointError,
    ckpt_to_own,
    detect_layout,
    has_vision_level,
    is_skipped,
    is_tied_head,
    keep_fp32,
    layout_prefix,
    own_to_ckpt,
)
from .layers import AdaRMSNorm, PlainNorm, make_rotary
from .pi05 import Pi05Model

_MAX_LISTED = 20


@dataclass
class CheckpointInfo:
    """What :func:`load_pretrained` found besides the weights.

    Attributes:
        layout: ``"openpi"`` or ``"lerobot"``.
        folder: the checkpoint folder.
        config_source: ``"oxygen_config.json"`` or ``"config.json"`` (derived).
        raw_config: the folder's ``config.json`` as parsed (``{}`` if absent).
        asset_id: openpi asset whose ``norm_stats.json`` was read (None otherwise).
        norm_info: LeRobot processor details (``norm_map``, state files); ``{}`` for openpi.
        skipped_keys: checkpoint keys deliberately ignored (the expert LM head).
        restored_keys: own keys filled from their tied partner (the embedding from the LM head).
        dtypes: parameter dtype -> number of parameters with it, after loading.
        derived_from_shapes: config fields taken from the tensor shapes because ``config.json``
            named other sizes, as ``"vlm.width: 2048 -> 64"`` lines.
    """

    layout: str
    folder: Path
    config_source: str
    raw_config: dict[str, Any] = field(default_factory=dict)
    asset_id: str | None = None
    norm_info: dict[str, Any] = field(default_factory=dict)
    skipped_keys: list[str] = field(default_factory=list)
    restored_keys: list[str] = field(default_factory=list)
    dtypes: dict[str, int] = field(default_factory=dict)
    derived_from_shapes: list[str] = field(default_factory=list)


def _listing(title: str, items: list[str]) -> str:
    more = f" … (+{len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else ""
    return f"{title} ({len(items)}): " + ", ".join(items[:_MAX_LISTED]) + more


def plan_load(
    expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], layout: str
) -> tuple[dict[str, str], list[str], list[str], str | None]:
    """Match checkpoint keys to own keys, strictly.

    Args:
        expected: own key -> shape (the model's state dict); found: checkpoint key -> shape.

    Returns:
        (own key -> checkpoint key, skipped checkpoint keys, own keys restored from a tied partner,
        the LM-head key to compare with the embedding when both are present, else None).

    Raises:
        CheckpointError: listing every missing, unexpected and wrongly shaped key (with shapes).
    """
    level = has_vision_level(expected)
    plan: dict[str, str] = {}
    skipped, unexpected, wrong = [], [], []
    head = None
    for ck in sorted(found):
        if is_skipped(ck, layout):
            skipped.append(ck)
            continue
        if is_tied_head(ck, layout):
            head = ck
            own = OWN_EMBED_KEY
        else:
            mapped = ckpt_to_own(ck, layout, level)
            if mapped is None or mapped not in expected or mapped in plan:
                unexpected.append(f"{ck} {list(found[ck])}")
                continue
            own = mapped
        if found[ck] != expected[own]:
            wrong.append(f"{ck}: file {list(found[ck])} vs model {list(expected[own])}")
        elif ck != head:
            plan[own] = ck
    restored, compare = [], None
    if head is not None and not wrong:
        if OWN_EMBED_KEY in plan:
            compare = head
        else:
            plan[OWN_EMBED_KEY] = head
            restored.append(OWN_EMBED_KEY)
    missing = [
        f"{own_to_ckpt(k, layout)} {list(s)}"
        for k, s in expected.items()
        if k not in plan and not (k == OWN_EMBED_KEY and head is not None)
    ]
    errors = [
        _listing(t, v)
        for t, v in (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", wrong))
        if v
    ]
    if errors:
        raise CheckpointError(f"checkpoint ({layout} layout) does not match the model: " + "; ".join(errors))
    return plan, skipped, restored, compare


def target_dtype(own_key: str, device: torch.device, dtype: torch.dtype | None) -> torch.dtype:
    """dtype policy: fp32 on CPU; bf16 on CUDA; ``dtype`` overrides. Under a 16-bit dtype the Gemma
    norms (incl. adaRMS ``dense``) and the SigLIP patch/position embeddings stay fp32, as openpi
    ``to_bfloat16_for_selected_params`` (see :func:`.keymap.keep_fp32`)."""
    want = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    return torch.float32 if want.itemsize < 4 and keep_fp32(own_key) else want


def rebuild_buffers(model: Pi05Model, device: torch.device) -> None:
    """Re-create the non-persistent buffers (rotary ``inv_freq``, SigLIP ``position_ids``) on
    ``device`` exactly as a normal construction would (fp32 rotary, int64 positions).

    Raises:
        CheckpointError: some tensor is still on the meta device afterwards (unknown buffer).
    """
    for mod in model.modules():
        if isinstance(mod, MoTRunner):
            mod.rotary = make_rotary(model.cfg.vlm).to(device)
        elif hasattr(mod, "position_ids") and hasattr(mod, "num_positions"):
            # SigLIP's embeddings (an int attribute; Module.__getattr__ types it Tensor | Module)
            ids = torch.arange(cast(int, mod.num_positions), device=device).expand((1, -1))
            mod.register_buffer("position_ids", ids, persistent=False)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise CheckpointError(f"tensors left on the meta device after loading: {left}")


def _meta_model(cfg: ModelConfig) -> Pi05Model:
    with torch.device("meta"):
        return Pi05Model(cfg)


def checkpoint_shapes(cfg: ModelConfig, layout: str = "lerobot") -> dict[str, tuple[int, ...]]:
    """Checkpoint key -> shape that :func:`save_pretrained` writes for ``cfg`` (built on the meta
    device: no memory allocated). The tied LM head is not listed (written as the embedding)."""
    return {own_to_ckpt(k, layout): tuple(v.shape) for k, v in _meta_model(cfg).state_dict().items()}


def load_pretrained(
    folder: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    *,
    asset_id: str | None = None,
) -> tuple[Pi05Model, ModelConfig, dict[str, NormStats], CheckpointInfo]:
    """Load a π0.5 checkpoint folder (openpi PyTorch or LeRobot ``pi05`` layout).

    The layout comes from the weight key prefixes (``model.paligemma_with_expert.…`` → LeRobot,
    ``paligemma_with_expert.…`` → openpi). The config is ``oxygen_config.json`` if present, else
    derived from ``config.json``. The model is built on the meta device, every tensor is read once
    from safetensors (converted to its target dtype, see :func:`target_dtype`) and assigned; the
    non-persistent buffers are then rebuilt on ``device``.

    Args:
        folder: checkpoint folder; device: target device; dtype: parameter dtype override.
        asset_id: openpi asset whose ``assets/<asset_id>/norm_stats.json`` to read (default: the
            only one present).

    Returns:
        (model in eval mode, its config, norm stats ``{"state", "actions"}`` — empty if the folder
        has none, :class:`CheckpointInfo`).

    Raises:
        CheckpointError: unknown layout, bad config (a field of the wrong type or outside
            :data:`.ckpt_config.BOUNDS`), any missing/unexpected/wrongly shaped key, a weight that is
            not floating point or not finite (key, dtype / count and file named), a weight file that
            is not safetensors, a shard outside the folder, tied LM head differing from the
            embedding, malformed norm stats.
    """
    folder, device = Path(folder).expanduser(), torch.device(device)
    if not folder.exists():
        raise CheckpointError(f"checkpoint folder {folder} does not exist")
    if not folder.is_dir():
        raise CheckpointError(
            f"checkpoint path {folder} is not a folder (pass the folder holding {WEIGHTS} and config.json)"
        )
    index = weight_index(folder)
    wfile = folder / (WEIGHTS if (folder / WEIGHTS).is_file() else INDEX)
    try:
        layout = detect_layout(set(index))
    except CheckpointError as e:
        raise CheckpointError(f"{wfile}: {e}") from e
    shapes, dtypes = read_headers(index)
    cfg, source, raw, derived = cc.resolve_config(folder, layout, shapes)
    info = CheckpointInfo(
        layout=layout, folder=folder, config_source=source, raw_config=raw, derived_from_shapes=derived
    )
    if layout == "openpi":
        stats, info.asset_id = cf.read_openpi_stats(folder, asset_id)
    else:
        stats, info.norm_info = cf.read_lerobot_stats(folder)
    model = _meta_model(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    try:
        plan, info.skipped_keys, info.restored_keys, compare = plan_load(expected, shapes, layout)
    except CheckpointError as e:
        raise CheckpointError(f"{wfile}: {e}") from e
    check_dtypes(sorted(plan.values()) + ([compare] if compare else []), dtypes, index)
    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for own, ck in plan.items():
        by_file.setdefault(index[ck], []).append(own)
    for path, owns in sorted(by_file.items()):
        with open_safetensors(path) as f:
            for own in sorted(owns):
                state[own] = read_finite(f, path, plan[own], device, target_dtype(own, device, dtype))
    if compare is not None:
        with open_safetensors(index[compare]) as f:
            head = read_finite(f, index[compare], compare, device, state[OWN_EMBED_KEY].dtype)
        if not torch.equal(head, state[OWN_EMBED_KEY]):
            raise CheckpointError(f"{compare} differs from {plan[OWN_EMBED_KEY]} (they must be tied)")
    model.load_state_dict(state, strict=True, assign=True)
    rebuild_buffers(model, device)
    for p in model.parameters():
        info.dtypes[str(p.dtype)] = info.dtypes.get(str(p.dtype), 0) + p.numel()
    return model.eval(), cfg, stats, info


def save_pretrained(
    model: Pi05Model,
    folder: str | Path,
    norm_stats: dict[str, NormStats],
    layout: str = "openpi",
    tokenizer: Any = None,
    asset_id: str = "robot",
) -> Path:
    """Write ``model`` as a checkpoint folder that :func:`load_pretrained` (and openpi / LeRobot)
    read back exactly.

    Writes ``model.safetensors`` (tensors as they are, the tied LM head once as the embedding, no
    expert LM head), ``oxygen_config.json``, the layout's ``config.json``, the norm stats
    (openpi: ``assets/<asset_id>/norm_stats.json``; LeRobot: processor jsons + state files) and,
    if given, ``tokenizer.save_pretrained(folder)``.

    Raises:
        ValueError: unknown layout, or stats other than ``state``/``actions`` in the LeRobot layout.
    """
    layout_prefix(layout)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {own_to_ckpt(k, layout): v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
    cfg = model.cfg
    precision = str(model.dtype).removeprefix("torch.")
    cf.write_json(folder / cf.OXYGEN_CONFIG, cfg.to_dict())
    if layout == "openpi":
        cf.write_json(folder / "config.json", cc.openpi_config_json(cfg, precision))
        if norm_stats:
            cf.write_openpi_stats(folder, norm_stats, asset_id)
    else:
        cf.write_json(folder / "config.json", cc.lerobot_config_json(cfg, norm_stats, precision))
        cf.write_lerobot_stats(folder, norm_stats, cfg)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    return folder


@torch.no_grad()
def random_pretrained(cfg: ModelConfig, seed: int = 0) -> Pi05Model:
    """A π0.5 model with deterministic random weights (same ``cfg`` and ``seed`` → same weights).

    Built under a forked, seeded global RNG (default PyTorch / transformers init); then, from a
    ``torch.Generator`` seeded with ``seed``, the zero-initialised parts get small random values so
    that every path is exercised: adaRMS ``dense`` layers N(0, 0.02²) (else the expert ignores flow
    time), Gemma RMSNorm weights N(0, 0.1²), and the token embedding N(0, 1/width) (so that
    ``sqrt(width)``-scaled inputs and tied-head logits are O(1)). fp32, CPU, eval mode.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Pi05Model(cfg)
    gen = torch.Generator().manual_seed(seed)

    def fill(t: torch.Tensor, std: float) -> None:
        t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32) * std)

    for mod in model.modules():
        if isinstance(mod, AdaRMSNorm):
            fill(mod.dense.weight, 0.02)
            fill(mod.dense.bias, 0.02)
        elif isinstance(mod, PlainNorm):
            fill(mod.weight, 0.1)
    assert model.vlm.embed_tokens is not None  # the VLM stack has the token embedding
    fill(model.vlm.embed_tokens.weight, 1.0 / math.sqrt(cfg.vlm.width))
    return model.eval()


def count_parameters(model: nn.Module) -> int:
    """Number of parameter elements (works on the meta device)."""
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "LM_HEAD_KEY",
    "FLOAT_DTYPES",
    "weight_index",
    "plan_load",
    "check_dtypes",
    "read_finite",
    "target_dtype",
    "rebuild_buffers",
    "checkpoint_shapes",
    "load_pretrained",
    "save_pretrained",
    "random_pretrained",
    "count_parameters",
]
