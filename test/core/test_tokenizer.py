"""Tests of oxygen_ros.core.tokenizer (built-in deterministic tokenizer, save/load)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oxygen_ros.core.tokenizer import BYTE_TOKENS, build_tokenizer, load_tokenizer, save_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "pick up the red cube",
    "Héllo wörld, ça va? Ñandú — naïve café",
    "emoji 😀🤖👍🏽 and CJK 你好世界 こんにちは 안녕하세요",
    "  leading and  double  spaces, trailing ",
    "tabs\tand\nnew\nlines\r\n",
    "Task: fold the towel, State: 0 17 255;\nAction: ",
    "<bos> <eos> <unused3> typed as text",
    "",
]


def test_vocab_layout(tok):
    vocab = tok.get_vocab()
    assert len(tok) == len(vocab) == max(vocab.values()) + 1
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert [vocab[b] for b in BYTE_TOKENS] == list(range(4, 260))
    assert tok.convert_ids_to_tokens(len(vocab) - 1) is not None


def test_exact_sizes():
    assert len(build_tokenizer(512)) == 512
    big = build_tokenizer(2048)
    assert len(big) == 2048
    assert big.convert_ids_to_tokens(2047).startswith("<unused")


def test_too_small_vocab_raises():
    with pytest.raises(ValueError, match="too small"):
        build_tokenizer(300)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


def test_literal_specials_with_split():
    tok = build_tokenizer(2048)
    text = "say <eos> and <unused3>"
    ids = tok.encode(text, add_special_tokens=False, split_special_tokens=True)
    assert tok.eos_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_byte_fallback_for_unknown_chars(tok):
    ids = tok.encode("你", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == ["<0xE4>", "<0xBD>", "<0xA0>"]
    assert tok.unk_token_id not in tok.encode("😀 你好 é", add_special_tokens=False)


def test_bos_added_by_default(tok):
    ids = tok.encode("pick up")
    assert ids[0] == 2 and ids[1:] == tok.encode("pick up", add_special_tokens=False)


def test_deterministic_json(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    save_tokenizer(build_tokenizer(512), a)
    save_tokenizer(build_tokenizer(512), b)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


def test_deterministic_across_processes(tmp_path):
    code = (
        "import hashlib,sys; from oxygen_ros.core.tokenizer import build_tokenizer; "
        "print(hashlib.sha256(build_tokenizer(2048).backend_tokenizer.to_str().encode()).hexdigest())"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    here = hashlib.sha256(build_tokenizer(2048).backend_tokenizer.to_str().encode()).hexdigest()
    assert out.stdout.strip() == here


def test_save_load_round_trip(tmp_path):
    tok = build_tokenizer(512)
    files = save_tokenizer(tok, tmp_path / "ckpt")
    assert any(f.endswith("tokenizer.json") for f in files)
    loaded = load_tokenizer(tmp_path / "ckpt")
    assert len(loaded) == 512 and loaded.bos_token_id == 2 and loaded.eos_token_id == 1
    for text in TEXTS:
        assert loaded.encode(text) == tok.encode(text)
    (tmp_path / "ckpt" / "tokenizer_config.json").unlink()  # bare tokenizer.json still works
    bare = load_tokenizer(tmp_path / "ckpt")
    assert bare.bos_token_id == 2 and bare.encode(TEXTS[1]) == tok.encode(TEXTS[1])


def test_load_sentencepiece_model(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    lines = ["pick up the red cube and place it in the bowl", "Task: open the drawer, State: 1 2 3;"] * 20
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=320,
        model_type="bpe",
        byte_fallback=True,
        add_dummy_prefix=False,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        minloglevel=2,
    )
    ref = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    folder = tmp_path / "openpi"
    folder.mkdir()
    (folder / "paligemma_tokenizer.model").write_bytes((tmp_path / "sp.model").read_bytes())
    tok = load_tokenizer(folder)
    assert tok.bos_token_id == 2
    text = "pick up the cube, State: 12 3"
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_load_missing_lists_names(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_tokenizer(tmp_path)
    for name in ("tokenizer.json", "tokenizer.model", "paligemma_tokenizer.model"):
        assert name in str(e.value)
