"""Model dimensions read from a checkpoint's tensor shapes.

A LeRobot ``config.json`` can only name the standard variants (``gemma_2b`` / ``gemma_300m``,
LeRobot ``policies/pi05/configuration_pi05.py``), and openpi's converted ``config.json`` names the
same variants, so a checkpoint of another size (a distilled or tiny model) carries its true
widths only in its tensors. This module derives every dimension the shapes determine:

============================  ====================================================================
field                         tensor (checkpoint names, layout prefix stripped)
============================  ====================================================================
``vocab_size``, vlm width     ``…paligemma.lm_head.weight`` / ``…language_model.embed_tokens.weight``
                              ``[vocab, width]``
``{vlm,expert}.depth``        number of ``…layers.<i>.`` indices
``{vlm,expert}.mlp_dim``      ``…layers.0.mlp.gate_proj.weight`` ``[mlp, width]``
``head_dim``, ``num_heads``   ``…layers.0.self_attn.k_proj.weight`` ``[kv_heads * head_dim, width]``
                              and ``q_proj`` ``[num_heads * head_dim, width]`` — with the base
                              config's ``num_kv_heads`` (1 in every π0.5 variant)
expert width, action_dim      ``action_in_proj.weight`` ``[expert width, action_dim]``
``vision.hidden_size``,       ``…vision_model.embeddings.patch_embedding.weight``
``vision.patch_size``         ``[hidden, 3, patch, patch]``
``vision.image_size``         ``…position_embedding.weight`` ``[(image / patch)^2, hidden]``
``vision.intermediate_size``  ``…encoder.layers.0.mlp.fc1.weight`` ``[mlp, hidden]``
``vision.num_layers``         number of ``…encoder.layers.<i>.`` indices
============================  ====================================================================

What shapes cannot tell: the SigLIP head count (``q_proj`` is ``[hidden, hidden]`` whatever the
split) once the width differs from the base config's, and anything not stored as a tensor
(``max_token_len``, ``action_horizon``, flow-time periods — those come from ``config.json``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from ..config import GemmaConfig, ModelConfig, VisionConfig
from .keymap import EMBED_KEY, LM_HEAD_KEY, VISION_CKPT, VISION_LEVEL, layout_prefix

_VLM = "paligemma_with_expert.paligemma.model.language_model."
_EXPERT = "paligemma_with_expert.gemma_expert.model."
_VISION = VISION_CKPT + VISION_LEVEL


def _strip(shapes: dict[str, tuple[int, ...]], layout: str) -> dict[str, tuple[int, ...]]:
    pre = layout_prefix(layout)
    out = {k[len(pre):]: v for k, v in shapes.items() if k.startswith(pre)}
    # keys without the vision_model. level are accepted by the loader: normalise them here
    return {(_VISION + k[len(VISION_CKPT):] if k.startswith(VISION_CKPT) and not k.startswith(_VISION) else k): v
            for k, v in out.items()}


def _depth(shapes: dict[str, tuple[int, ...]], prefix: str) -> int | None:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    idx = {int(m.group(1)) for k in shapes if (m := pat.match(k))}
    return max(idx) + 1 if idx else None


def _gemma(shapes: dict[str, tuple[int, ...]], prefix: str, base: GemmaConfig, width: int | None,
           owner: str, unresolved: list[str]) -> GemmaConfig:
    changes: dict[str, Any] = {}
    depth = _depth(shapes, prefix + "layers.")
    if depth is not None:
        changes["depth"] = depth
    gate = shapes.get(prefix + "layers.0.mlp.gate_proj.weight")
    if gate is not None:
        changes["mlp_dim"] = gate[0]
        width = width if width is not None else gate[1]
    if width is not None:
        changes["width"] = width
    q = shapes.get(prefix + "layers.0.self_attn.q_proj.weight")
    k = shapes.get(prefix + "layers.0.self_attn.k_proj.weight")
    if q is not None and k is not None and (q[0], k[0]) != (base.num_heads * base.head_dim,
                                                            base.num_kv_heads * base.head_dim):
        kv = base.num_kv_heads
        if k[0] % kv or q[0] % (k[0] // kv):
            unresolved.append(f"{owner}.num_heads/{owner}.num_kv_heads/{owner}.head_dim "
                              f"(q_proj {list(q)}, k_proj {list(k)})")
        else:
            changes["head_dim"] = k[0] // kv
            changes["num_heads"] = q[0] // changes["head_dim"]
    return dataclasses.replace(base, **changes)


def _vision(shapes: dict[str, tuple[int, ...]], base: VisionConfig, unresolved: list[str]) -> VisionConfig:
    changes: dict[str, Any] = {}
    patch = shapes.get(_VISION + "embeddings.patch_embedding.weight")
    if patch is not None and len(patch) == 4:
        changes["hidden_size"], changes["patch_size"] = patch[0], patch[2]
    pos = shapes.get(_VISION + "embeddings.position_embedding.weight")
    if pos is not None and patch is not None:
        side = math.isqrt(pos[0])
        if side * side == pos[0]:
            changes["image_size"] = side * patch[2]
    fc1 = shapes.get(_VISION + "encoder.layers.0.mlp.fc1.weight")
    if fc1 is not None:
        changes["intermediate_size"] = fc1[0]
    depth = _depth(shapes, _VISION + "encoder.layers.")
    if depth is not None:
        changes["num_layers"] = depth
    if changes.get("hidden_size", base.hidden_size) != base.hidden_size:
        unresolved.append("vision.num_heads")
    return dataclasses.replace(base, **changes)


def config_from_shapes(base: ModelConfig, shapes: dict[str, tuple[int, ...]], layout: str
                       ) -> tuple[ModelConfig, list[str], list[str]]:
    """``base`` with every dimension the checkpoint's tensor shapes determine replaced by them.

    Args:
        base: the config derived from ``config.json`` (or a preset).
        shapes: checkpoint key -> shape (keys with the layout prefix, as in the file).
        layout: ``"openpi"`` or ``"lerobot"``.

    Returns:
        (the config — not validated, the caller validates after its own overrides; the changed
        fields as ``"vlm.width: 2048 -> 64"`` lines; the fields shapes cannot determine although
        the base value may be wrong, e.g. ``"vision.num_heads"``).
    """
    s = _strip(shapes, layout)
    unresolved: list[str] = []
    head = s.get(LM_HEAD_KEY) or s.get(EMBED_KEY)
    vocab, vlm_width = (head[0], head[1]) if head is not None and len(head) == 2 else (None, None)
    a_in = s.get("action_in_proj.weight")
    ex_width, action_dim = (a_in[0], a_in[1]) if a_in is not None and len(a_in) == 2 else (None, None)
    cfg = dataclasses.replace(
        base,
        vocab_size=vocab if vocab is not None else base.vocab_size,
        action_dim=action_dim if action_dim is not None else base.action_dim,
        vlm=_gemma(s, _VLM, base.vlm, vlm_width, "vlm", unresolved),
        expert=_gemma(s, _EXPERT, base.expert, ex_width, "expert", unresolved),
        vision=_vision(s, base.vision, unresolved))
    return cfg, diff_configs(base, cfg), unresolved


def diff_configs(a: ModelConfig, b: ModelConfig) -> list[str]:
    """Fields that differ between two configs, as ``"<path>: <a> -> <b>"`` lines."""
    out: list[str] = []

    def walk(x: Any, y: Any, path: str) -> None:
        if dataclasses.is_dataclass(x):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name), getattr(y, f.name), f"{path}.{f.name}" if path else f.name)
        elif x != y:
            out.append(f"{path}: {x} -> {y}")

    walk(a, b, "")
    return [line for line in out if not line.startswith("name:")]


__all__ = ["config_from_shapes", "diff_configs"]
