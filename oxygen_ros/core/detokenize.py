"""Streaming detokenization: turn a growing list of token ids into text deltas.

Approach (the offset scheme used by streaming LLM servers such as vLLM and TGI, our own code):
keep two offsets into the id list, ``prefix`` and ``read``. Each new token decodes only the window
``ids[prefix:]`` and compares it with the decoding of ``ids[prefix:read]``; the difference is the
new text. Decoding a window that starts one piece back (rather than at the new token alone) keeps
context-dependent rendering right, e.g. SentencePiece decoders that strip the leading "▁" space of
the first piece strip it in both decodings, so the delta keeps its space.

Byte fallback: a run of ``<0xNN>`` pieces is decoded as ONE group (invalid UTF-8 becomes one
U+FFFD per byte for the whole group), so a later byte piece can change the text of earlier ones.
Text is therefore released only after a token that closes the group (any piece that is neither a
byte piece nor a skipped special token) and never while the window text ends in U+FFFD; the
held-back tail comes out at the next such token or at :meth:`flush`.
"""

from __future__ import annotations

import operator
import re
import weakref
from typing import Any

_SPECIAL_IDS: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()


def special_ids(tokenizer: Any) -> frozenset[int]:
    """Special token ids of ``tokenizer``, computed once per tokenizer object (transformers 5
    rebuilds ``added_tokens_decoder`` on every access, ~1 ms — too slow once per request)."""
    ids = _SPECIAL_IDS.get(tokenizer)
    if ids is None:
        found = set(getattr(tokenizer, "all_special_ids", []) or [])
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        found |= {int(i) for i, t in added.items() if getattr(t, "special", False)}
        ids = _SPECIAL_IDS[tokenizer] = frozenset(found)
    return ids


_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Incremental text of one generated sequence.

    Invariant: ``"".join(push(i) for i in ids) + flush() == tokenizer.decode(ids,
    skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)``; no delta ever
    ends in a partial UTF-8 character or a U+FFFD from an unfinished byte sequence.

    Cost per :meth:`push` is one decode of the window since the previously emitted token (O(window),
    not O(n)); byte pieces and skipped special tokens are held without decoding at all.

    Args:
        tokenizer: a transformers tokenizer (``decode`` and ``convert_ids_to_tokens``).
        skip_special_tokens: drop special tokens (``<eos>``, ``<pad>``, ``<unused…>``) from the text.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids[:read] have been emitted
        self._hold_cache: dict[int, bool] = {}
        self._finished = False
        self._special: frozenset[int] = special_ids(tokenizer) if skip_special_tokens else frozenset()

    @property
    def token_ids(self) -> list[int]:
        """All ids pushed so far (a copy)."""
        return list(self._ids)

    def _holds(self, token_id: int) -> bool:
        # True for tokens that cannot end a byte-fallback group: byte pieces and skipped specials.
        held = self._hold_cache.get(token_id)
        if held is None:
            piece = self._tok.convert_ids_to_tokens(token_id)
            held = token_id in self._special or (isinstance(piece, str) and bool(_BYTE_PIECE.match(piece)))
            self._hold_cache[token_id] = held
        return held

    def _decode(self, ids: list[int]) -> str:
        text: str = self._tok.decode(ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False)
        return text

    def push(self, token_id: int) -> str:
        """Add one generated token; return the new complete text (often ``""``).

        Raises:
            TypeError: ``token_id`` is not an integer.
            RuntimeError: called after :meth:`flush`.
        """
        if self._finished:
            raise RuntimeError("IncrementalDetokenizer.push() after flush(); use a new detokenizer")
        if isinstance(token_id, bool):
            raise TypeError("token_id must be an int, got bool")
        token_id = operator.index(token_id)  # int or numpy integer; TypeError otherwise
        self._ids.append(token_id)
        if self._holds(token_id):
            return ""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Return all text not yet emitted (incl. U+FFFD for an unfinished byte sequence).

        Ends the stream: a later :meth:`push` raises ``RuntimeError``; ``flush`` again returns ``""``.
        """
        self._finished = True
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :]


__all__ = ["IncrementalDetokenizer"]
