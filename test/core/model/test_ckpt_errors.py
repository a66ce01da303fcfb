"""Malformed and hostile checkpoint folders are refused with a :class:`CheckpointError` naming the file
(and the key / field): every case starts from a small valid checkpoint written to disk (pi05-tiny,
both layouts, with its tokenizer), breaks one file, and loads it through ``Pi05Policy.from_pretrained``
(the loader, the norm stats and the tokenizer, as the node does).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from oxygen_ros.core.config import PRESETS, get_preset
from oxygen_ros.core.model import ckpt_config as cc
from oxygen_ros.core.model.ckpt_files import action_convention_files
from oxygen_ros.core.model.keymap import CheckpointError
from oxygen_ros.core.model.weights import load_pretrained, random_pretrained, save_pretrained
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.tokenizer import build_tokenizer
from oxygen_ros.core.types import NormStats

TINY = get_preset("pi05-tiny")
NS = "assets/robot/norm_stats.json"
PRE, POST = "policy_preprocessor.json", "policy_postprocessor.json"
PRE_ST = "policy_preprocessor_step_2_normalizer_processor.safetensors"
POST_ST = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
W, IDX = "model.safetensors", "model.safetensors.index.json"
DEEP_PARSE = "[" * 100_000 + "]" * 100_000  # beyond the JSON parser's recursion limit
MiB = 2**20


# ------------------------------------------------------------------------------------ mutations
def text(rel: str, content: str) -> Callable[[Path], None]:
    return lambda f: (f / rel).write_text(content)


def raw(rel: str, content: bytes | Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def go(f: Path) -> None:
        (f / rel).write_bytes(content((f / rel).read_bytes()) if callable(content) else content)

    return go


def huge(rel: str, size: int) -> Callable[[Path], None]:
    """A file of ``size`` bytes (sparse: written instantly)."""

    def go(f: Path) -> None:
        with open(f / rel, "wb") as fh:
            fh.truncate(size)

    return go


def edit(rel: str, fn: Callable[[dict], Any]) -> Callable[[Path], None]:
    """Apply ``fn`` to the parsed JSON file (in place, or return a replacement) and write it back."""

    def go(f: Path) -> None:
        d = json.loads((f / rel).read_text())
        out = fn(d)
        (f / rel).write_text(json.dumps(d if out is None else out))

    return go


def put(**fields: Any) -> Callable[[dict], None]:
    return lambda d: d.update(fields)


def nested(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


def tensors(rel: str, fn: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def go(f: Path) -> None:
        sd = load_file(str(f / rel))
        fn(sd)
        save_file(sd, str(f / rel))

    return go


def set_value(key: str, value: float) -> Callable[[dict[str, torch.Tensor]], None]:
    def go(sd: dict[str, torch.Tensor]) -> None:
        sd[key] = sd[key].clone()
        sd[key].view(-1)[3] = value

    return go


def retype(key: str, dtype: torch.dtype) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda sd: sd.update({key: sd[key].to(dtype)})


def sharded(entry: str | int | None = None, link_to: Path | None = None) -> Callable[[Path], None]:
    """Split model.safetensors into a shard + index; ``entry`` replaces the first key's shard name;
    ``link_to``: that name is a symlink to this file."""

    def go(f: Path) -> None:
        sd = load_file(str(f / W))
        (f / W).unlink()
        save_file(sd, str(f / "shard-1.safetensors"))
        wmap: dict[str, Any] = {k: "shard-1.safetensors" for k in sd}
        if entry is not None:
            wmap[sorted(sd)[0]] = entry
        if link_to is not None:
            os.symlink(link_to, f / str(entry))
        (f / IDX).write_text(json.dumps({"metadata": {}, "weight_map": wmap}))

    return go


def then(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def go(f: Path) -> None:
        for s in steps:
            s(f)

    return go


# ------------------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Case:
    id: str
    layout: str
    mutate: Callable[[Path], None]
    file: str  # the file the message must name (relative to the folder)
    says: str  # and a piece of the message naming the key / field / problem


def outside(f: Path) -> Path:
    """A valid weight file next to the folder (what a hostile index would point at)."""
    return f.parent / f"{f.name}-outside.safetensors"


def link_outside_stats(f: Path) -> None:
    target = f.parent / f"{f.name}-norm_stats.json"
    shutil.copy(f / NS, target)
    (f / NS).unlink()
    os.symlink(target, f / NS)


CASES = [
    # config.json (layout file; read even when a complete oxygen_config.json makes it unused)
    Case("config-not-json", "openpi", text("config.json", "{not json"), "config.json", "not a readable JSON file"),
    Case("config-list", "openpi", text("config.json", "[1, 2]"), "config.json", "must hold a JSON object, got a list"),
    Case("config-deep-parse", "openpi", text("config.json", DEEP_PARSE), "config.json", "nested too deeply"),
    Case("config-deep", "openpi", edit("config.json", put(x=nested(40))), "config.json", "nested more than 32"),
    Case("config-huge", "openpi", huge("config.json", 17 * MiB), "config.json", "larger than the 16 MiB"),
    Case(
        "config-string-for-int",
        "openpi",
        edit("config.json", put(action_horizon="10")),
        "config.json",
        "'action_horizon' must be an int, got a string '10'",
    ),
    Case(
        "config-null",
        "openpi",
        edit("config.json", put(action_dim=None)),
        "config.json",
        "'action_dim' must be an int, got null",
    ),
    Case(
        "config-bool-for-int",
        "openpi",
        edit("config.json", put(max_token_len=True)),
        "config.json",
        "'max_token_len' must be an int",
    ),
    Case(
        "config-list-for-str",
        "openpi",
        edit("config.json", put(paligemma_variant=[1])),
        "config.json",
        "'paligemma_variant' must be a string, got a list",
    ),
    Case(
        "config-pi05-string",
        "openpi",
        edit("config.json", put(pi05="false")),
        "config.json",
        "'pi05' must be true or false",
    ),
    Case(
        "config-horizon-1e9",
        "openpi",
        edit("config.json", put(action_horizon=10**9)),
        "config.json",
        "action_horizon=1000000000 is out of range: must be an int in [1, 1000]",
    ),
    Case(
        "lerobot-chunk-1e9",
        "lerobot",
        edit("config.json", put(chunk_size=10**9)),
        "config.json",
        "chunk_size=1000000000 (the model's action_horizon) is out of range: must be an int in [1, 1000]",
    ),
    Case(
        "lerobot-steps-1e5",
        "lerobot",
        edit("config.json", put(num_inference_steps=100_000)),
        "config.json",
        "num_inference_steps=100000 (the model's num_denoise_steps) is out of range",
    ),
    Case(
        "lerobot-period-nan",
        "lerobot",
        text("config.json", '{"type": "pi05", "min_period": NaN}'),
        "config.json",
        "'min_period' must be a finite number",
    ),
    Case(
        "lerobot-resolution-int",
        "lerobot",
        edit("config.json", put(image_resolution=5)),
        "config.json",
        "'image_resolution' must be a list, got an int 5",
    ),
    Case(
        "lerobot-resolution-huge",
        "lerobot",
        edit("config.json", put(image_resolution=[10**6, 10**6])),
        "config.json",
        "image_resolution=[1000000, 1000000] is out of range",
    ),
    # oxygen_config.json: complete (as save_pretrained writes it) and partial
    Case("oxygen-not-json", "openpi", text("oxygen_config.json", "{"), "oxygen_config.json", "not a readable JSON"),
    Case("oxygen-list", "openpi", text("oxygen_config.json", "[]"), "oxygen_config.json", "must hold a JSON object"),
    Case(
        "oxygen-vision-list",
        "openpi",
        edit("oxygen_config.json", put(vision=[1])),
        "oxygen_config.json",
        "'vision' must be an object, got a list [1]",
    ),
    Case(
        "oxygen-vision-null",
        "openpi",
        edit("oxygen_config.json", put(vision=None)),
        "oxygen_config.json",
        "'vision' must be an object, got null",
    ),
    Case(
        "oxygen-string-for-int",
        "lerobot",
        edit("oxygen_config.json", put(action_horizon="10")),
        "oxygen_config.json",
        "'action_horizon' must be an int, got a string '10'",
    ),
    Case(
        "oxygen-horizon-1e9",
        "openpi",
        edit("oxygen_config.json", put(action_horizon=10**9)),
        "oxygen_config.json",
        "action_horizon=1000000000 is out of range: must be an int in [1, 1000] (π0.5: 50)",
    ),
    Case(
        "oxygen-partial-horizon-1e9",
        "openpi",
        text("oxygen_config.json", '{"action_horizon": 1000000000}'),
        "oxygen_config.json",
        "action_horizon=1000000000 is out of range",
    ),
    Case(
        "oxygen-partial-eps-string",
        "lerobot",
        text("oxygen_config.json", '{"vision": {"layer_norm_eps": "x"}}'),
        "oxygen_config.json",
        "'layer_norm_eps' must be a finite number, got a string 'x'",
    ),
    Case(
        "oxygen-image-slots-string",
        "openpi",
        edit("oxygen_config.json", put(image_slots="abc")),
        "oxygen_config.json",
        "'image_slots' must be a list",
    ),
    Case(
        "oxygen-image-slot-int",
        "openpi",
        edit("oxygen_config.json", put(image_slots=[1])),
        "oxygen_config.json",
        "'image_slots[0]' must be a string",
    ),
    Case(
        "oxygen-name-int",
        "openpi",
        edit("oxygen_config.json", put(name=3)),
        "oxygen_config.json",
        "'name' must be a string",
    ),
    Case(
        "oxygen-width-huge",
        "openpi",
        edit("oxygen_config.json", lambda d: d["vlm"].update(width=10**7)),
        "oxygen_config.json",
        "vlm.width=10000000 is out of range",
    ),
    Case(
        "oxygen-image-size-huge",
        "openpi",
        edit("oxygen_config.json", lambda d: d["vision"].update(image_size=14 * 1000, patch_size=14)),
        "oxygen_config.json",
        "vision.image_size=14000 is out of range",
    ),
    Case(
        "oxygen-too-many-image-tokens",
        "openpi",
        edit("oxygen_config.json", lambda d: d["vision"].update(image_size=1022, patch_size=14)),
        "oxygen_config.json",
        "at most 4096 image tokens per slot",
    ),
    Case(
        "oxygen-deep",
        "openpi",
        edit("oxygen_config.json", put(action_horizon=nested(100))),
        "oxygen_config.json",
        "nested more than 32",
    ),
    Case("oxygen-huge", "openpi", huge("oxygen_config.json", 20 * MiB), "oxygen_config.json", "larger than"),
    # openpi norm stats
    Case("norm-not-json", "openpi", text(NS, "nope"), NS, "not a readable JSON file"),
    Case("norm-list", "openpi", text(NS, "[]"), NS, "must hold a JSON object"),
    Case("norm-entries-list", "openpi", text(NS, '{"norm_stats": []}'), NS, "'norm_stats' must be an object"),
    Case(
        "norm-state-list",
        "openpi",
        edit(NS, lambda d: d["norm_stats"].update(state=[1])),
        NS,
        "'state' must be an object",
    ),
    Case(
        "norm-q01-string",
        "openpi",
        edit(NS, lambda d: d["norm_stats"]["state"].update(q01="ab")),
        NS,
        "'q01' must be a list",
    ),
    Case(
        "norm-q01-item-string",
        "openpi",
        edit(NS, lambda d: d["norm_stats"]["actions"].update(q01=["1"] * 3)),
        NS,
        "'q01[0]' must be a finite number, got a string '1'",
    ),
    Case(
        "norm-nan",
        "openpi",
        text(NS, '{"norm_stats": {"state": {"q01": [NaN], "q99": [1]}}}'),
        NS,
        "'q01[0]' must be a finite number",
    ),
    Case(
        "norm-q01-above-q99",
        "openpi",
        edit(NS, lambda d: d["norm_stats"]["state"].update(q01=[5.0] * 3, q99=[1.0] * 3)),
        NS,
        "q01[0] = 5.0 is above q99[0] = 1.0",
    ),
    Case(
        "norm-lengths-differ",
        "openpi",
        edit(NS, lambda d: d["norm_stats"]["state"].update(q01=[0.0])),
        NS,
        "1-D of one length",
    ),
    Case("norm-symlink-out", "openpi", link_outside_stats, NS, "outside the checkpoint folder"),
    Case(
        "norm-fifo", "openpi", then(lambda f: (f / NS).unlink(), lambda f: os.mkfifo(f / NS)), NS, "not a regular file"
    ),  # reading it would block configure forever
    # LeRobot processor pipelines and their state files
    Case("pre-not-json", "lerobot", text(PRE, "x"), PRE, "not a readable JSON file"),
    Case("pre-steps-string", "lerobot", edit(PRE, put(steps="abc")), PRE, "'steps' must be a list"),
    Case("pre-step-list", "lerobot", edit(PRE, put(steps=[[1]])), PRE, "steps[0]: must be an object"),
    Case(
        "pre-registry-int",
        "lerobot",
        edit(PRE, lambda d: d["steps"][2].update(registry_name=5)),
        PRE,
        "steps[2]: 'registry_name' must be a string",
    ),
    Case(
        "pre-config-list",
        "lerobot",
        edit(PRE, lambda d: d["steps"][2].update(config=[])),
        PRE,
        "steps[2]: 'config' must be an object",
    ),
    Case(
        "pre-state-file-absolute",
        "lerobot",
        edit(PRE, lambda d: d["steps"][2].update(state_file="/etc/passwd")),
        PRE,
        "steps[2].state_file: '/etc/passwd' is an absolute path",
    ),
    Case(
        "pre-state-file-dotdot",
        "lerobot",
        edit(PRE, lambda d: d["steps"][2].update(state_file="../x/" + PRE_ST)),
        PRE,
        "outside the checkpoint folder",
    ),
    Case(
        "pre-state-file-int",
        "lerobot",
        edit(PRE, lambda d: d["steps"][2].update(state_file=7)),
        PRE,
        "steps[2].state_file: 7 is not a file name",
    ),
    Case("post-not-json", "lerobot", text(POST, "[1"), POST, "not a readable JSON file"),
    Case("pre-stats-truncated", "lerobot", raw(PRE_ST, lambda b: b[:60]), PRE_ST, "not a readable safetensors file"),
    Case(
        "pre-stats-header",
        "lerobot",
        raw(PRE_ST, b"\x20\x00\x00\x00\x00\x00\x00\x00{garbage" + b" " * 40),
        PRE_ST,
        "not a readable safetensors file",
    ),
    Case(
        "pre-stats-int8",
        "lerobot",
        tensors(PRE_ST, retype("observation.state.q01", torch.int8)),
        PRE_ST,
        "observation.state.q01 is I8 [3]",
    ),
    Case(
        "pre-stats-2d",
        "lerobot",
        tensors(PRE_ST, lambda sd: sd.update({"observation.state.q99": torch.ones(2, 3)})),
        PRE_ST,
        "observation.state.q99 is F32 [2, 3]",
    ),
    Case(
        "pre-stats-nan",
        "lerobot",
        tensors(PRE_ST, lambda sd: sd["observation.state.std"].fill_(float("nan"))),
        PRE_ST,
        "std[0] = nan is not finite",
    ),
    Case("post-stats-truncated", "lerobot", raw(POST_ST, lambda b: b[:-5]), POST_ST, "not a readable safetensors"),
    # tokenizer files
    Case("tokenizer-not-json", "openpi", text("tokenizer.json", "{nope"), "tokenizer.json", "not a usable tokenizer"),
    Case("tokenizer-list", "lerobot", text("tokenizer.json", "[]"), "tokenizer.json", "not a usable tokenizer"),
    Case(
        "tokenizer-no-added-tokens",
        "openpi",
        edit("tokenizer.json", lambda d: d.pop("added_tokens") and None),
        "tokenizer.json",
        "added_tokens",
    ),
    Case("tokenizer-huge", "openpi", huge("tokenizer.json", 65 * MiB), "tokenizer.json", "larger than the 64 MiB"),
    Case(
        "tokenizer-config-list",
        "openpi",
        text("tokenizer_config.json", "[]"),
        "tokenizer_config.json",
        "must hold a JSON object",
    ),
    Case(
        "tokenizer-config-file-outside",
        "openpi",
        edit("tokenizer_config.json", put(tokenizer_file="/etc/passwd")),
        "tokenizer_config.json",
        "tokenizer_file: '/etc/passwd' is an absolute path",
    ),
    Case(
        "special-tokens-map-not-json",
        "openpi",
        text("special_tokens_map.json", "{"),
        "special_tokens_map.json",
        "not a readable JSON file",
    ),
    Case(
        "sentencepiece-garbage",
        "openpi",
        then(lambda f: (f / "tokenizer.json").unlink(), raw("tokenizer.model", b"garbage")),
        "tokenizer.model",
        "not a usable tokenizer",
    ),
    Case(
        "tokenizer-bigger-than-vocab",
        "openpi",
        lambda f: build_tokenizer(1024).save_pretrained(str(f)),
        "tokenizer.json",
        "the tokenizer has 1024 ids but the model embeds only 512",
    ),
    # weights
    Case("weights-truncated", "openpi", raw(W, lambda b: b[:-100]), W, "not a readable safetensors file"),
    Case("weights-empty", "lerobot", raw(W, b""), W, "not a readable safetensors file"),
    Case(
        "weights-header-garbage",
        "openpi",
        raw(W, lambda b: b[:8] + b"#" * 40 + b[48:]),
        W,
        "not a readable safetensors file",
    ),
    Case("weights-header-huge", "openpi", raw(W, (2**60).to_bytes(8, "little") + b"{}"), W, "header too large"),
    Case(
        "weights-int8",
        "openpi",
        tensors(W, retype("action_in_proj.weight", torch.int8)),
        W,
        "tensor action_in_proj.weight has dtype I8",
    ),
    Case(
        "weights-bool",
        "lerobot",
        tensors(W, retype("model.time_mlp_in.bias", torch.bool)),
        W,
        "tensor model.time_mlp_in.bias has dtype BOOL",
    ),
    Case(
        "weights-float8",
        "openpi",
        tensors(W, retype("time_mlp_out.weight", torch.float8_e4m3fn)),
        W,
        "tensor time_mlp_out.weight has dtype F8_E4M3",
    ),
    Case(
        "weights-wrong-shape",
        "openpi",
        tensors(W, lambda sd: sd.update({"action_in_proj.weight": torch.zeros(32, 16)})),
        W,
        "action_in_proj.weight: file [32, 16] vs model [32, 32]",
    ),
    Case(
        "weights-foreign-keys",
        "openpi",
        lambda f: save_file({"encoder.weight": torch.zeros(2)}, str(f / W)),
        W,
        "neither openpi",
    ),
    Case(
        "weights-nan",
        "openpi",
        tensors(W, set_value("action_out_proj.weight", float("nan"))),
        W,
        "tensor action_out_proj.weight holds 1 non-finite value(s)",
    ),
    Case(
        "weights-inf",
        "lerobot",
        tensors(W, set_value("model.time_mlp_out.weight", float("-inf"))),
        W,
        "tensor model.time_mlp_out.weight holds 1 non-finite value(s)",
    ),
    # a sharded checkpoint's index
    Case("index-not-json", "openpi", then(sharded(), text(IDX, "{")), IDX, "not a readable JSON file"),
    Case("index-list", "openpi", then(sharded(), text(IDX, "[]")), IDX, "must hold a JSON object"),
    Case(
        "index-weight-map-list",
        "openpi",
        then(sharded(), text(IDX, '{"weight_map": [1]}')),
        IDX,
        "'weight_map' must be an object, got a list",
    ),
    Case("index-no-weight-map", "openpi", then(sharded(), text(IDX, '{"metadata": {}}')), IDX, "no 'weight_map'"),
    Case("index-entry-int", "openpi", sharded(3), IDX, "weight_map['action_in_proj.bias']: 3 is not a file name"),
    Case(
        "index-absolute",
        "openpi",
        sharded("/etc/passwd"),
        IDX,
        "weight_map['action_in_proj.bias']: '/etc/passwd' is an absolute path",
    ),
    Case("index-dotdot", "openpi", lambda f: sharded(f"../{outside(f).name}")(f), IDX, "outside the checkpoint folder"),
    Case(
        "index-symlink-out",
        "lerobot",
        lambda f: sharded("linked.safetensors", outside(f))(f),
        IDX,
        "'linked.safetensors' resolves to",
    ),
    Case(
        "index-missing-shard",
        "openpi",
        sharded("model-00009.safetensors"),
        IDX,
        "names missing shard files ['model-00009.safetensors']",
    ),
    Case(
        "index-shard-not-safetensors",
        "openpi",
        sharded("config.json"),
        "config.json",
        "not a readable safetensors file",
    ),
]


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    """One valid checkpoint per layout (pi05-tiny, 3-dim stats, the built-in tokenizer)."""
    root = tmp_path_factory.mktemp("bases")
    model = random_pretrained(TINY, seed=11)
    stats = {"state": NormStats.identity(3), "actions": NormStats.identity(3)}
    tok = build_tokenizer(TINY.vocab_size)
    out = {
        layout: save_pretrained(model, root / layout, stats, layout=layout, tokenizer=tok)
        for layout in ("openpi", "lerobot")
    }
    for folder in out.values():
        Pi05Policy.from_pretrained(folder, device="cpu")  # the control: each base loads
    return out


def test_the_table_is_unique_and_covers_every_file():
    assert len({c.id for c in CASES}) == len(CASES)
    files = {c.file for c in CASES}
    assert {
        "config.json",
        "oxygen_config.json",
        NS,
        PRE,
        POST,
        PRE_ST,
        POST_ST,
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        W,
        IDX,
    } <= files


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_malformed_checkpoint_refused_naming_the_file(case: Case, bases, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(bases[case.layout], folder)
    shutil.copy(bases[case.layout] / W, outside(folder))  # a valid weight file outside the folder
    case.mutate(folder)
    with pytest.raises(CheckpointError) as e:
        Pi05Policy.from_pretrained(folder, device="cpu")
    msg = str(e.value)
    assert str(folder / case.file) in msg, msg
    assert case.says in msg, msg
    assert len(msg) < 700, msg  # values are cut short, never echoed whole


def test_checkpoint_error_is_a_value_error():
    assert issubclass(CheckpointError, ValueError)


def test_float16_overflow_is_refused(bases, tmp_path):
    folder = shutil.copytree(bases["openpi"], tmp_path / "ckpt")
    tensors(W, set_value("action_in_proj.weight", 1e6))(folder)
    with pytest.raises(
        CheckpointError,
        match=r"action_in_proj\.weight overflows to ±inf in 1 value\(s\) when "
        r"converted to torch\.float16 \(largest \|value\| 1e\+06\)",
    ):
        load_pretrained(folder, dtype=torch.float16)
    load_pretrained(folder)  # finite in float32


def test_action_convention_fields_are_type_checked(bases, tmp_path):
    folder = shutil.copytree(bases["lerobot"], tmp_path / "ckpt")
    raw, steps = action_convention_files(folder)
    assert raw["type"] == "pi05" and steps[2]["registry_name"] == "normalizer_processor"
    edit("config.json", put(use_relative_actions="false"))(folder)  # truthy if read as bool("false")
    with pytest.raises(CheckpointError, match=r"config\.json: 'use_relative_actions' must be true or false"):
        action_convention_files(folder)
    edit("config.json", put(use_relative_actions=False, relative_exclude_joints="gripper"))(folder)
    with pytest.raises(CheckpointError, match=r"'relative_exclude_joints' must be a list or null"):
        action_convention_files(folder)
    edit("config.json", put(relative_exclude_joints=None))(folder)
    edit(
        PRE,
        lambda d: d["steps"].append(
            {"registry_name": "relative_actions_processor", "config": {"enabled": 1, "exclude_joints": ["gripper"]}}
        ),
    )(folder)
    with pytest.raises(CheckpointError, match=r"policy_preprocessor\.json steps\[6\]\.config: 'enabled' must be"):
        action_convention_files(folder)


def test_bounds_hold_the_presets_and_refuse_just_outside():
    for name in PRESETS:
        cc.check_bounds(get_preset(name), name)
    full = get_preset("pi05")
    for path, (lo, hi, ref) in cc.BOUNDS.items():
        assert lo <= ref <= hi, path
        value = full
        for part in path.split("."):
            value = getattr(value, part)
        assert value == ref, path  # the documented π0.5 value is the preset's
    cc.check_bounds(full.replace(action_horizon=1000), "edge")
    with pytest.raises(
        CheckpointError, match=r"src: action_horizon=1001 is out of range: must be an int in \[1, 1000\]"
    ):
        cc.check_bounds(full.replace(action_horizon=1001), "src")


def test_the_bounds_table_of_the_docs_is_the_code():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "checkpoint.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in doc.splitlines() if line.startswith("  | `")}
    for path, (lo, hi, _ref) in cc.BOUNDS.items():
        row = next((r for names, r in rows.items() if f"`{path}`" in names.split(", ")), None)
        assert row is not None, path
        fmt = str if isinstance(lo, int) else (lambda v: f"{v:g}")
        assert f"| {fmt(lo)} – {fmt(hi)} |" in row, (path, row)
