"""Single-request π0.5 policy: the reference every engine mode is checked against.

``Pi05Policy.sample_actions`` = openpi's ``Policy.infer`` for one observation (preprocess → prefill
→ S denoise steps → unnormalise → robot dimension). ``generate_text`` decodes language from the
same prefix: optional continuation prompt tokens appended causally after the prefix, then one token
at a time with the tied LM head, from the last valid prefix token's hidden state. Both use a contiguous
:class:`DenseKVCache`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from .config import ModelConfig, get_preset
from .model.flow import euler_times
from .model.kv import DenseKVCache
from .model.pi05 import Pi05Model
from .model.sampling import SamplingParams, sample_rows
from .processing import Normalizer, prepare_images
from .prompt import PromptTokenizer
from .rtc.config import RTCConfig
from .rtc.guidance import RTCGuide, integrate_guided, make_guide
from .types import NormStats, Observation


@dataclass
class EncodedObservation:
    """Model inputs of one observation (batch of 1), on the CPU.

    pixels ``[1, S, 3, H, W]`` float32 in [-1, 1]; image_masks ``[1, S]`` bool; tokens ``[1, T]``
    int64; token_masks ``[1, T]`` bool.
    """

    pixels: torch.Tensor
    image_masks: torch.Tensor
    tokens: torch.Tensor
    token_masks: torch.Tensor
    tokens_per_image: int

    @property
    def prefix_len(self) -> int:
        """Valid prefix tokens (image tokens of unmasked slots + prompt tokens)."""
        return int(self.image_masks.sum()) * self.tokens_per_image + int(self.token_masks.sum())


@dataclass
class Generation:
    """Result of :meth:`Pi05Policy.generate_text`."""

    text: str
    token_ids: list[int]
    finish_reason: str


def frame_noise(seed: int, frame_id: int, horizon: int, action_dim: int) -> torch.Tensor:
    """Deterministic flow noise ``[1, H, action_dim]`` for (seed, frame) — the same in every mode."""
    g = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(frame_id)) & 0x7FFF_FFFF_FFFF_FFFF)
    return torch.randn(1, horizon, action_dim, generator=g)


class Pi05Policy:
    """Model + tokenizer + normalisation stats: observation in, actions / text out."""

    def __init__(
        self,
        model: Pi05Model,
        tokenizer: PreTrainedTokenizerBase,
        norm_stats: dict[str, NormStats],
        *,
        prompt_overflow: str = "error",
    ) -> None:
        self.model = model.eval()
        self.cfg: ModelConfig = model.cfg
        self.tokenizer = tokenizer
        self.norm_stats = norm_stats
        self.normalizer = Normalizer(norm_stats["state"], norm_stats["actions"])
        self.prompt = PromptTokenizer(
            tokenizer,
            self.cfg.max_token_len,
            self.cfg.num_state_bins,
            overflow=prompt_overflow,
            discrete_state=self.cfg.discrete_state_input,
        )
        self.eos_id = int(tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else -1

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(
        cls,
        path_or_preset: str | os.PathLike[str],
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        *,
        seed: int = 0,
        robot_dim: int = 14,
        prompt_overflow: str = "error",
        config_overrides: dict[str, Any] | None = None,
        weights: str = "",
    ) -> Pi05Policy:
        """Load a checkpoint folder (openpi or LeRobot layout) or build a random-weight preset.

        Args:
            path_or_preset: checkpoint folder, or a preset name (``pi05``, ``pi05-small``,
                ``pi05-tiny``) for random weights with the project's generated tokenizer and
                identity normalisation of ``robot_dim`` state/action dims.
            device: default CUDA if available else CPU.
            dtype: default bf16 on CUDA, fp32 on CPU.
            config_overrides: top-level :class:`ModelConfig` fields to change in a preset before
                its weights are built (e.g. ``{"action_horizon": 10}``); presets only.
            weights: weight format of the Gemma projections (:mod:`.model.quantize`): ``""`` (the
                dtype's floats, unquantized), ``fp32``, ``bf16`` (unquantized, that dtype),
                ``int8``, ``fp8``, ``int4`` (torchao weight-only; fp8 and int4 on CUDA only).

        Raises:
            CheckpointError: strict-loading failures (names the key); ConfigError: unknown preset or
                a bad override; WeightFormatError (a ConfigError): an unknown ``weights`` or one
                this device / dtype cannot run; ValueError: ``config_overrides`` with a checkpoint folder.
        """
        from .model.ckpt_files import checkpoint_folder, require_norm_stats
        from .model.quantize import quantize_weights, resolve_dtype
        from .model.weights import load_pretrained, random_pretrained, rebuild_buffers, target_dtype
        from .tokenizer import build_tokenizer

        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = resolve_dtype(weights, dtype, device)  # before any weight is read: a bad format fails fast
        if checkpoint_folder(path_or_preset) is not None:
            if config_overrides:
                raise ValueError("config_overrides applies to presets only, not to checkpoint folders")
            model, _cfg, stats, _meta = load_pretrained(path_or_preset, device=device, dtype=dtype)
            require_norm_stats(stats, _meta.folder, _meta.layout, _meta.norm_info, _meta.asset_id)
            from .tokenizer import load_tokenizer

            tok = load_tokenizer(path_or_preset, vocab_size=model.cfg.vocab_size)
        else:
            cfg = get_preset(str(path_or_preset))
            if config_overrides:
                cfg = cfg.replace(**config_overrides)
            model = random_pretrained(cfg, seed=seed)
            for name, p in model.named_parameters():
                p.data = p.data.to(device=device, dtype=target_dtype(name, device, dtype))
            rebuild_buffers(model, device)
            tok = build_tokenizer(cfg.vocab_size)
            stats = {"state": NormStats.identity(robot_dim), "actions": NormStats.identity(robot_dim)}
        quantize_weights(model, weights)
        return cls(model, tok, stats, prompt_overflow=prompt_overflow)

    # ------------------------------------------------------------------ inputs
    def encode_observation(self, obs: Observation) -> EncodedObservation:
        """Preprocess images, normalise and bin the state, tokenise the π0.5 prompt.

        Raises:
            InvalidInputError: bad image/state (non-finite, wrong size, unknown slot), or a prompt
                over ``max_token_len`` (``PromptTooLongError``).
        """
        pixels, masks = prepare_images(obs.images, self.cfg.image_slots, self.cfg.vision.image_size)
        state = self.normalizer.normalize_state(np.asarray(obs.state))
        ids, tmask = self.prompt.tokenize_prompt(obs.instruction, state)
        return EncodedObservation(
            pixels=torch.from_numpy(pixels)[None],
            image_masks=torch.from_numpy(masks)[None],
            tokens=torch.from_numpy(ids)[None],
            token_masks=torch.from_numpy(tmask)[None],
            tokens_per_image=self.cfg.vision.num_tokens,
        )

    def new_cache(self, batch: int, capacity: int) -> DenseKVCache:
        """An empty contiguous cache for ``batch`` rows of ``capacity`` tokens."""
        c = self.cfg.vlm
        return DenseKVCache(c.depth, batch, capacity, c.num_kv_heads, c.head_dim, self.model.dtype, self.model.device)

    @torch.inference_mode()
    def prefill(self, enc: EncodedObservation, extra_capacity: int = 0) -> tuple[DenseKVCache, torch.Tensor]:
        """Prefill one observation → (cache holding its prefix, last valid hidden ``[1, W]``)."""
        m = self.model
        emb, valid = m.embed_prefix(enc.pixels, enc.image_masks, enc.tokens, enc.token_masks)
        cache = self.new_cache(1, emb.shape[1] + max(extra_capacity, 0))
        hidden = m.prefill(emb, valid, cache.prefill_view(valid))
        return cache, hidden

    # ------------------------------------------------------------------ actions
    @torch.inference_mode()
    def sample_actions_normalized(
        self, cache: DenseKVCache, noise: torch.Tensor, num_steps: int | None = None, guide: RTCGuide | None = None
    ) -> torch.Tensor:
        """Flow sampling over a prefilled cache → ``[1, H, action_dim]`` float32 normalised actions;
        with ``guide``, real-time chunking (:mod:`.rtc.guidance`, LeRobot ``euler_integrate`` with
        its ``RTCProcessor``)."""
        view = cache.denoise_view(self.cfg.action_horizon)
        steps = num_steps or self.cfg.num_denoise_steps
        noise = noise.to(self.model.device)
        if guide is None:
            return self.model.sample_actions(view, noise, steps)
        guide = guide.to(self.model.device)
        times, dt = euler_times(steps, self.model.device)
        view = view.for_grad() if guide.vjp else view
        return integrate_guided(
            lambda x, i: self.model.denoise_step(view, x, times[i].expand(x.shape[0])), noise, dt, guide
        )

    def sample_actions(
        self,
        observation: Observation,
        noise: torch.Tensor | None = None,
        num_steps: int | None = None,
        *,
        prev_chunk_left_over: np.ndarray | None = None,
        inference_delay: int | None = None,
        rtc: RTCConfig | None = None,
        normalized: bool = False,
    ) -> np.ndarray:
        """Action chunk for one observation (LeRobot ``predict_action_chunk``).

        Args:
            noise: ``[1, H, action_dim]`` (default: standard normal from the global RNG).
            prev_chunk_left_over: with ``rtc.enabled``, the previous chunk's rows not yet executed at
                this observation, ``[T_left <= H, A]`` in normalised model space (what this method
                returns with ``normalized=True``; row ``j`` is the target of new row ``j``).
            inference_delay: rows of it executed while this chunk is computed (default:
                ``rtc.inference_delay``).
            rtc: real-time chunking settings; None or disabled → the plain chunk.
            normalized: return normalised model-space actions ``[H, robot_action_dim]`` instead.

        Returns:
            ``[H, robot_action_dim]`` float32 actions in robot units, all finite.

        Raises:
            InvalidInputError: bad observation; NonFiniteActionError: the model produced NaN/inf;
            ValueError: a leftover of a wrong shape or not finite.
        """
        enc = self.encode_observation(observation)
        cache, _ = self.prefill(enc)
        if noise is None:
            noise = torch.randn(1, self.cfg.action_horizon, self.cfg.action_dim)
        steps = num_steps or self.cfg.num_denoise_steps
        guide = None
        if rtc is not None and rtc.validate().enabled and prev_chunk_left_over is not None:
            delay = rtc.inference_delay if inference_delay is None else int(inference_delay)
            guide = make_guide(
                prev_chunk_left_over,
                delay,
                schedule=rtc.schedule,
                horizon=rtc.execution_horizon,
                max_weight=rtc.max_guidance_weight,
                times=euler_times(steps)[0],
                length=self.cfg.action_horizon,
                action_dim=self.cfg.action_dim,
                vjp=rtc.guidance == "vjp",
            )
        x = self.sample_actions_normalized(cache, noise, steps, guide)[0].float().cpu().numpy()
        out = self.normalizer.unnormalize_actions(x)  # the finiteness check
        return x[:, : self.normalizer.action_dim].astype(np.float32) if normalized else out

    # ------------------------------------------------------------------ text
    @torch.inference_mode()
    def generate_text(
        self,
        observation: Observation,
        prompt: str = "",
        max_new_tokens: int = 32,
        greedy: bool = True,
        *,
        sampling: SamplingParams | None = None,
        stop_ids: tuple[int, ...] = (),
        own_prefix: bool = False,
    ) -> Generation:
        """Decode text from the observation's prefix, one token per forward (the reference).

        The continuation ``prompt`` (e.g. a filled language-task template) is appended causally
        after the prefix; with an empty prompt the first token comes from the last valid prefix
        token's hidden state. With ``own_prefix`` the prompt replaces the action prompt INSIDE the
        bidirectional prefix (images + BOS + prompt, no state: π0.5 subtask prediction) and
        decoding starts at its last token. Stops at EOS, a stop id, or ``max_new_tokens``.

        Returns:
            :class:`Generation` with the text (special tokens skipped), ids (stop token excluded)
            and ``finish_reason`` in {"eos", "stop", "length", "error"}.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        if greedy and sampling is not None and sampling.temperature > 0:
            raise ValueError("generate_text: greedy=True contradicts sampling.temperature > 0; pass greedy=False")
        params = (sampling or SamplingParams()).validate() if not greedy else SamplingParams()
        key = params.key()
        enc = self.encode_observation(observation)
        if own_prefix:
            ids = torch.tensor([self.prompt.tokenize_prefix_prompt(prompt)], dtype=torch.long)
            enc = EncodedObservation(
                enc.pixels, enc.image_masks, ids, torch.ones_like(ids, dtype=torch.bool), enc.tokens_per_image
            )
        cont = self.prompt.tokenize_continuation(prompt) if prompt and not own_prefix else []
        cache, hidden = self.prefill(enc, extra_capacity=len(cont) + max_new_tokens)
        m = self.model
        if cont:
            ids = torch.tensor([cont], dtype=torch.long)
            valid = torch.ones_like(ids, dtype=torch.bool)
            logits = m.decode_step(cache.extend_view(valid.to(m.device)), ids, valid)
        else:
            logits = m.logits(hidden)
        out: list[int] = []
        reason = "length"
        stops = set(stop_ids) | {self.eos_id}
        while True:
            tok, ok = sample_rows(logits, [params], [key], [len(out)])
            if not ok[0]:
                reason = "error"
                break
            if tok[0] in stops:
                reason = "eos" if tok[0] == self.eos_id else "stop"
                break
            out.append(tok[0])
            if len(out) >= max_new_tokens:
                break
            ids = torch.tensor([[tok[0]]], dtype=torch.long)
            valid = torch.ones_like(ids, dtype=torch.bool)
            logits = m.decode_step(cache.extend_view(valid.to(m.device)), ids, valid)
        # a flat id list decodes to one string (transformers types decode as ``str | list[str]``)
        text = cast(str, self.tokenizer.decode(out, skip_special_tokens=True))
        return Generation(text=text, token_ids=out, finish_reason=reason)
