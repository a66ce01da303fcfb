"""Prompt formats of core/prompt.py beyond the π0.5 default: task prompts inside the prefix
(subtask prediction) and openpi's no-state format (``discrete_state_input=False``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.core.model import ckpt_config as cc
from oxygen_ros.core.prompt import PromptTokenizer, PromptTooLongError
from oxygen_ros.core.tokenizer import load_tokenizer

PARITY = Path(__file__).resolve().parents[1] / "data" / "parity"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(PARITY / "tiny_lerobot_pi05")


def test_prefix_prompt_ids_match_the_reference(tok):
    meta = json.loads((PARITY / "reference.json").read_text())
    pt = PromptTokenizer(tok, 48)
    assert pt.tokenize_prefix_prompt(meta["inputs"]["decode_prompt"]) == meta["inputs"]["decode_prompt_ids"]
    with pytest.raises(PromptTooLongError, match="task prompt is"):
        PromptTokenizer(tok, 5).tokenize_prefix_prompt(meta["inputs"]["decode_prompt"])


def test_no_state_format_is_openpi_pi0_format(tok):
    pt = PromptTokenizer(tok, 48, discrete_state=False)
    ids, mask = pt.tokenize_prompt("pick_up the cube\n", np.zeros(8, np.float32))
    want = (
        [tok.bos_token_id]
        + tok.encode("pick up the cube", add_special_tokens=False)
        + tok.encode("\n", add_special_tokens=False)
    )
    assert ids[: len(want)].tolist() == want and int(mask.sum()) == len(want)
    assert "State" not in tok.decode(ids[mask].tolist())


def test_openpi_config_states_discrete_state_input():
    assert cc.config_from_openpi({"pi05": True, "discrete_state_input": False}).discrete_state_input is False
    assert cc.config_from_openpi({"pi05": True}).discrete_state_input is True
