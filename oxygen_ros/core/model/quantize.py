"""Weight-only quantization of the π0.5 transformer layers (torchao ``quantize_``), a load option.

A weight format names how the weights of the Gemma projections are stored; activations, the
K/V cache and every accumulation stay in the model's float dtype (fp32 on a CPU, bf16 on CUDA):

========  ================================================  ==========================================
format    stored weights of the quantized layers            runs on
========  ================================================  ==========================================
``fp32``  float32 (no quantization; the model dtype)        CPU, CUDA
``bf16``  bfloat16 (no quantization; the model dtype)       CPU, CUDA
``int8``  int8, symmetric, one scale per output row         CPU, CUDA (``Int8WeightOnlyConfig``)
``fp8``   float8 e4m3, one scale per output row             CUDA only (``Float8WeightOnlyConfig``)
``int4``  int4, asymmetric, groups of 128 along the input   CUDA only (``Int4WeightOnlyConfig``,
                                                            tinygemm ``tile_packed_to_4d``; bf16)
========  ================================================  ==========================================

**Which layers.** The ``nn.Linear`` projections of every Mixture-of-Transformers layer of the VLM
(Gemma 2B) and of the action expert (Gemma 300M): ``self_attn.{q,k,v,o}_proj`` and
``mlp.{gate,up,down}_proj`` — :func:`quantizable_linears`: the matmul weights of the Gemma layers
(weights ``[out, in]``), the bulk of what every prefill, denoise and decode step reads. Kept in the
float dtype: the token embedding, which is also the tied LM head; the RMS / adaRMS norms (their
``dense`` is a ``Linear`` but a norm parameter, kept fp32 under bf16 as openpi's
``to_bfloat16_for_selected_params`` keeps the norms); the action in/out projections and the time
MLP (small, and on the path of every denoise step's output); and the whole SigLIP vision tower with
its projector. The vision tower runs once per frame over 256 tokens per camera, a compute-bound
stage where a weight-only format saves little time; it stays in the model dtype (a separate flag
for it is left for when a GPU measurement says it pays).

**Where it runs.** torchao 0.18 has no packed int4 kernel for the CPU (its tinygemm layout needs
CUDA compute capability ≥ 8, the ``plain`` layout needs CUDA kernels), and its float8 weight-only
tensor runs on a CPU only by dequantizing the whole weight at every call; both raise
:class:`WeightFormatError` on a CPU instead of running a path no robot would use. ``int8`` runs on
a CPU through ``torch.ops.aten._weight_int8pack_mm``.

torchao is imported only when a quantized format is asked for. Follows the torchao documentation
of ``torchao.quantization.quantize_`` and its weight-only configs (torchao 0.18).
"""

from __future__ import annotations

import re
from typing import Any, cast

import torch
from torch import nn

from ..config import WEIGHT_FORMATS, ConfigError
from .pi05 import Pi05Model

