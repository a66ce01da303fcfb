"""π0.5 prompt tokenization (discrete state) and language-task prompt templates.

Follows openpi ``src/openpi/models/tokenizer.py`` ``PaligemmaTokenizer.tokenize`` for π0.5 (state
given): ``"Task: {instruction}, State: {bins};\\nAction: "`` encoded with BOS first, padded with
id 0 and mask False up to ``max_len``. Two deliberate differences, both only on inputs openpi
mishandles: (1) the state is clipped to [-1, 1] before binning, so every bin is in
[0, num_bins - 1] where openpi would write ``-1`` or ``num_bins`` for an out-of-range state;
(2) an over-long prompt is an error (or, with ``overflow="truncate"``, a warned cut of the free
instruction text only) where openpi silently cuts the token list -- which would drop the state
and the ``Action:`` cue. Text is encoded literally: a ``"<eos>"`` typed in an instruction is the
five characters, never the special token (as with openpi's SentencePiece ``encode``).
"""

from __future__ import annotations

import logging
import string
from typing import Any

import numpy as np

from oxygen_ros.core.processing import InvalidInputError

logger = logging.getLogger(__name__)

_OVERFLOW = ("error", "truncate")


class PromptTooLongError(InvalidInputError):
    """The prompt needs more tokens than ``max_len``; the message gives the count and the limit."""


def clean_instruction(instruction: str) -> str:
    """openpi's cleaning: strip, then ``_`` and newlines become spaces."""
    return instruction.strip().replace("_", " ").replace("\n", " ")


def discretize_state(norm_state: np.ndarray, num_bins: int = 256) -> np.ndarray:
    """Bin a normalised state: ``digitize(clip(s, -1, 1), linspace(-1, 1, num_bins + 1)[:-1]) - 1``.

    Args:
        norm_state: ``[n]`` finite floats, nominally in [-1, 1].
        num_bins: number of bins (256 for π0.5).

    Returns:
        ``[n]`` int64 bins in [0, num_bins - 1] (-1 -> 0, 0 -> num_bins // 2, 1 -> num_bins - 1).

    Raises:
        InvalidInputError: not 1-D, or a NaN/inf entry (index named).
    """
    s = np.asarray(norm_state, dtype=np.float64)
    if s.ndim != 1:
        raise InvalidInputError(f"normalised state must be 1-D, got shape {list(s.shape)}")
    bad = np.flatnonzero(~np.isfinite(s))
    if bad.size:
        raise InvalidInputError(f"normalised state[{int(bad[0])}] is not finite ({s[bad[0]]!r})")
    edges = np.linspace(-1.0, 1.0, num_bins + 1)[:-1]
    return (np.digitize(np.clip(s, -1.0, 1.0), edges) - 1).astype(np.int64)


