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

The shapes (and dtypes) come from the safetensors headers alone (:func:`weight_index`,
:func:`read_headers`): no tensor is read before the whole checkpoint is known to match. A sharded
checkpoint's index may name only files inside its folder; weights must be floating point
(:func:`check_dtypes`) and finite (:func:`read_finite`, as each tensor is read).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import GemmaConfig, ModelConfig, VisionConfig
from ..untrusted import CheckpointError, inside, json_field, open_safetensors, read_json
from .ckpt_files import FLOAT_DTYPES, INDEX, WEIGHTS
from .keymap import EMBED_KEY, LM_HEAD_KEY, VISION_CKPT, VISION_LEVEL, layout_prefix

_VLM = "paligemma_with_expert.paligemma.model.language_model."
_EXPERT = "paligemma_with_expert.gemma_expert.model."
_VISION = VISION_CKPT + VISION_LEVEL


def weight_index(folder: Path) -> dict[str, Path]:
    """Checkpoint key -> safetensors file, for ``model.safetensors`` or a sharded index.

    Raises:
        CheckpointError: no weights; a weight file that is not safetensors (named); an index that is
            malformed (``weight_map`` not an object of file names), names a file outside the folder
            (absolute, ``..``, a symlink out: the entry is named) or a missing shard.
    """
    if (folder / WEIGHTS).is_file():
        with open_safetensors(folder / WEIGHTS) as f:
            return {k: folder / WEIGHTS for k in f.keys()}
    if (folder / INDEX).is_file():
        where = str(folder / INDEX)
        wmap = json_field(read_json(folder / INDEX), "weight_map", "object", where)
        if not wmap:
            raise CheckpointError(f"{where}: no 'weight_map' (tensor name -> shard file)")
        out = {k: inside(folder, v, f"{where}: weight_map[{k!r}]") for k, v in wmap.items()}
        absent = sorted({str(p.name) for p in out.values() if not p.is_file()})
        if absent:
            raise CheckpointError(f"{where} names missing shard files {absent}")
        return out
    raise CheckpointError(f"{folder}: no {WEIGHTS} or {INDEX}")


def read_headers(index: dict[str, Path]) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Shape and safetensors dtype (``"F32"``, ``"BF16"``, ``"I8"`` …) of every indexed tensor, from
    the file headers only.

    Raises:
        CheckpointError: a file is not safetensors (named).
    """
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    for path in sorted(set(index.values())):
        with open_safetensors(path) as f:
            for k in f.keys():
                if index.get(k) == path:
                    sl = f.get_slice(k)
                    shapes[k], dtypes[k] = tuple(sl.get_shape()), sl.get_dtype()
    return shapes, dtypes


def check_dtypes(keys: list[str], dtypes: dict[str, str], index: dict[str, Path]) -> None:
    """Refuse weights that are not floating point (:data:`FLOAT_DTYPES`), from the headers.

    Args:
        keys: checkpoint keys to be loaded; dtypes: their safetensors dtypes (``"F32"``, ``"I8"`` …);
            index: key -> file.

    Raises:
        CheckpointError: naming the first such key, its dtype and file (and how many more there are).
    """
    bad = [k for k in keys if dtypes[k] not in FLOAT_DTYPES]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CheckpointError(
            f"{index[bad[0]]}: tensor {bad[0]} has dtype {dtypes[bad[0]]}{more}; weights must be "
            f"floating point ({', '.join(FLOAT_DTYPES)}): integer, boolean and float8 tensors are "
            "refused, not cast (a quantized checkpoint needs scales this loader does not read)"
        )


def _finite(t: torch.Tensor) -> bool:
    """Whether every value is finite: a min/max pass (NaN propagates into both), no full-size mask.
    On the CPU numpy's, single-threaded (no thread wake-ups per tensor on a busy machine), over
    chunks of 16 M values; bfloat16 by its bits (all exponent bits set: NaN or ±inf)."""
    if t.numel() == 0:
        return True
    if t.device.type != "cpu":
        lo, hi = torch.aminmax(t)
        return bool(torch.isfinite(lo) & torch.isfinite(hi))
    for chunk in t.reshape(-1).split(1 << 24):
        if chunk.dtype == torch.bfloat16:
            if np.bitwise_and(chunk.view(torch.int16).numpy(), 0x7F80).max() == 0x7F80:
                return False
        elif not (np.isfinite((a := chunk.numpy()).min()) and np.isfinite(a.max())):
            return False
    return True


def read_finite(f: Any, path: Path, key: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Tensor ``key`` of the open safetensors file ``f`` (``path``), converted to ``dtype`` on
    ``device``, refused unless every value is finite after the conversion.

    Raises:
        CheckpointError: naming the file, the key and how many values are NaN / ±inf, or that the
            conversion to ``dtype`` overflowed (e.g. float32 values beyond float16's 65504).
    """
    raw: torch.Tensor = f.get_tensor(key)
    t = raw.to(device=device, dtype=dtype)
    if _finite(t):
        return t
    if not _finite(raw):
        n = int((~torch.isfinite(raw)).sum())
        why = f"holds {n} non-finite value(s) (NaN or ±inf)"
    else:
        n = int((~torch.isfinite(t)).sum())
        why = f"overflows to ±inf in {n} value(s) when converted to {dtype} (largest |value| {raw.abs().max():.4g})"
    raise CheckpointError(f"{path}: tensor {key} {why}; non-finite weights are refused (every output would be NaN)")


def _strip(shapes: dict[str, tuple[int, ...]], layout: str) -> dict[str, tuple[int, ...]]:
    pre = layout_prefix(layout)
    out = {k[len(pre) :]: v for k, v in shapes.items() if k.startswith(pre)}
    # keys without the vision_model. level are accepted by the loader: normalise them here
    return {
        (_VISION + k[len(VISION_CKPT) :] if k.startswith(VISION_CKPT) and not k.startswith(_VISION) else k): v
        for k, v in out.items()
    }


def _depth(shapes: dict[str, tuple[int, ...]], prefix: str) -> int | None:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    idx = {int(m.group(1)) for k in shapes if (m := pat.match(k))}
    return max(idx) + 1 if idx else None


def _gemma(
    shapes: dict[str, tuple[int, ...]],
    prefix: str,
    base: GemmaConfig,
    width: int | None,
    owner: str,
    unresolved: list[str],
) -> GemmaConfig:
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
    if (
        q is not None
        and k is not None
        and (q[0], k[0]) != (base.num_heads * base.head_dim, base.num_kv_heads * base.head_dim)
    ):
        kv = base.num_kv_heads
        if k[0] % kv or q[0] % (k[0] // kv):
            unresolved.append(
                f"{owner}.num_heads/{owner}.num_kv_heads/{owner}.head_dim (q_proj {list(q)}, k_proj {list(k)})"
            )
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


def config_from_shapes(
    base: ModelConfig, shapes: dict[str, tuple[int, ...]], layout: str
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
        vision=_vision(s, base.vision, unresolved),
    )
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


__all__ = ["weight_index", "read_headers", "check_dtypes", "read_finite", "config_from_shapes", "diff_configs"]
