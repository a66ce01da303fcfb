"""Parameter-name mapping between :class:`~.pi05.Pi05Model` and π0.5 checkpoint files.

Two checkpoint layouts share one key scheme:

* ``openpi`` — openpi PyTorch folders (``PI0Pytorch`` state dict, written by openpi
  ``examples/convert_jax_model_to_pytorch.py``): keys ``paligemma_with_expert.paligemma.model.…``,
  ``paligemma_with_expert.gemma_expert.model.…``, ``action_in_proj.…`` …;
* ``lerobot`` — LeRobot ``pi05`` policy folders (``PI05Policy.model`` is that same module): the
  same keys with a leading ``model.``.

Own keys ↔ checkpoint keys (``P = paligemma_with_expert``):

=================================  ===================================================
``vision.tower.[vision_model.]X``  ``P.paligemma.model.vision_tower.vision_model.X``
``vision.projector.W``             ``P.paligemma.model.multi_modal_projector.linear.W``
``vlm.X``                          ``P.paligemma.model.language_model.X``
``expert.X``                       ``P.gemma_expert.model.X``
``action_in_proj.W`` …             same name
=================================  ===================================================

``P.paligemma.lm_head.weight`` is tied to the VLM token embedding (either member may be absent
from a file) and ``P.gemma_expert.lm_head.weight`` is the unused expert LM head (skipped).
transformers 5.x ``SiglipVisionModel`` may or may not have the ``vision_model.`` level (it was
dropped around 5.2x); checkpoints always have it, and a checkpoint key without it is accepted too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from ..untrusted import CheckpointError

Layout = Literal["openpi", "lerobot"]
LAYOUTS: tuple[str, ...] = ("openpi", "lerobot")

_P = "paligemma_with_expert."
VISION_CKPT = _P + "paligemma.model.vision_tower."
VISION_LEVEL = "vision_model."
#: The tied LM head of the VLM (same tensor as the token embedding).
LM_HEAD_KEY = _P + "paligemma.lm_head.weight"
#: The VLM token embedding (checkpoint name).
EMBED_KEY = _P + "paligemma.model.language_model.embed_tokens.weight"
#: The action expert's unused LM head: may be present in a file, always skipped.
EXPERT_LM_HEAD_KEY = _P + "gemma_expert.lm_head.weight"
#: Own name of the token embedding.
OWN_EMBED_KEY = "vlm.embed_tokens.weight"

# (own prefix, checkpoint prefix) — the vision tower is handled separately.
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("vision.projector.", _P + "paligemma.model.multi_modal_projector.linear."),
    ("vlm.", _P + "paligemma.model.language_model."),
    ("expert.", _P + "gemma_expert.model."),
    ("action_in_proj.", "action_in_proj."),
    ("action_out_proj.", "action_out_proj."),
    ("time_mlp_in.", "time_mlp_in."),
    ("time_mlp_out.", "time_mlp_out."),
)


def layout_prefix(layout: str) -> str:
    """Key prefix of a layout: ``""`` (openpi) or ``"model."`` (LeRobot).

    Raises:
        ValueError: unknown layout name.
    """
    if layout == "openpi":
        return ""
    if layout == "lerobot":
        return "model."
    raise ValueError(f"unknown checkpoint layout {layout!r}; expected one of {LAYOUTS}")


def own_to_ckpt(own_key: str, layout: str = "openpi") -> str:
    """Checkpoint key of one own state-dict key (``vision_model.`` level always written).

    Raises:
        KeyError: ``own_key`` is not a parameter name of :class:`~.pi05.Pi05Model`.
    """
    pre = layout_prefix(layout)
    if own_key.startswith("vision.tower."):
        rest = own_key[len("vision.tower.") :]
        if not rest.startswith(VISION_LEVEL):
            rest = VISION_LEVEL + rest
        return pre + VISION_CKPT + rest
    for own_pre, ck_pre in _PREFIXES:
        if own_key.startswith(own_pre):
            return pre + ck_pre + own_key[len(own_pre) :]
    raise KeyError(f"no checkpoint name for own parameter {own_key!r}")


def ckpt_to_own(ckpt_key: str, layout: str, own_vision_level: bool) -> str | None:
    """Own key of a checkpoint key, or ``None`` when the key has no own counterpart.

    Args:
        ckpt_key: key as stored in the file (with the layout prefix).
        layout: ``"openpi"`` or ``"lerobot"``.
        own_vision_level: whether this transformers' ``SiglipVisionModel`` state dict has the
            ``vision_model.`` level (see :func:`has_vision_level`).

    Returns ``None`` for the tied LM head, the expert LM head and unknown keys (the caller decides
    which of those are errors).
    """
    pre = layout_prefix(layout)
    if not ckpt_key.startswith(pre):
        return None
    key = ckpt_key[len(pre) :]
    if key.startswith(VISION_CKPT):
        rest = key[len(VISION_CKPT) :]
        if rest.startswith(VISION_LEVEL):
            rest = rest[len(VISION_LEVEL) :]
        return "vision.tower." + (VISION_LEVEL if own_vision_level else "") + rest
    for own_pre, ck_pre in _PREFIXES:
        if key.startswith(ck_pre):
            return own_pre + key[len(ck_pre) :]
    return None


def has_vision_level(own_keys: Iterable[str]) -> bool:
    """True when the own vision-tower keys carry the ``vision_model.`` level."""
    return any(k.startswith("vision.tower." + VISION_LEVEL) for k in own_keys)


def is_tied_head(ckpt_key: str, layout: str) -> bool:
    """True for the VLM LM head (tied to the token embedding)."""
    return ckpt_key == layout_prefix(layout) + LM_HEAD_KEY


def is_skipped(ckpt_key: str, layout: str) -> bool:
    """True for keys that are present in some files and deliberately ignored (expert LM head)."""
    return ckpt_key == layout_prefix(layout) + EXPERT_LM_HEAD_KEY


def detect_layout(ckpt_keys: list[str] | set[str]) -> str:
    """Layout from the key prefixes of a weight file.

    Raises:
        CheckpointError: the keys are neither openpi (``paligemma_with_expert.…``) nor LeRobot
            (``model.paligemma_with_expert.…``), or mix both.
    """
    lerobot = any(k.startswith("model." + _P) for k in ckpt_keys)
    openpi = any(k.startswith(_P) for k in ckpt_keys)
    if lerobot and not openpi:
        return "lerobot"
    if openpi and not lerobot:
        return "openpi"
    sample = sorted(ckpt_keys)[:5]
    why = "mixes both prefixes" if lerobot else "has neither prefix"
    raise CheckpointError(
        f"weights are neither openpi ('{_P}…') nor LeRobot ('model.{_P}…') layout: the file {why}; first keys: {sample}"
    )


#: Substrings of own parameter names kept in float32 when the rest is reduced precision: the
#: Gemma norms incl. adaRMS ``dense`` (openpi ``to_bfloat16_for_selected_params``).
FP32_PARAM_PATTERNS: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm", "vlm.norm.", "expert.norm.")
#: openpi also keeps the SigLIP patch/position embeddings fp32 (``VisionEncoder`` computes the
#: embeddings in fp32 and casts them to the encoder's dtype).
SIGLIP_FP32_PATTERNS: tuple[str, ...] = ("embeddings.patch_embedding.", "embeddings.position_embedding.")


def keep_fp32(own_key: str) -> bool:
    """Whether the parameter stays float32 under a bf16/fp16 dtype policy (Gemma norms, adaRMS
    ``dense`` layers, SigLIP patch and position embeddings)."""
    return any(p in own_key for p in FP32_PARAM_PATTERNS + SIGLIP_FP32_PATTERNS)


__all__ = [
    "Layout",
    "LAYOUTS",
    "CheckpointError",
    "LM_HEAD_KEY",
    "EMBED_KEY",
    "EXPERT_LM_HEAD_KEY",
    "OWN_EMBED_KEY",
    "layout_prefix",
    "own_to_ckpt",
    "ckpt_to_own",
    "has_vision_level",
    "is_tied_head",
    "is_skipped",
    "detect_layout",
    "FP32_PARAM_PATTERNS",
    "SIGLIP_FP32_PATTERNS",
    "keep_fp32",
]
