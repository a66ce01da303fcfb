"""External parity: the project against LeRobot 0.6.1's own π0.5 on a tiny LeRobot checkpoint.

The reference (``test/data/parity/``, see its README) was produced by ``lerobot.policies.pi05``;
these tests load ``tiny_lerobot_pi05/`` through the public path (``Pi05Policy.from_pretrained``
and the :class:`Engine`) and compare with LeRobot's outputs. The checkpoint's ``config.json`` names
``gemma_2b`` / ``gemma_300m`` while its tensors are tiny, so the loader takes the sizes from the
tensor shapes; the SigLIP head count is the one thing shapes cannot tell, and the test adds it the
way the loader's error message says (a partial ``oxygen_config.json``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from oxygen_ros.core.config import EngineConfig
from oxygen_ros.core.engine import engine as engine_mod
from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.model.keymap import CheckpointError
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.types import Observation

DATA = Path(__file__).resolve().parents[1] / "data" / "parity"
CKPT = DATA / "tiny_lerobot_pi05"
CAMS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
TASK = "pick up the red cube"
ATOL = 1e-4


@pytest.fixture(scope="module")
def ref():
    return np.load(DATA / "reference.npz")


@pytest.fixture(scope="module")
def meta():
    return json.loads((DATA / "reference.json").read_text())


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The reference checkpoint as a user would have it, plus the one line the loader asks for."""
    dst = tmp_path_factory.mktemp("ckpt") / "tiny_lerobot_pi05"
    shutil.copytree(CKPT, dst)
    dims = json.loads((CKPT / "tiny_model_dims.json").read_text())
    (dst / "oxygen_config.json").write_text(
        json.dumps({"vision": {"num_heads": dims["vision"]["num_attention_heads"]}})
    )
    return dst


@pytest.fixture(scope="module")
def policy(folder) -> Pi05Policy:
    return Pi05Policy.from_pretrained(folder, device="cpu")


def observation(ref, case: str) -> Observation:
    images = {c: ref["images_u8"][i] for i, c in enumerate(CAMS)}
    if case == "rwm":
        del images["right_wrist_0_rgb"]
    return Observation(images=images, state=ref["state"].copy(), instruction=TASK, stamp=1.0)


def test_loader_names_the_one_missing_dimension():
    with pytest.raises(CheckpointError) as e:
        Pi05Policy.from_pretrained(CKPT, device="cpu")
    msg = str(e.value)
    assert "vision.num_heads" in msg and "oxygen_config.json" in msg and '{"vision": {"num_heads": N}}' in msg
    assert len(msg) < 500  # a short, exact message, not a dump of every key


def test_dimensions_from_tensor_shapes(policy, meta):
    real = meta["checkpoint"]["real_dims"]
    cfg = policy.cfg
    for own, key in (("vlm", "vlm"), ("expert", "expert")):
        for f in ("width", "depth", "mlp_dim", "num_heads", "num_kv_heads", "head_dim"):
            assert getattr(getattr(cfg, own), f) == real[key][f], (own, f)
    v = real["vision"]
    assert (
        cfg.vision.hidden_size,
        cfg.vision.num_layers,
        cfg.vision.num_heads,
        cfg.vision.intermediate_size,
        cfg.vision.patch_size,
        cfg.vision.image_size,
    ) == (
        v["hidden_size"],
        v["num_hidden_layers"],
        v["num_attention_heads"],
        v["intermediate_size"],
        v["patch_size"],
        v["image_size"],
    )
    assert cfg.vocab_size == real["vocab_size"] and cfg.action_horizon == 10 and cfg.max_token_len == 48


@pytest.mark.parametrize("case", ["all", "rwm"])
def test_prompt_ids_exact(policy, ref, meta, case):
    enc = policy.encode_observation(observation(ref, case))
    assert enc.tokens[0].tolist() == ref[f"{case}_lang_tokens"][0].tolist()
    assert enc.token_masks[0].tolist() == ref[f"{case}_lang_mask"][0].tolist()
    assert enc.image_masks[0].tolist() == ref[f"{case}_img_masks"][0].tolist()
    assert enc.tokens[0, :30].tolist() == meta["cases"][case]["lang_token_ids"]
    assert enc.prefix_len == meta["cases"][case]["n_prefix_valid"]