#: The formats that quantize (torchao).
QUANTIZED_FORMATS: tuple[str, ...] = ("fp8", "int8", "int4")
#: The formats that run on CUDA only.
CUDA_ONLY_FORMATS: tuple[str, ...] = ("fp8", "int4")
#: The float formats and the dtype each one is.
FLOAT_FORMATS: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: int4 group size along the input dimension (torchao's default; every π0.5 width divides by it).
INT4_GROUP_SIZE = 128
#: The quantized projections: ``<stack>.layers.<i>.self_attn.{q,k,v,o}_proj`` and ``….mlp.{gate,up,down}_proj``.
QUANTIZED_LAYER = re.compile(r"^(vlm|expert)\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)$")


class WeightFormatError(ConfigError):
    """A weight format that is unknown, or that cannot run on this device / dtype / model."""


def quantizable_linears(model: nn.Module) -> list[str]:
    """Qualified names of the ``nn.Linear`` layers a quantized format converts (see the module
    docstring), in module order."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and QUANTIZED_LAYER.match(n)]


def check_weight_format(weights: str, device: torch.device | str) -> None:
    """Raise :class:`WeightFormatError` when ``weights`` is not a known format or cannot run on
    ``device`` (``fp8`` and ``int4`` need CUDA). ``""`` (the model dtype, unquantized) is accepted."""
    if weights == "":
        return
    if weights not in WEIGHT_FORMATS:
        raise WeightFormatError(f"weights={weights!r} is not a weight format; allowed: {', '.join(WEIGHT_FORMATS)}")
    dev = torch.device(device)
    if weights in CUDA_ONLY_FORMATS and dev.type != "cuda":
        why = (
            "torchao 0.18 has no packed int4 kernel for the CPU (tinygemm and the plain layout are CUDA kernels)"
            if weights == "int4"
            else "torchao's float8 weight-only tensor has no CPU kernel (it would dequantize every weight per call)"
        )
        raise WeightFormatError(
            f"weights={weights!r} needs a CUDA device, this model is on {dev}: {why}; on a CPU use int8, fp32 or bf16"
        )


def resolve_dtype(weights: str, dtype: torch.dtype | None, device: torch.device | str) -> torch.dtype | None:
    """The model dtype to load with for ``weights`` and the ``dtype`` asked for (None: the device's
    default, fp32 on a CPU, bf16 on CUDA).

    ``fp32`` / ``bf16`` ARE a dtype: they pick it when ``dtype`` is None and must agree with it
    otherwise. ``int4`` computes in bf16 (tinygemm) and picks bf16 when ``dtype`` is None.

    Raises:
        WeightFormatError: unknown format, a format the device cannot run, a float format that
            contradicts ``dtype``, or ``int4`` with a dtype other than bf16.
    """
    check_weight_format(weights, device)
    if weights in FLOAT_FORMATS:
        want = FLOAT_FORMATS[weights]
        if dtype is not None and dtype != want:
            raise WeightFormatError(
                f"weights={weights!r} stores {want} weights but dtype is {dtype}: leave dtype unset or make them agree"
            )
        return want
    if weights == "int4":
        if dtype is not None and dtype != torch.bfloat16:
            raise WeightFormatError(f"weights='int4' computes in torch.bfloat16 (tinygemm), dtype is {dtype}")
        return torch.bfloat16
    return dtype


def _config(weights: str) -> Any:
    """The torchao config object of a quantized format (torchao imported here, lazily)."""
    try:
        from torchao.quantization import Float8WeightOnlyConfig, Int4WeightOnlyConfig, Int8WeightOnlyConfig
    except ImportError as e:  # pragma: no cover - torchao is in requirements.txt
        raise WeightFormatError(
            f"weights={weights!r} needs torchao (pip install torchao==0.18.0, see requirements.txt): {e}"
        ) from e
    if weights == "int8":
        return Int8WeightOnlyConfig(set_inductor_config=False)
    if weights == "fp8":
        return Float8WeightOnlyConfig(set_inductor_config=False)
    return Int4WeightOnlyConfig(
        group_size=INT4_GROUP_SIZE, int4_packing_format="tile_packed_to_4d", set_inductor_config=False
    )


@torch.no_grad()
def quantize_weights(model: Pi05Model, weights: str) -> list[str]:
    """Convert, in place, the Gemma projections of ``model`` to the weight-only format ``weights``.

    The layers are those of :func:`quantizable_linears` (VLM and action expert ``q/k/v/o_proj``,
    ``gate/up/down_proj``; weights ``[out, in]``); every other parameter keeps its dtype. Each
    converted weight becomes a torchao tensor subclass (``Int8Tensor``, ``Float8Tensor``,
    ``Int4TilePackedTo4dTensor``) that still reports the model's float dtype and ``[out, in]``
    shape, so ``model.dtype`` and the K/V cache are unchanged. ``fp32``/``bf16`` (and ``""``)
    change nothing: the dtype is chosen when the model is built (:func:`resolve_dtype`).

    Args:
        model: a π0.5 model, on its final device and dtype, in eval mode.
        weights: one of :data:`WEIGHT_FORMATS` (or ``""``).

    Returns:
        The qualified names of the converted layers (empty for a float format).

    Raises:
        WeightFormatError: unknown format; ``fp8``/``int4`` on a device other than CUDA; ``int4``
            on a model whose dtype is not bf16 or whose projection input widths do not divide by
            :data:`INT4_GROUP_SIZE` (torchao would leave those layers unquantized silently).
    """
    check_weight_format(weights, model.device)
    if weights not in QUANTIZED_FORMATS:
        return []
    names = quantizable_linears(model)
    if weights == "int4":
        if model.dtype != torch.bfloat16:
            raise WeightFormatError(f"weights='int4' needs a torch.bfloat16 model (tinygemm), not {model.dtype}")
        bad = [n for n in names if cast(nn.Linear, model.get_submodule(n)).in_features % INT4_GROUP_SIZE]
        if bad:
            raise WeightFormatError(
                f"weights='int4' groups {INT4_GROUP_SIZE} input features; these layers' widths do not divide: "
                + ", ".join(bad[:5])
                + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")
            )
    from torchao.quantization import quantize_

    wanted = set(names)
    quantize_(model, _config(weights), filter_fn=lambda m, fqn: fqn in wanted)
    return names


def is_quantized(linear: nn.Module) -> bool:
    """Whether ``linear``'s weight is a quantized tensor subclass (not a plain float tensor)."""
    w = getattr(linear, "weight", None)
    return isinstance(w, torch.Tensor) and type(w) not in (torch.Tensor, nn.Parameter)


__all__ = [
    "CUDA_ONLY_FORMATS",
    "FLOAT_FORMATS",
    "INT4_GROUP_SIZE",
    "QUANTIZED_FORMATS",
    "WEIGHT_FORMATS",
    "WeightFormatError",
    "check_weight_format",
    "is_quantized",
    "quantizable_linears",
    "quantize_weights",
    "resolve_dtype",
]
