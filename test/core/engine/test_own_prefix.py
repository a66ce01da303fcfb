"""Own-prefix (π0.5 subtask-style) language tasks next to shared-prefix ones in every engine mode:
tokens equal the single-request policy reference, the action chunk is untouched, and every block of
the private prefixes is released with its request."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.core.config import EngineConfig, TaskConfig
from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.model.sampling import SamplingParams
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.types import Observation

TASKS = (
    TaskConfig(name="conversation", template="Question: {text}\nAnswer: ", max_new_tokens=7),
    TaskConfig(name="subtask", template="Task: {instruction}. Subtask: ", max_new_tokens=9, own_prefix=True),
)


@pytest.fixture(scope="module")
def policy():
    return Pi05Policy.from_pretrained("pi05-tiny", device="cpu")


def obs(i: int) -> Observation:
    rng = np.random.default_rng(7 + i)
    return Observation(
        images={
            "base_0_rgb": rng.integers(0, 256, (30, 40, 3), dtype=np.uint8),
            "left_wrist_0_rgb": None,
            "right_wrist_0_rgb": rng.integers(0, 256, (30, 40, 3), dtype=np.uint8),
        },
        state=rng.uniform(-1, 1, 14).astype(np.float32),
        instruction="stack the blocks",
        stamp=float(i),
    )


@pytest.mark.parametrize("mode", ["unified", "shared_kv", "isolated"])
def test_own_prefix_next_to_shared_prefix(policy, mode):
    # sampled, so that the counter-based sampling of both paths is compared too
    hot = SamplingParams(temperature=1.0, top_k=0, seed=5)
    prompt = "Task: stack the blocks. Subtask: "
    ref_sub = policy.generate_text(obs(0), prompt, 9, greedy=False, sampling=hot, own_prefix=True).token_ids
    ref_conv = policy.generate_text(obs(0), "Question: hi\nAnswer: ", 7).token_ids
    plain = Engine(policy, EngineConfig(mode=mode, tasks=TASKS, tokens_per_frame=2))
    eng = Engine(policy, EngineConfig(mode=mode, tasks=TASKS, tokens_per_frame=2))
    sub, conv = eng.submit_request("subtask", temperature=1.0, seed=5), eng.submit_request("conversation", "hi")
    done: dict[int, list[int]] = {}
    for i in range(8):
        eng.submit_observation(obs(i))
        plain.submit_observation(obs(i))
        res, alone = eng.step(), plain.step()
        np.testing.assert_array_equal(res.action.actions, alone.action.actions)  # the action path is unchanged
        eng.check_invariants()
        done.update({r.id: r.token_ids for r in res.ended})
    assert done[sub] == ref_sub and done[conv] == ref_conv
    assert eng.pool.blocks.num_in_use == 0


def test_own_prefix_prompt_too_long_is_rejected_with_a_reason(policy):
    long = TaskConfig(name="subtask", template="Task: {instruction}. Subtask: " + "very " * 80, own_prefix=True)
    eng = Engine(policy, EngineConfig(tasks=(long,)))
    rid = eng.submit_request("subtask")
    eng.submit_observation(obs(0))
    res = eng.step()
    ended = {r.id: r for r in res.ended}
    assert res.action is not None and rid in ended and "task prompt is" in ended[rid].reason
    eng.check_invariants()
