"""Admission in the engine: no head-of-line waits (a small request overtakes a large one that does
not fit yet and finishes while it waits; the large one runs later), an impossible request is
rejected at submission with its reason, a request waiting too long expires with a reason."""

import time

import pytest
from engine_inputs import make_obs

from oxygen_ros.core.config import EngineConfig, TaskConfig
from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.engine.requests import RequestStatus
from oxygen_ros.core.policy import Pi05Policy

TASKS = (TaskConfig("conversation", "{text}", max_new_tokens=80),)


@pytest.fixture(scope="module")
def policy():
    return Pi05Policy.from_pretrained("pi05-tiny", device="cpu")


@pytest.fixture
def no_eos(policy, monkeypatch):
    """The policy with EOS ignored (as the bench does): every request emits exactly its budget, so
    whether a request is still running does not hang on what the random weights happen to sample."""
    monkeypatch.setattr(policy, "eos_id", -1)
    return policy


def engine(policy, **kw):
    p = -(-policy.cfg.max_prefix_len // 16)
    assert p == 7
    return Engine(policy, EngineConfig(tasks=TASKS, kv_blocks=25, tokens_per_frame=4, max_running_requests=8, **kw))


def test_small_request_finishes_while_the_large_one_waits(no_eos):
    eng = engine(no_eos, max_queue_wait_s=0.0)  # no age bound: the large one must get its turn
    assert eng.scheduler.usable_blocks == 11
    eng.submit_observation(make_obs(0))
    first = eng.submit_request("conversation", "a", 70)  # 5 blocks
    eng.step()
    assert eng.running == 1
    eng.submit_observation(make_obs(1))
    large = eng.submit_request("conversation", "b", 90)  # 6 blocks: fits the pool, not next to the first
    small = eng.submit_request("conversation", "c", 4)  # 1 block
    r = eng.step()
    ended = {e.id: e for e in r.ended}
    assert first not in ended and eng.running >= 1  # the first holds its 5 blocks for 70 tokens
    assert small in ended and ended[small].status == RequestStatus.FINISHED
    assert eng.queued == 1 and large not in ended  # the large one waits, it was overtaken once
    for f in range(2, 60):
        eng.submit_observation(make_obs(f))
        r = eng.step()
        eng.check_invariants()
        ended.update({e.id: e for e in r.ended})
        if large in ended:
            break
    assert ended[large].status == RequestStatus.FINISHED and ended[large].frame_id > ended[first].frame_id
    assert eng.pool.blocks.num_in_use == 0


def test_impossible_request_rejected_at_submission_without_blocking_others(policy):
    eng = engine(policy)
    huge = eng.submit_request("conversation", "tell me everything", 500)  # 32 blocks > 11 usable
    ok = eng.submit_request("conversation", "hi", 4)
    eng.submit_observation(make_obs(0))
    r = eng.step()
    ended = {e.id: e for e in r.ended}
    assert ended[huge].status == RequestStatus.REJECTED
    assert ended[huge].reason.startswith("request needs 32 KV blocks but at most 18 fit beside the action path")
    assert "raise kv_blocks" in ended[huge].reason and ended[huge].frame_id == -1  # never admitted
    assert ok in ended or eng.running == 1
    assert eng.queued == 0


def test_over_long_prompt_never_fitting_is_rejected_on_its_first_attempt(policy):
    eng = engine(policy)
    rid = eng.submit_request("conversation", "word " * 80, 4)  # the budget fits, the prompt never does
    eng.submit_observation(make_obs(0))
    (e,) = eng.step().ended
    assert e.id == rid and e.status == RequestStatus.REJECTED and "KV blocks" in e.reason


def test_queued_request_expires_with_a_reason(no_eos):
    eng = engine(no_eos, max_queue_wait_s=0.3)
    eng.submit_observation(make_obs(0))
    eng.submit_request("conversation", "a", 70)
    eng.step()
    eng.submit_observation(make_obs(1))
    large = eng.submit_request("conversation", "b", 90)
    eng.step()
    assert eng.running == 1 and eng.queued == 1  # the first still holds its blocks: the large one waits
    time.sleep(0.35)
    eng.submit_observation(make_obs(2))
    ended = {e.id: e for e in eng.step().ended}
    assert ended[large].status == RequestStatus.REJECTED and ended[large].reason.startswith("expired: waited")
    assert "max_queue_wait_s = 0.3" in ended[large].reason and eng.queued == 0


def test_an_over_long_ask_is_rejected_before_it_is_formatted_or_tokenized(policy, monkeypatch):
    """A 10 MB ask costs its length check only: the tokenizer never sees it, and the request still
    ends — rejected, with the cap and its parameter named."""
    calls = []
    monkeypatch.setattr(policy.prompt, "tokenize_continuation", lambda text: calls.append(len(text)) or [])
    eng = engine(policy, max_request_chars=100)
    rid = eng.submit_request("conversation", "x" * 10_000_000, 4)
    assert calls == []
    eng.submit_observation(make_obs(0))
    (e,) = eng.step().ended
    assert e.id == rid and e.status == RequestStatus.REJECTED
    assert e.reason == ("the ask has 10000000 characters; at most 100 are accepted (engine.max_request_chars)")
    eng.check_invariants()


def test_the_prompt_is_tokenized_in_the_submitting_thread_never_in_the_stepping_one(policy, monkeypatch):
    """As the node submits asks: with the instruction in force given, the prompt is built at once."""
    import threading

    seen = []
    original = policy.prompt.tokenize_continuation
    monkeypatch.setattr(
        policy.prompt, "tokenize_continuation", lambda text: seen.append(threading.get_ident()) or original(text)
    )
    eng = engine(policy)
    asker = threading.Thread(
        target=lambda: eng.submit_request("conversation", "what do you see?", 4, instruction="pick up the cube")
    )
    asker.start()
    asker.join()
    eng.submit_observation(make_obs(0))
    eng.step()
    assert seen == [asker.ident]
