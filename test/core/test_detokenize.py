"""Tests of oxygen_ros.core.detokenize.IncrementalDetokenizer."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders
from transformers import PreTrainedTokenizerFast

from oxygen_ros.core.detokenize import IncrementalDetokenizer
from oxygen_ros.core.tokenizer import build_tokenizer

TEXTS = [
    "Hello, I see a red cube on the table.",
    "Héllo wörld — ça va? naïve café, Ñandú",
    "emoji 😀🤖👍🏽 then CJK 你好世界 こんにちは 안녕하세요!",
    "  two  spaces\tand\nnew lines ",
    "😀",
    "你好",
]


def stream(tok, ids, skip=True):
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas = [d.push(i) for i in ids]
    deltas.append(d.flush())
    return deltas


@pytest.mark.parametrize("text", TEXTS)
def test_text_deltas_concatenate(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    deltas = stream(tok, ids)
    assert "".join(deltas) == text == tok.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in d for d in deltas)  # valid text never shows a replacement char


@pytest.mark.parametrize("skip", [True, False])
def test_random_streams(tok, skip):
    rng = random.Random(1234)
    n = len(tok)
    for _ in range(200):
        ids = [rng.randrange(4, 260) if rng.random() < 0.4 else rng.randrange(n) for _ in range(rng.randrange(1, 50))]
        deltas = stream(tok, ids, skip)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip), ids
        assert not any(d.endswith("\ufffd") for d in deltas[:-1]), ids


def test_bytes_held_until_closed():
    tok = build_tokenizer(512)
    ids = tok.encode("a😀 b", add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces[1:5] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    d = IncrementalDetokenizer(tok)
    assert d.push(ids[0]) == "a"
    assert [d.push(i) for i in ids[1:5]] == ["", "", "", ""]  # unfinished byte group: nothing yet
    rest = "".join(d.push(i) for i in ids[5:])
    assert rest == "😀 b"
    assert d.flush() == ""


def test_unfinished_bytes_come_out_at_flush():
    tok = build_tokenizer(512)
    ids = tok.encode("ok", add_special_tokens=False) + tok.convert_tokens_to_ids(["<0xF0>", "<0x9F>"])
    deltas = stream(tok, ids)
    assert deltas[-1] == "\ufffd\ufffd" and "".join(deltas) == tok.decode(ids)


def test_special_tokens(tok):
    body = tok.encode("done now", add_special_tokens=False)
    ids = [tok.bos_token_id] + body + [tok.eos_token_id]
    assert "".join(stream(tok, ids, skip=True)) == "done now"
    assert "".join(stream(tok, ids, skip=False)) == "<bos>done now<eos>"
    # a skipped special token between byte pieces does not split the UTF-8 group
    e_bytes = tok.convert_tokens_to_ids(["<0xC3>", "<0xA9>"])
    ids = [e_bytes[0], tok.eos_token_id, e_bytes[1]] + tok.encode("x", add_special_tokens=False)
    assert "".join(stream(tok, ids, skip=True)) == tok.decode(ids, skip_special_tokens=True) == "éx"


def strip_first_space_variant(tok):
    """Same vocab with a Llama-style decoder that drops the leading space of the text."""
    inner = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    inner.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=inner, bos_token="<bos>", eos_token="<eos>", clean_up_tokenization_spaces=False
    )


def test_leading_space_across_pieces():
    tok = strip_first_space_variant(build_tokenizer(2048))
    ids = tok.encode(" pick up the red cube, then 😀 place it", add_special_tokens=False)
    deltas = stream(tok, ids)
    full = tok.decode(ids, skip_special_tokens=True)
    assert full.startswith("pick up")  # the decoder stripped the first space only
    assert "".join(deltas) == full
    assert " up" in deltas and " the" in deltas  # later pieces keep their "▁" space


def test_window_stays_small():
    tok = build_tokenizer(2048)
    lengths: list[int] = []

    class Spy:
        def __getattr__(self, name):
            return getattr(tok, name)

        def decode(self, ids, **kw):
            lengths.append(len(ids))
            return tok.decode(ids, **kw)

    text = "pick up the red cube and place it in the bowl. " * 40
    ids = tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(Spy())
    out = "".join(d.push(i) for i in ids) + d.flush()
    assert out == text and len(ids) > 300
    assert max(lengths) <= 3  # O(window) per token, never the whole sequence


def test_errors():
    tok = build_tokenizer(512)
    d = IncrementalDetokenizer(tok)
    with pytest.raises(TypeError):
        d.push("a")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        d.push(True)  # type: ignore[arg-type]
    assert d.push(np.int64(300)) == tok.decode([300])
    d.flush()
    assert d.flush() == ""
    with pytest.raises(RuntimeError):
        d.push(300)
