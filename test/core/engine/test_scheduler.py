"""Scheduler and admission: never-fits rejection, overtaking with aging, queue length/age bounds,
running cap, decode budget (pure Python)."""

from oxygen_ros.core.cache.block_pool import BlockPool
from oxygen_ros.core.config import EngineConfig
from oxygen_ros.core.engine.requests import LanguageRequest, RequestStatus
from oxygen_ros.core.engine.scheduler import Scheduler, StepCostModel


def _req(i, prompt=3, max_new=10):
    r = LanguageRequest(id=i, task="conversation", text="", max_new_tokens=max_new)
    r.prompt_ids = list(range(prompt))
    return r


def _sched(cfg, pool, max_prefix_tokens):
    return Scheduler(pool, max_prefix_tokens, cfg.max_running_requests)


def test_admits_while_reserve_kept_and_rejects_impossible():
    pool = BlockPool(24, 4)
    cfg = EngineConfig(max_running_requests=8)
    s = _sched(cfg, pool, max_prefix_tokens=16)  # reserve 4 blocks
    assert s.usable_blocks == 16  # 24 - this frame's prefix - the next frame's reserve
    pool.allocate(4)  # this frame's prefix
    for i, n in enumerate([5, 5, 60]):
        s.enqueue(cfg, _req(i, prompt=3, max_new=n))  # 2, 2, 16 blocks
    admitted, rejected = s.admit(cfg, prefix_tokens=16)
    assert [r.id for r in admitted] == [0, 1]
    assert rejected == [] and [r.id for r in s.queue] == [2]  # 16 blocks fit beside the action path, not now
    huge = _req(9, max_new=100)
    s.queue.appendleft(huge)
    admitted, rejected = s.admit(cfg, prefix_tokens=16)
    assert rejected == [huge] and huge.status == RequestStatus.REJECTED
    assert "needs 26 KV blocks" in huge.reason and "at most 16 fit" in huge.reason
    assert s.capacity(4) == 19  # beside a 1-block prefix


def test_never_fits_beside_the_kept_prefix_is_rejected_not_queued():
    # the head-of-line case: fits "pool minus reserve" but never next to the frame's prefix
    pool = BlockPool(20, 4)
    cfg = EngineConfig()
    s = _sched(cfg, pool, max_prefix_tokens=16)
    pool.allocate(4)
    r = _req(0, prompt=3, max_new=57)  # 15 blocks: <= 20 - 4, > 20 - 4 - 4
    s.enqueue(cfg, r)
    admitted, rejected = s.admit(cfg, prefix_tokens=16)
    assert admitted == [] and rejected == [r] and not s.queue
    assert s.submission_check(cfg, _req(1, max_new=70)) is not None  # budget alone too large: at submission
    assert s.submission_check(cfg, _req(2, max_new=40)) is None


def test_small_requests_overtake_a_large_one_until_it_ages():
    pool = BlockPool(30, 4)
    cfg = EngineConfig(max_overtakes=2, max_running_requests=8)
    s = _sched(cfg, pool, max_prefix_tokens=16)  # reserve 4, capacity 22
    pool.allocate(4)
    held = pool.allocate(10)  # running requests' blocks
    big = _req(0, prompt=0, max_new=64)  # 16 blocks: fits the pool, not now (free 16 - 16 < reserve)
    s.enqueue(cfg, big)
    for i in range(1, 4):
        s.enqueue(cfg, _req(i, prompt=0, max_new=4))  # 1 block each
    admitted, _ = s.admit(cfg, 16)
    assert [r.id for r in admitted] == [1, 2, 3] and list(s.queue) == [big] and big.overtaken == 3
    s.enqueue(cfg, _req(4, prompt=0, max_new=4))
    admitted, _ = s.admit(cfg, 16)
    assert admitted == [] and [r.id for r in s.queue] == [0, 4]  # aged: the big one holds the queue
    pool.free(held)
    admitted, _ = s.admit(cfg, 16)
    assert [r.id for r in admitted] == [0, 4]


