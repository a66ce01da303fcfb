"""SigLIP vision tower (transformers ``SiglipVisionModel``) and the linear projector.

π0.5 uses SigLIP So400m/14 without the pooling head at 224 px: 256 tokens per image, projected
1152 → VLM width. The image features are NOT rescaled (only text embeddings get ``sqrt(width)``),
as in openpi's ``embed_prefix`` and big_vision PaliGemma.
"""

from __future__ import annotations

from typing import cast

from torch import Tensor, nn
from transformers import SiglipVisionConfig, SiglipVisionModel
from transformers.models.siglip.modeling_siglip import SiglipVisionTransformer

from ..config import VisionConfig


def build_vision_tower(cfg: VisionConfig) -> SiglipVisionModel:
    """A randomly initialised transformers ``SiglipVisionModel`` for ``cfg`` (no pooling head)."""
    hf = SiglipVisionConfig(  # type: ignore[call-arg]  # transformers: the @strict config's fields are not seen as __init__ arguments
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
        layer_norm_eps=cfg.layer_norm_eps,
        hidden_act="gelu_pytorch_tanh",
        vision_use_head=False,
    )
    hf._attn_implementation = "sdpa"
    return SiglipVisionModel(hf)


class VisionEncoder(nn.Module):
    """SigLIP tower + ``Linear(vision width, vlm width)`` projector.

    Under a 16-bit dtype policy the patch and position embeddings stay float32 (openpi
    ``to_bfloat16_for_selected_params``; see :data:`.keymap.SIGLIP_FP32_PATTERNS`): the embeddings are
    computed in float32 and cast to the encoder's dtype before its first LayerNorm.
    """

    def __init__(self, cfg: VisionConfig, out_width: int) -> None:
        super().__init__()
        self.tower = build_vision_tower(cfg)
        self.projector = nn.Linear(cfg.hidden_size, out_width, bias=True)

    def forward(self, pixels: Tensor) -> Tensor:
        """pixels ``[N, 3, S, S]`` in [-1, 1] → image tokens ``[N, (S/patch)^2, out_width]``."""
        # transformers >= 5.2x dropped the level: the tower then has the transformer's parts itself
        vt = cast(SiglipVisionTransformer, getattr(self.tower, "vision_model", self.tower))
        emb = vt.embeddings(pixels.to(vt.embeddings.patch_embedding.weight.dtype))
        enc_dtype = vt.post_layernorm.weight.dtype
        feats = vt.post_layernorm(vt.encoder(inputs_embeds=emb.to(enc_dtype)).last_hidden_state)
        tokens: Tensor = self.projector(feats.to(self.projector.weight.dtype))
        return tokens