@pytest.mark.parametrize("case", ["all", "rwm"])
def test_actions_policy_path(policy, ref, case):
    noise = torch.from_numpy(ref["noise"])
    enc = policy.encode_observation(observation(ref, case))
    cache, _ = policy.prefill(enc)
    x = policy.sample_actions_normalized(cache, noise)
    np.testing.assert_allclose(x.numpy(), ref[f"{case}_actions"], atol=ATOL, rtol=0)
    robot = policy.sample_actions(observation(ref, case), noise=noise)
    assert robot.shape == (10, 14)
    np.testing.assert_allclose(robot, ref[f"{case}_actions_postprocessed"][0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", ["all", "rwm"])
def test_actions_engine_path(policy, ref, case, monkeypatch):
    noise = torch.from_numpy(ref["noise"])
    monkeypatch.setattr(engine_mod, "frame_noise", lambda *a, **k: noise.clone())
    eng = Engine(policy, EngineConfig(tasks=()))
    eng.submit_observation(observation(ref, case))
    res = eng.step()
    assert res.error is None and res.action is not None
    np.testing.assert_allclose(res.action.actions, ref[f"{case}_actions_postprocessed"][0], atol=ATOL, rtol=0)
    eng.check_invariants()


# ------------------------------------------------------------------ subtask-style decode (item 6c)
class LogitTap:
    """Records every LM-head output of the model (``Pi05Model.logits``: the prefix's last token
    and every decode step go through it), in order."""

    def __init__(self, model, monkeypatch) -> None:
        self.rows: list[np.ndarray] = []
        logits = model.logits

        def tap(*a, **k):
            out = logits(*a, **k)
            self.rows.append(out.detach().float().cpu().numpy().reshape(-1, out.shape[-1]))
            return out

        monkeypatch.setattr(model, "logits", tap)


def subtask_prompt(meta) -> str:
    prompt = meta["inputs"]["decode_prompt"]
    assert prompt == f"Task: {TASK}. Subtask: "
    return prompt


@pytest.mark.parametrize("case", ["all", "rwm"])
def test_subtask_decode_policy_path(policy, ref, meta, case, monkeypatch):
    tap = LogitTap(policy.model, monkeypatch)
    gen = policy.generate_text(observation(ref, case), subtask_prompt(meta), max_new_tokens=12, own_prefix=True)
    assert gen.token_ids == ref[f"{case}_decode_tokens"].tolist()
    np.testing.assert_allclose(np.concatenate(tap.rows)[:12], ref[f"{case}_decode_logits"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", ["all", "rwm"])
def test_subtask_decode_engine_path(policy, ref, meta, case, monkeypatch):
    from oxygen_ros.core.config import TaskConfig

    task = TaskConfig(name="subtask", template="Task: {instruction}. Subtask: ", max_new_tokens=12, own_prefix=True)
    eng = Engine(policy, EngineConfig(tasks=(task,), tokens_per_frame=4))
    tap = LogitTap(policy.model, monkeypatch)
    rid = eng.submit_request("subtask")
    eng.submit_observation(observation(ref, case))
    ended, frames = [], 0
    while not ended and frames < 10:
        res = eng.step()
        frames += 1
        eng.check_invariants()
        ended = [r for r in res.ended if r.id == rid]
    assert ended and ended[0].token_ids == ref[f"{case}_decode_tokens"].tolist()
    assert frames == 3  # 12 tokens at k = 4 per frame: cross-frame decoding of its own prefix
    assert len(tap.rows) == 12  # one LM-head row per token: the prefix's last token, then 11 steps
    np.testing.assert_allclose(np.concatenate(tap.rows), ref[f"{case}_decode_logits"], atol=ATOL, rtol=0)
    assert eng.pool.blocks.num_in_use == 0  # the request's own prefix was released with it


def test_default_continuation_differs_from_the_subtask_reference(policy, ref, meta):
    """The default (shared prefix, prompt continued causally) is another computation: it must not
    be mistaken for π0.5's subtask decode."""
    gen = policy.generate_text(observation(ref, "all"), subtask_prompt(meta), max_new_tokens=12)
    assert gen.token_ids != ref["all_decode_tokens"].tolist()