def test_strict_fifo_with_no_overtakes():
    pool = BlockPool(30, 4)
    cfg = EngineConfig(max_overtakes=0, max_running_requests=8)
    s = _sched(cfg, pool, max_prefix_tokens=16)
    pool.allocate(14)
    s.enqueue(cfg, _req(0, prompt=0, max_new=64))
    s.enqueue(cfg, _req(1, prompt=0, max_new=4))
    assert s.admit(cfg, 16)[0] == []


def test_expired_requests_leave_the_queue_with_a_reason():
    cfg = EngineConfig(max_queue_wait_s=2.0)
    s = _sched(cfg, BlockPool(40, 4), 4)
    old, young = _req(0), _req(1)
    old.t_submit, young.t_submit = 10.0, 11.5
    s.enqueue(cfg, old)
    s.enqueue(cfg, young)
    gone = s.expire(cfg, now=12.5)
    assert gone == [old] and list(s.queue) == [young]
    assert old.status == RequestStatus.REJECTED and old.reason.startswith("expired: waited 2.5 s")
    never = EngineConfig(max_queue_wait_s=0.0)
    assert _sched(never, BlockPool(40, 4), 4).expire(never, 1e9) == []


def test_fifo_blocks_later_requests_and_running_cap():
    pool = BlockPool(40, 4)
    cfg = EngineConfig(max_running_requests=2)
    s = _sched(cfg, pool, max_prefix_tokens=4)
    for i in range(4):
        s.enqueue(cfg, _req(i))
    admitted, _ = s.admit(cfg, 4)
    assert [r.id for r in admitted] == [0, 1] and len(s.queue) == 2


def test_queue_full_reason():
    cfg = EngineConfig(max_queued_requests=1)
    s = _sched(cfg, BlockPool(10, 4), 4)
    assert s.enqueue(cfg, _req(0)) is None
    assert "queue full" in s.enqueue(cfg, _req(1))


def test_isolated_needs_a_prefix_copy():
    pool = BlockPool(100, 4)
    s = _sched(EngineConfig(), pool, 16)
    r = _req(0, prompt=3, max_new=5)
    assert s.need_blocks(EngineConfig(mode="unified"), r, 10) == 2
    assert s.need_blocks(EngineConfig(mode="isolated"), r, 10) == 3 + 2


def test_decode_budget_fixed_and_adaptive():
    pool = BlockPool(10, 4)
    fixed = EngineConfig(tokens_per_frame=3)
    assert _sched(fixed, pool, 4).decode_steps(fixed, 0.001) == 3
    cfg = EngineConfig(decode_budget="adaptive", frame_deadline_s=0.1, min_decode_steps=1, max_decode_steps=8)
    s = _sched(cfg, pool, 4)
    s.running = [_req(0)]
    s.running[0].status = RequestStatus.RUNNING
    assert s.decode_steps(cfg, 0.05) == 1  # no measurement yet
    s.costs.update(1, 0.01)
    assert s.decode_steps(cfg, 0.05) == 5
    assert s.decode_steps(cfg, 1.0) == 8
    assert s.decode_steps(cfg, -0.2) == 1


def test_step_cost_model_estimates():
    c = StepCostModel(alpha=0.5)
    assert c.estimate(4) is None
    c.update(2, 0.02)
    c.update(2, 0.04)
    assert abs(c.estimate(2) - 0.03) < 1e-12
    assert c.estimate(1) == c.estimate(2)  # closest larger measured batch
    assert abs(c.estimate(4) - 0.06) < 1e-12  # linear beyond the largest measurement


def test_request_longer_than_the_block_table_width_is_rejected():
    pool = BlockPool(400, 4)
    cfg = EngineConfig(max_request_tokens=20)
    s = _sched(cfg, pool, max_prefix_tokens=16)
    s.enqueue(cfg, _req(0, prompt=3, max_new=17))
    s.enqueue(cfg, _req(1, prompt=3, max_new=18))
    admitted, rejected = s.admit(cfg, prefix_tokens=16)
    assert [r.id for r in admitted] == [0] and [r.id for r in rejected] == [1]
    assert "max_request_tokens is 20" in rejected[0].reason