def format_template(template: str, **fields: Any) -> str:
    """Fill a ``str.format`` template with named fields, e.g. ``"Task: {x}. Subtask: "``.

    Only plain named fields are allowed (no positional ``{}``, no ``{a.b}`` / ``{a[0]}``).

    Raises:
        InvalidInputError: malformed template, a non-plain field, or a missing field (named, with
            the fields that were given).
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise InvalidInputError(f"malformed template {template!r}: {e}") from None
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise InvalidInputError(f"template {template!r}: field {{{name}}} must be a plain name like {{x}}")
        if name not in fields:
            raise InvalidInputError(f"template {template!r} needs field {name!r}; given: {sorted(fields)}")
    try:
        return template.format(**fields)
    except (ValueError, KeyError, IndexError) as e:
        raise InvalidInputError(f"cannot fill template {template!r}: {e}") from None


class PromptTokenizer:
    """Tokenize π0.5 prompts (openpi ``PaligemmaTokenizer`` with discrete state).

    Args:
        tokenizer: a transformers tokenizer with ``bos_token_id`` (PaliGemma's, or
            :func:`oxygen_ros.core.tokenizer.build_tokenizer`).
        max_len: prompt length in tokens incl. BOS (``ModelConfig.max_token_len``: 200 for π0.5).
        num_bins: state bins (``ModelConfig.num_state_bins``: 256).
        overflow: ``"error"`` (raise :class:`PromptTooLongError`) or ``"truncate"`` (warn and cut
            the instruction text only, at a word boundary where possible).
        discrete_state: True (π0.5 default): the state is part of the prompt. False (openpi
            ``discrete_state_input=False``, e.g. ``pi05_libero``): openpi's π0 format
            ``BOS + encode(instruction) + encode("\\n")``, the state is not given to the model.

    Raises:
        ValueError: bad ``max_len`` / ``num_bins`` / ``overflow``, or a tokenizer without BOS.
    """

    def __init__(
        self, tokenizer: Any, max_len: int, num_bins: int = 256, overflow: str = "error", discrete_state: bool = True
    ) -> None:
        if overflow not in _OVERFLOW:
            raise ValueError(f"overflow={overflow!r} must be one of {_OVERFLOW}")
        for name, v in (("max_len", max_len), ("num_bins", num_bins)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name}={v!r} must be a positive int")
        if getattr(tokenizer, "bos_token_id", None) is None:
            raise ValueError("tokenizer has no BOS token (bos_token_id is None)")
        self.tokenizer = tokenizer
        self.max_len = max_len
        self.num_bins = num_bins
        self.overflow = overflow
        self.discrete_state = bool(discrete_state)
        self.bos_id = int(tokenizer.bos_token_id)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def format_prompt(self, instruction: str, norm_state: np.ndarray) -> str:
        """The prompt text (no BOS): ``"Task: {cleaned}, State: {b_1 … b_n};\\nAction: "``."""
        if not isinstance(instruction, str):
            raise InvalidInputError(f"instruction must be a str, got {type(instruction).__name__}")
        bins = " ".join(str(int(b)) for b in discretize_state(norm_state, self.num_bins))
        return f"Task: {clean_instruction(instruction)}, State: {bins};\nAction: "

    def tokenize_prompt(self, instruction: str, norm_state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tokenize one observation's prompt.

        Args:
            instruction: free task text (cleaned as openpi does).
            norm_state: ``[state_dim]`` normalised state (see ``Normalizer.normalize_state``).

        Returns:
            ``tokens``: ``[max_len]`` int64, BOS first, padded with 0; ``mask``: ``[max_len]`` bool,
            True on the real tokens.

        Raises:
            InvalidInputError: bad instruction type or state (see :func:`discretize_state`).
            PromptTooLongError: too long and ``overflow="error"``, or the prompt does not fit even
                with an empty instruction.
        """
        if self.discrete_state:
            ids = [self.bos_id] + self._encode(self.format_prompt(instruction, norm_state))
        else:
            discretize_state(norm_state, self.num_bins)  # same input checks
            if not isinstance(instruction, str):
                raise InvalidInputError(f"instruction must be a str, got {type(instruction).__name__}")
            ids = [self.bos_id] + self._encode(clean_instruction(instruction)) + self._encode("\n")
            if len(ids) > self.max_len:
                raise PromptTooLongError(
                    f"prompt is {len(ids)} tokens, max_len is {self.max_len} "
                    f"(instruction {instruction!r}); shorten the instruction"
                )
        if len(ids) > self.max_len:
            if self.overflow == "error":
                raise PromptTooLongError(
                    f"prompt is {len(ids)} tokens, max_len is {self.max_len} (instruction "
                    f"{instruction!r}); shorten the instruction or raise max_token_len"
                )
            ids = self._truncate(instruction, norm_state, len(ids))
        n = len(ids)
        tokens = np.zeros(self.max_len, dtype=np.int64)
        tokens[:n] = ids
        mask = np.zeros(self.max_len, dtype=bool)
        mask[:n] = True
        return tokens, mask

    def _truncate(self, instruction: str, norm_state: np.ndarray, full_len: int) -> list[int]:
        cleaned = clean_instruction(instruction)

        def ids_for(text: str) -> list[int] | None:
            ids = [self.bos_id] + self._encode(self.format_prompt(text.rstrip(), norm_state))
            return ids if len(ids) <= self.max_len else None

        if ids_for("") is None:
            need = 1 + len(self._encode(self.format_prompt("", norm_state)))
            raise PromptTooLongError(
                f"prompt does not fit even with an empty instruction: {need} tokens (state "
                f"of {np.size(norm_state)} values) > max_len {self.max_len}"
            )
        lo, hi = 0, len(cleaned)  # invariant: cleaned[:lo] fits; search the longest fitting prefix
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ids_for(cleaned[:mid]) is not None:
                lo = mid
            else:
                hi = mid - 1
        kept = cleaned[:lo]
        if lo < len(cleaned) and cleaned[lo] != " " and not kept.endswith(" ") and " " in kept:
            kept = kept[: kept.rfind(" ")]  # the cut fell inside a word: drop the partial word
        ids = ids_for(kept)
        if ids is None:  # a shorter text can (rarely) tokenize longer; keep the searched cut
            kept, ids = cleaned[:lo], ids_for(cleaned[:lo])
        assert ids is not None
        logger.warning(
            "prompt of %d tokens exceeds max_len=%d: instruction truncated from %r to %r",
            full_len,
            self.max_len,
            cleaned,
            kept.rstrip(),
        )
        return ids

    def tokenize_prefix_prompt(self, text: str) -> list[int]:
        """Ids of a language task's own prompt placed INSIDE the bidirectional prefix (π0.5
        subtask prediction, e.g. ``"Task: pick up the cube. Subtask: "``): BOS first, no state,
        no padding (the reference decode of LeRobot's parity data).

        Raises:
            InvalidInputError: not a str; PromptTooLongError: more than ``max_len`` tokens.
        """
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        ids = [self.bos_id] + self._encode(text)
        if len(ids) > self.max_len:
            raise PromptTooLongError(f"task prompt is {len(ids)} tokens, max_len is {self.max_len}: {text!r}")
        return ids

    def tokenize_continuation(self, text: str) -> list[int]:
        """Ids of ``text`` appended after a prefix (no BOS; special-token names taken literally)."""
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        return self._encode(text)


__all__ = ["PromptTokenizer", "PromptTooLongError", "format_template", "discretize_state", "clean_instruction"]
