"""Tests of oxygen_ros.core.processing and oxygen_ros.core.prompt."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from oxygen_ros.core.config import IMAGE_SLOTS
from oxygen_ros.core.processing import (
    InvalidInputError,
    NonFiniteActionError,
    Normalizer,
    prepare_images,
    resize_with_pad,
)
from oxygen_ros.core.prompt import PromptTokenizer, PromptTooLongError, discretize_state, format_template
from oxygen_ros.core.tokenizer import build_tokenizer
from oxygen_ros.core.types import NormStats


def stats(q01, q99) -> NormStats:
    q01, q99 = np.asarray(q01, np.float32), np.asarray(q99, np.float32)
    return NormStats(mean=(q01 + q99) / 2, std=np.ones_like(q01), q01=q01, q99=q99)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(512)


# ------------------------------------------------------------------------------------------- images


def red(h, w, dtype=np.uint8):
    img = np.zeros((h, w, 3), dtype)
    img[..., 0] = 255 if dtype == np.uint8 else 1.0
    return img


def test_resize_with_pad_wide_image():
    out = resize_with_pad(red(90, 200), 56)  # ratio 200/56; content 25 rows; pad 15 top, 16 bottom
    assert out.shape == (56, 56, 3) and out.dtype == np.float32
    assert (out[:15] == -1).all() and (out[40:] == -1).all()
    content = out[15:40]
    assert (content[..., 0] == 1).all() and (content[..., 1:] == -1).all()


def test_resize_with_pad_tall_image():
    out = resize_with_pad(red(300, 100), 56)  # content 56 x 18 columns; pad 19 left, 19 right
    assert (out[:, :19] == -1).all() and (out[:, 37:] == -1).all()
    assert (out[:, 19:37, 0] == 1).all() and (out[:, 19:37, 1:] == -1).all()


def test_resize_same_size_is_exact_affine_map():
    img = np.arange(56 * 56 * 3, dtype=np.int64).reshape(56, 56, 3).astype(np.uint8)
    out = resize_with_pad(img, 56)
    np.testing.assert_allclose(out, img.astype(np.float32) / 255 * 2 - 1, atol=1e-6)
    assert out.min() >= -1 and out.max() <= 1


def test_float_and_uint8_agree():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    a = resize_with_pad(img, 56)
    b = resize_with_pad(img.astype(np.float32) / 255, 56)
    np.testing.assert_allclose(a, b, atol=2 / 255 + 1e-6)
    f = resize_with_pad(red(40, 80, np.float64), 56)
    assert np.allclose(f[14:42, :, 0], 1, atol=1e-6) and (f[:14] == -1).all()


@pytest.mark.parametrize("hw", [(480, 640), (720, 1280), (90, 200), (300, 100), (40, 80), (100, 100)])
def test_resize_matches_opencv_inter_linear(hw):
    """The core resamples with ``F.interpolate`` (no OpenCV on the core path); OpenCV's
    ``INTER_LINEAR`` — what it used before, and what LeRobot's and openpi's pipelines are close
    to — gives the same pixels within one intensity level for uint8 (fixed-point rounding) and
    within 3e-4 (of the [-1, 1] range) for float images."""
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(hw[0])
    img = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
    size = 224
    ratio = max(hw[1] / size, hw[0] / size)
    rh, rw = max(1, min(size, int(hw[0] / ratio))), max(1, min(size, int(hw[1] / ratio)))
    top, left = (size - rh) // 2, (size - rw) // 2
    for src, tol in ((img, 2 / 255 + 1e-6), (img.astype(np.float32) / 255, 3e-4)):
        ref = cv2.resize(src, (rw, rh), interpolation=cv2.INTER_LINEAR).astype(np.float32)
        ref = ref * (2 / 255) - 1 if src.dtype == np.uint8 else np.clip(ref, 0, 1) * 2 - 1
        out = resize_with_pad(src, size)
        np.testing.assert_allclose(out[top : top + rh, left : left + rw], ref, atol=tol)
        assert (out[:top] == -1).all() and (out[top + rh :] == -1).all()


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.zeros((10, 10), np.uint8), "shape"),
        (np.zeros((10, 10, 4), np.uint8), "shape"),
        (np.zeros((0, 10, 3), np.uint8), "empty"),
        (np.zeros((10, 10, 3), np.int16), "dtype"),
        (np.zeros((10, 10, 3), bool), "dtype"),
        (np.full((10, 10, 3), np.nan, np.float32), "NaN"),
        (np.full((10, 10, 3), 200.0, np.float32), "0..255"),
        (np.full((10, 10, 3), -0.5, np.float32), r"\[0, 1\]"),
        ([[[0, 0, 0]]], "numpy"),
    ],
)
def test_resize_rejects(bad, match):
    with pytest.raises(InvalidInputError, match=match):
        resize_with_pad(bad, 56)


def test_prepare_images():
    imgs = {"base_0_rgb": red(90, 200), "right_wrist_0_rgb": None}
    pixels, mask = prepare_images(imgs, IMAGE_SLOTS, 56)
    assert pixels.shape == (3, 3, 56, 56) and pixels.dtype == np.float32
    assert mask.tolist() == [True, False, False]
    assert (pixels[1:] == -1).all()
    assert (pixels[0, 0, 15:40] == 1).all() and (pixels[0, 1:, 15:40] == -1).all()  # CHW


def test_prepare_images_errors():
    with pytest.raises(InvalidInputError, match="front_cam"):
        prepare_images({"front_cam": red(10, 10)}, IMAGE_SLOTS, 56)
    with pytest.raises(InvalidInputError, match="at least one"):
        prepare_images({"base_0_rgb": None}, IMAGE_SLOTS, 56)
    with pytest.raises(InvalidInputError, match="left_wrist_0_rgb"):
        prepare_images({"left_wrist_0_rgb": np.zeros((4, 4), np.uint8)}, IMAGE_SLOTS, 56)


# ------------------------------------------------------------------------------------ normalisation


def test_normalize_state_formula():
    n = Normalizer(stats([0, -2], [10, 2]), stats([0], [1]))
    out = n.normalize_state(np.array([5.0, 2.0]))
    expected = (np.array([5.0, 4.0]) / (np.array([10.0, 4.0]) + 1e-6)) * 2 - 1
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert out.dtype == np.float32


def test_zero_width_stats():
    n = Normalizer(stats([1.0, 0.0], [1.0, 2.0]), stats([0.5, -1], [0.5, 1]))
    s = n.normalize_state(np.array([1.0, 1.0]))
    assert s[0] == -1.0  # == openpi/LeRobot for x == q01
    assert n.normalize_state(np.array([7.0, 1.0]))[0] == -1.0  # guarded, no 1e6 blow-up
    a = n.unnormalize_actions(np.array([[1.0, 0.0], [-1.0, 1.0], [30.0, 0.0]]))
    assert (a[:, 0] == 0.5).all()
    assert np.isfinite(a).all()


def test_unnormalize_actions_slices_and_inverts():
    n = Normalizer(stats([0], [1]), stats([-1, 0, 10], [1, 4, 20]))
    model = np.zeros((5, 32), np.float32)
    model[:, 1] = 1.0
    out = n.unnormalize_actions(model)
    assert out.shape == (5, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], [0.0, 4.0, 15.0], atol=2e-6)
    x = np.array([[3.0, 13.0, -0.5]])  # unnormalize is the inverse of the state formula
    n2 = Normalizer(stats([0, 10, -1], [4, 20, 1]), stats([0, 10, -1], [4, 20, 1]))
    np.testing.assert_allclose(n2.unnormalize_actions(n2.normalize_state(x[0])[None]), x, rtol=1e-5)


def test_identity_normalizer():
    n = Normalizer.identity(3, 2)
    np.testing.assert_allclose(n.normalize_state(np.array([-1.0, 0.0, 0.5])), [-1, 0, 0.5], atol=1e-5)
    np.testing.assert_allclose(n.unnormalize_actions(np.full((2, 32), 0.25)), 0.25, atol=1e-5)
    assert n.state_dim == 3 and n.action_dim == 2


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_state_raises(value):
    n = Normalizer.identity(4, 2)
    with pytest.raises(InvalidInputError, match=r"state\[2\]"):
        n.normalize_state(np.array([0.0, 0.0, value, 0.0]))


def test_state_shape_errors():
    n = Normalizer.identity(4, 2)
    with pytest.raises(InvalidInputError, match=r"\[4\]"):
        n.normalize_state(np.zeros(3))
    with pytest.raises(InvalidInputError):
        n.normalize_state(np.zeros((2, 2)))
    with pytest.raises(InvalidInputError, match="too far"):
        Normalizer(stats([0], [1e-30]), stats([0], [1])).normalize_state(np.array([1e38]))


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_actions_raise(value):
    n = Normalizer.identity(2, 2)
    a = np.zeros((4, 32))
    a[3, 1] = value
    with pytest.raises(NonFiniteActionError, match="step 3, dim 1"):
        n.unnormalize_actions(a)
    a[3, 1] = 0
    a[0, 20] = value  # a padded column going NaN means the model diverged
    with pytest.raises(NonFiniteActionError):
        n.unnormalize_actions(a)
    with pytest.raises(NonFiniteActionError, match="overflow"):
        Normalizer.identity(2, 1).unnormalize_actions(np.full((1, 2), 1e300))


def test_bad_stats_rejected():
    with pytest.raises(ValueError, match="index 1"):
        Normalizer(stats([0, 1], [1, 0]), stats([0], [1]))
    with pytest.raises(ValueError):
        Normalizer(stats([0, np.nan], [1, 1]), stats([0], [1]))


# ------------------------------------------------------------------------------------------- prompt

STATE = np.array([-1.0, -0.5, 0.0, 0.5, 1.0, -1.01, 1.01], np.float32)
# Checked by hand against the vocabulary: pieces spell the text below, BOS first, pad 0.
EXPECTED_PIECES = [
    "<bos>",
    "Task:",
    "▁pick",
    "▁up",
    "▁the",
    "▁re",
    "d",
    "▁cube",
    ",",
    "▁State:",
    "▁",
    "0",
    "▁6",
    "4",
    "▁12",
    "8",
    "▁19",
    "2",
    "▁25",
    "5",
    "▁",
    "0",
    "▁25",
    "5",
    ";\nAction:",
    "▁",
]
EXPECTED_IDS = [
    2,
    381,
    511,
    452,
    361,
    451,
    329,
    462,
    273,
    387,
    356,
    277,
    392,
    281,
    398,
    285,
    390,
    279,
    417,
    282,
    356,
    277,
    417,
    282,
    380,
    356,
]


def test_state_bin_edges():
    assert discretize_state(STATE).tolist() == [0, 64, 128, 192, 255, 0, 255]
    assert discretize_state(np.array([-1 + 1 / 128 - 1e-9, -1 + 1 / 128])).tolist() == [0, 1]
    with pytest.raises(InvalidInputError, match=r"state\[1\]"):
        discretize_state(np.array([0.0, np.nan]))


def test_exact_prompt_ids(tok):
    pt = PromptTokenizer(tok, max_len=64)
    text = pt.format_prompt("  pick_up the\nred cube ", STATE)
    assert text == "Task: pick up the red cube, State: 0 64 128 192 255 0 255;\nAction: "
    tokens, mask = pt.tokenize_prompt("  pick_up the\nred cube ", STATE)
    assert tokens.dtype == np.int64 and mask.dtype == bool and tokens.shape == mask.shape == (64,)
    n = len(EXPECTED_IDS)
    assert tokens[:n].tolist() == EXPECTED_IDS
    assert tok.convert_ids_to_tokens(EXPECTED_IDS) == EXPECTED_PIECES
    assert mask[:n].all() and not mask[n:].any() and (tokens[n:] == 0).all()
    assert tok.decode(tokens[1:n].tolist()) == text


def prompt_len(pt, instruction):
    return 1 + len(pt.tokenizer.encode(pt.format_prompt(instruction, STATE), add_special_tokens=False))


def test_limit_exact_and_one_over(tok, caplog):
    instruction = "pick up the red cube and place it in the bowl"
    n = prompt_len(PromptTokenizer(tok, 200), instruction)
    tokens, mask = PromptTokenizer(tok, n).tokenize_prompt(instruction, STATE)
    assert mask.all() and tokens[0] == 2  # exactly at the limit: no padding, no error
    with pytest.raises(PromptTooLongError, match=f"{n} tokens, max_len is {n - 1}"):
        PromptTokenizer(tok, n - 1).tokenize_prompt(instruction, STATE)
    pt = PromptTokenizer(tok, n - 1, overflow="truncate")
    with caplog.at_level(logging.WARNING, logger="oxygen_ros.core.prompt"):
        tokens, mask = pt.tokenize_prompt(instruction, STATE)
    assert "truncated" in caplog.text
    assert mask.sum() <= n - 1 and tokens[0] == 2
    text = tok.decode(tokens[1:][mask[1:]].tolist())
    assert text == "Task: pick up the red cube and place it in the, State: 0 64 128 192 255 0 255;\nAction: "


def test_truncate_long_instruction_keeps_state_and_cue(tok):
    pt = PromptTokenizer(tok, 48, overflow="truncate")
    words = "please carefully pick up the small red cube from the left side of the table " * 20
    tokens, mask = pt.tokenize_prompt(words, STATE)
    text = tok.decode(tokens[mask].tolist(), skip_special_tokens=True)
    assert mask[0] and mask.sum() <= 48
    assert text.startswith("Task: please carefully")
    assert text.endswith(", State: 0 64 128 192 255 0 255;\nAction: ")
    one_word = PromptTokenizer(tok, 40, overflow="truncate").tokenize_prompt("x" * 500, STATE)[1]
    assert one_word.sum() <= 40


def test_truncate_impossible_raises(tok):
    pt = PromptTokenizer(tok, 10, overflow="truncate")
    with pytest.raises(PromptTooLongError, match="empty instruction"):
        pt.tokenize_prompt("pick up", STATE)


def test_error_hierarchy():
    assert issubclass(PromptTooLongError, InvalidInputError) and issubclass(InvalidInputError, ValueError)
    assert issubclass(NonFiniteActionError, RuntimeError)


def test_prompt_literal_specials_and_continuation(tok):
    pt = PromptTokenizer(tok, 64)
    tokens, mask = pt.tokenize_prompt("say <eos>", STATE[:2])
    assert tok.eos_token_id not in tokens[mask].tolist()
    cont = pt.tokenize_continuation("Subtask: ")
    assert cont and cont[0] != tok.bos_token_id
    assert tok.decode(cont) == "Subtask: "
    with pytest.raises(ValueError):
        PromptTokenizer(tok, 64, overflow="drop")


def test_format_template():
    assert format_template("Task: {x}. Subtask: ", x="pick") == "Task: pick. Subtask: "
    with pytest.raises(InvalidInputError, match="needs field 'x'"):
        format_template("Task: {x}. Subtask: ", y="pick")
    with pytest.raises(InvalidInputError):
        format_template("Task: {x.__class__}", x="a")
    with pytest.raises(InvalidInputError):
        format_template("Task: {}", x="a")
    with pytest.raises(InvalidInputError, match="malformed"):
        format_template("Task: {x", x="a")
