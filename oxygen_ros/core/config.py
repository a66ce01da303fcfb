"""Model configuration: frozen dataclasses and the named presets.

One source of defaults for the whole package: ROS parameters and CLI flags are generated from
these dataclasses. The full-size preset follows openpi's ``pi05`` (``gemma_2b`` VLM +
``gemma_300m`` action expert, SigLIP So400m/14 at 224 px) and LeRobot's ``pi05`` policy config.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

IMAGE_SLOTS: tuple[str, ...] = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the value."""


def _check(cond: bool, owner: str, name: str, value: Any, why: str) -> None:
    if not cond:
        raise ConfigError(f"{owner}.{name}={value!r} is invalid: {why}")


@dataclass(frozen=True)
class VisionConfig:
    """SigLIP vision tower (no pooling head). ``num_tokens`` image tokens per camera slot."""

    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_layers: int = 27
    num_heads: int = 16
    image_size: int = 224
    patch_size: int = 14
    layer_norm_eps: float = 1e-6

    @property
    def num_tokens(self) -> int:
        """Image tokens per slot: (image_size / patch_size)^2 (256 at 224 px, patch 14)."""
        return (self.image_size // self.patch_size) ** 2

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid field."""
        o = "vision"
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "image_size", "patch_size"):
            v = getattr(self, name)
            _check(isinstance(v, int) and v > 0, o, name, v, "must be a positive int")
        _check(self.hidden_size % self.num_heads == 0, o, "num_heads", self.num_heads, "must divide hidden_size")
        _check(self.image_size % self.patch_size == 0, o, "patch_size", self.patch_size, "must divide image_size")
        _check(self.layer_norm_eps > 0, o, "layer_norm_eps", self.layer_norm_eps, "must be > 0")


@dataclass(frozen=True)
class GemmaConfig:
    """One Gemma stack of the Mixture-of-Transformers (VLM or action expert)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int = 8
    num_kv_heads: int = 1
    head_dim: int = 256
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    def validate(self, owner: str) -> None:
        """Raise :class:`ConfigError` naming the first invalid field."""
        for name in ("width", "depth", "mlp_dim", "num_heads", "num_kv_heads", "head_dim"):
            v = getattr(self, name)
            _check(isinstance(v, int) and v > 0, owner, name, v, "must be a positive int")
        _check(
            self.num_heads % self.num_kv_heads == 0, owner, "num_kv_heads", self.num_kv_heads, "must divide num_heads"
        )
        _check(self.head_dim % 2 == 0, owner, "head_dim", self.head_dim, "must be even (RoPE)")
        _check(self.rope_theta > 0, owner, "rope_theta", self.rope_theta, "must be > 0")
        _check(self.rms_norm_eps > 0, owner, "rms_norm_eps", self.rms_norm_eps, "must be > 0")


@dataclass(frozen=True)
class ModelConfig:
    """Whole π0.5 model: vision tower, VLM, action expert, flow-matching head, prompt limits.

    ``action_dim`` is the padded model dimension (32); the robot's own one (a slice) comes from the norm stats.
    """

    name: str
    vision: VisionConfig
    vlm: GemmaConfig
    expert: GemmaConfig
    vocab_size: int = 257152
    action_dim: int = 32
    action_horizon: int = 50
    max_token_len: int = 200
    num_denoise_steps: int = 10
    num_state_bins: int = 256
    image_slots: tuple[str, ...] = IMAGE_SLOTS
    time_min_period: float = 4e-3
    time_max_period: float = 4.0
    discrete_state_input: bool = True  # False: openpi pi05_libero's prompt "BOS + instruction + \n" (no state)

    @property
    def num_image_tokens(self) -> int:
        """Image tokens over all slots (masked slots included)."""
        return len(self.image_slots) * self.vision.num_tokens

    @property
    def max_prefix_len(self) -> int:
        """Longest possible prefix: all image tokens plus ``max_token_len`` prompt tokens."""
        return self.num_image_tokens + self.max_token_len

    def validate(self) -> ModelConfig:
        """Check every field; raise :class:`ConfigError` naming the first invalid one."""
        self.vision.validate()
        self.vlm.validate("vlm")
        self.expert.validate("expert")
        o = "model"
        _check(
            self.expert.depth == self.vlm.depth,
            o,
            "expert.depth",
            self.expert.depth,
            f"must equal vlm.depth={self.vlm.depth} (one joint attention per layer)",
        )
        for name in ("head_dim", "num_heads", "num_kv_heads"):
            _check(
                getattr(self.expert, name) == getattr(self.vlm, name),
                o,
                f"expert.{name}",
                getattr(self.expert, name),
                f"must equal vlm.{name} (joint attention)",
            )
        for name in (
            "vocab_size",
            "action_dim",
            "action_horizon",
            "max_token_len",
            "num_denoise_steps",
            "num_state_bins",
        ):
            v = getattr(self, name)
            _check(isinstance(v, int) and v > 0, o, name, v, "must be a positive int")
        _check(
            len(self.image_slots) >= 1 and len(set(self.image_slots)) == len(self.image_slots),
            o,
            "image_slots",
            self.image_slots,
            "must be non-empty and unique",
        )
        _check(
            0 < self.time_min_period < self.time_max_period,
            o,
            "time_min_period",
            self.time_min_period,
            "must satisfy 0 < time_min_period < time_max_period",
        )
        return self

    def replace(self, **changes: Any) -> ModelConfig:
        """Return a validated copy with top-level fields changed."""
        return dataclasses.replace(self, **changes).validate()

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (written as ``config.json`` by ``save_pretrained``)."""
        d = dataclasses.asdict(self)
        d["image_slots"] = list(self.image_slots)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise ConfigError(f"model config has unknown keys: {extra}")
        d = dict(d)
        for key, sub in (("vision", VisionConfig), ("vlm", GemmaConfig), ("expert", GemmaConfig)):
            d[key] = sub(**d[key]) if isinstance(d.get(key), dict) else d.get(key)
        if "image_slots" in d:
            d["image_slots"] = tuple(d["image_slots"])
        return cls(**d).validate()


def _pi05() -> ModelConfig:
    return ModelConfig(
        name="pi05",
        vision=VisionConfig(),
        vlm=GemmaConfig(width=2048, depth=18, mlp_dim=16384),
        expert=GemmaConfig(width=1024, depth=18, mlp_dim=4096),
    )


def _pi05_small() -> ModelConfig:
    # Same structure and token counts (3 x 256 image tokens, 200 prompt tokens) as pi05, with
    # widths/depths cut so one frame runs well under a second on 2 CPU cores (benchmarks, demo).
    return ModelConfig(
        name="pi05-small",
        vision=VisionConfig(hidden_size=192, intermediate_size=768, num_layers=4, num_heads=4),
        vlm=GemmaConfig(width=256, depth=4, mlp_dim=1024, num_heads=8, num_kv_heads=1, head_dim=32),
        expert=GemmaConfig(width=128, depth=4, mlp_dim=512, num_heads=8, num_kv_heads=1, head_dim=32),
        vocab_size=2048,
    )


def _pi05_sim() -> ModelConfig:
    # The shipped sim policy (``train``): trainable from scratch on 2 CPU cores in about an hour.
    # Images of 112 px in 16 px patches (49 tokens per camera) still show the 4 cm cube of the
    # ALOHA sim's 160x120 top camera as a few red pixels; a 1 s chunk (50 points at 50 Hz).
    return ModelConfig(
        name="pi05-sim",
        vision=VisionConfig(
            hidden_size=64, intermediate_size=256, num_layers=3, num_heads=4, image_size=112, patch_size=16
        ),
        vlm=GemmaConfig(width=128, depth=3, mlp_dim=512, num_heads=4, num_kv_heads=1, head_dim=32),
        expert=GemmaConfig(width=64, depth=3, mlp_dim=256, num_heads=4, num_kv_heads=1, head_dim=32),
        vocab_size=1024,
        max_token_len=48,
    )


def _pi05_tiny() -> ModelConfig:
    # For unit tests: milliseconds per call, but every code path of the full model.
    return ModelConfig(
        name="pi05-tiny",
        vision=VisionConfig(
            hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, image_size=56, patch_size=14
        ),
        vlm=GemmaConfig(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16),
        expert=GemmaConfig(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16),
        vocab_size=512,
        action_horizon=10,
        max_token_len=64,
    )


PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "pi05": _pi05,
    "pi05-small": _pi05_small,
    "pi05-sim": _pi05_sim,
    "pi05-tiny": _pi05_tiny,
}


def get_preset(name: str) -> ModelConfig:
    """Return the validated :class:`ModelConfig` of a named preset.

    Raises:
        ConfigError: unknown preset name (the message lists the known ones).
    """
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
    return PRESETS[name]().validate()


MODES, ATTENTIONS = ("unified", "shared_kv", "isolated"), ("auto", "gather", "flex")
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
#: Weight formats of the Gemma projections, a load option (``core.model.quantize``): fp32 / bf16
#: unquantized, int8 / fp8 / int4 torchao weight-only (fp8, int4: CUDA only).
WEIGHT_FORMATS = ("fp32", "bf16", "fp8", "int8", "int4")
BUDGETS, SCHEDULES, BATCHER_POLICIES = ("fixed", "adaptive"), ("serial", "concurrent"), ("frame", "continuous")


#: The fields a task template may use: ``{text}`` (the ask) and ``{instruction}`` (the current one).
TEMPLATE_FIELDS: tuple[str, ...] = ("text", "instruction")


def template_problem(template: object) -> str | None:
    """Why ``template`` (``str.format`` syntax) cannot be filled with :data:`TEMPLATE_FIELDS`, or None: not
    text, a lone brace, any other field (``{}``, ``{0}``, ``{text.x}``, ``{nope}``) or a spec like ``{text:d}``."""
    allowed = "allowed fields: " + ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS)
    if not isinstance(template, str):
        return f"must be text, got {type(template).__name__}"
    try:
        unknown = [n for _, n, _, _ in string.Formatter().parse(template) if n is not None and n not in TEMPLATE_FIELDS]
        if unknown:
            return f"unknown field {{{unknown[0]}}}; {allowed}"
        template.format(**{f: "" for f in TEMPLATE_FIELDS})
    except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
        why = f"unknown field {{{e.args[0]}}}" if isinstance(e, KeyError) else str(e)
        braces = "; write {{ and }} for literal braces" if "Single" in why else ""
        return f"cannot be filled ({why}{braces}); {allowed}"
    return None


@dataclass(frozen=True)
class TaskConfig:
    """One language task: how its requests are prompted and bounded.

    ``template`` is filled with ``{text}`` (the ask) and ``{instruction}`` (``TEMPLATE_FIELDS``, no other
    field); it continues the shared observation prefix, or with ``own_prefix`` sits inside a bidirectional
    prefix of its own (π0.5 subtask prediction, one more prefill per request). ``every_n_frames > 0`` makes
    the task periodic (e.g. textual memory).
    """

    name: str
    template: str = "{text}"
    max_new_tokens: int = 30
    temperature: float = 0.0
    top_k: int = 0
    every_n_frames: int = 0
    own_prefix: bool = False

    def validate(self) -> TaskConfig:
        """Raise :class:`ConfigError` naming the first invalid field."""
        o = f"tasks.{self.name}"
        _check(
            bool(self.name) and self.name.replace("_", "").isalnum(),
            o,
            "name",
            self.name,
            "must be a non-empty identifier",
        )
        problem = template_problem(self.template)
        _check(problem is None, o, "template", self.template, str(problem))
        _check(
            isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
            o,
            "max_new_tokens",
            self.max_new_tokens,
            "must be an int >= 1",
        )
        _check(
            self.temperature >= 0.0 and self.temperature < float("inf"),
            o,
            "temperature",
            self.temperature,
            "must be a finite number >= 0",
        )
        _check(self.top_k >= 0, o, "top_k", self.top_k, "must be >= 0")
        _check(self.every_n_frames >= 0, o, "every_n_frames", self.every_n_frames, "must be >= 0")
        return self


DEFAULT_TASKS: tuple[TaskConfig, ...] = (
    TaskConfig(name="conversation", template="Question: {text}\nAnswer: ", max_new_tokens=30),
    TaskConfig(name="memory", template="Memory of the scene while doing {instruction}: ", max_new_tokens=20),
)


@dataclass(frozen=True)
class EngineConfig:
    """The unified KV cache engine (docs/architecture.md, 'Engine modes' and 'Schedules').

    Attributes:
        mode: ``unified`` (shared prefill + cross-frame continuous batching), ``shared_kv`` (shared
            prefill, each frame's text decoded to completion in that frame) or ``isolated``
            (openpi-style: every task prefills its own copy; text completed in its frame).
        decode_budget: ``fixed`` — ``tokens_per_frame`` decode steps per frame; ``adaptive`` — as
            many steps (``min_decode_steps`` … ``max_decode_steps``) as fit before
            ``frame_deadline_s`` from measured step costs.
        tokens_per_frame: k, decode steps per frame in ``fixed`` mode.
        frame_deadline_s: frame budget in seconds for ``adaptive`` (0 → no deadline: fixed k).
        block_size: token slots per KV block.
        kv_blocks / kv_memory_mb / kv_memory_fraction: pool size in blocks (0 → sized for the workload
            within kv_memory_mb MiB of K+V, else the fraction of free CUDA memory or 1024 MiB on the CPU).
        requests_per_frame / max_running_requests: expected asks per frame (periodic tasks add
            1/every_n_frames) — with k, the requests in flight the pool holds — and the decode batch cap
            (0 → that in-flight count).
        max_queued_requests / max_queue_wait_s / max_overtakes: queue bounds — length and age (beyond:
            rejected with a reason, "expired"; 0 s → no age bound) — and the overtakes a request that does
            not fit yet allows before it holds the queue until it fits (aging; 0 → strict FIFO).
        seed: seed of the per-frame flow noise (the same in every mode).
        num_denoise_steps: S (0 → the model's default).
        compile: torch.compile mode of the hot stages (``COMPILE_MODES``, ``core.engine.compiled``).
        static_shapes: prefix padded to camera-count buckets, decode to batch buckets with a fixed
            block-table width (padding never changes results). Compiled stages always run on static
            shapes (one graph per bucket); eager ones only when this is set — on the CPU the padded
            prompt costs prefill and denoise time and buys nothing (no graph to reuse).
        attention: decode attention — ``flex`` (FlexAttention, paged block mask, no K/V gather),
            ``gather`` (reference) or ``auto`` (flex when compiled on CUDA).
        max_request_tokens / max_top_k: bounds of a request's prompt + new tokens (fixes the block-table
            width) and of its ``top_k`` (static bound of on-device sampling).
        max_request_chars: longest ask text accepted, in characters (longer: rejected at submission,
            before any formatting or tokenization).
        schedule / batcher_policy: ``serial`` | ``concurrent`` (two loops, same outputs); ``frame`` | ``continuous``.
    """

    mode: str = "unified"
    decode_budget: str = "fixed"
    tokens_per_frame: int = 4
    min_decode_steps: int = 1
    max_decode_steps: int = 16
    frame_deadline_s: float = 0.0
    block_size: int = 16
    kv_blocks: int = 0
    kv_memory_mb: float = 0.0
    kv_memory_fraction: float = 0.5
    requests_per_frame: float = 1.0
    max_running_requests: int = 0
    max_queued_requests: int = 64
    max_queue_wait_s: float = 30.0
    max_overtakes: int = 8
    seed: int = 0
    num_denoise_steps: int = 0
    schedule: str = "serial"
    batcher_policy: str = "frame"
    tasks: tuple[TaskConfig, ...] = DEFAULT_TASKS
    compile: str = "none"
    static_shapes: bool = False
    attention: str = "auto"
    max_request_tokens: int = 512
    max_top_k: int = 256
    max_request_chars: int = 2000

    def validate(self) -> EngineConfig:
        """Raise :class:`ConfigError` naming the first invalid field."""
        o = "engine"
        for name, choices in (
            ("compile", COMPILE_MODES),
            ("attention", ATTENTIONS),
            ("mode", MODES),
            ("decode_budget", BUDGETS),
            ("schedule", SCHEDULES),
            ("batcher_policy", BATCHER_POLICIES),
        ):
            _check(getattr(self, name) in choices, o, name, getattr(self, name), f"must be one of {choices}")
        bad_k = [t.name for t in self.tasks if t.top_k > self.max_top_k]
        _check(not bad_k, o, "max_top_k", self.max_top_k, f"is below the top_k of tasks {bad_k}")
        for name in (
            "tokens_per_frame",
            "max_decode_steps",
            "block_size",
            "max_request_tokens",
            "max_top_k",
            "max_request_chars",
        ):
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 1, o, name, v, "must be an int >= 1")
        for name in (
            "min_decode_steps",
            "kv_blocks",
            "max_queued_requests",
            "num_denoise_steps",
            "max_running_requests",
            "max_overtakes",
        ):
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 0, o, name, v, "must be an int >= 0")
        _check(
            self.min_decode_steps <= self.max_decode_steps,
            o,
            "min_decode_steps",
            self.min_decode_steps,
            "must be <= max_decode_steps",
        )
        for name in ("frame_deadline_s", "kv_memory_mb", "requests_per_frame", "max_queue_wait_s"):
            v = getattr(self, name)
            _check(v >= 0 and v < float("inf"), o, name, v, "must be a finite number >= 0")
        _check(0 < self.kv_memory_fraction <= 1, o, "kv_memory_fraction", self.kv_memory_fraction, "must be in (0, 1]")
        names = [t.validate().name for t in self.tasks]
        _check(len(set(names)) == len(names), o, "tasks", names, "task names must be unique")
        return self

    def task(self, name: str) -> TaskConfig:
        """The task named ``name`` (raises ``KeyError`` listing the configured tasks)."""
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(f"unknown language task {name!r}; configured: {[t.name for t in self.tasks]}")


__all__ = [
    "MODES",
    "BUDGETS",
    "COMPILE_MODES",
    "ATTENTIONS",
    "SCHEDULES",
    "BATCHER_POLICIES",
    "TaskConfig",
    "DEFAULT_TASKS",
    "TEMPLATE_FIELDS",
    "template_problem",
    "EngineConfig",
    "IMAGE_SLOTS",
    "ConfigError",
    "VisionConfig",
    "GemmaConfig",
    "ModelConfig",
    "PRESETS",
    "get_preset",
]
