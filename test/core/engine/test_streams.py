"""Cross-lane lifetime rules on the CPU: host fences stay pending while another thread's lane unit
runs, fenced blocks are not handed out before that unit ends, one thread never fences, and the
lane/event/clock helpers behave as the CUDA path's host equivalents."""

import threading

import pytest
import torch

from oxygen_ros.core.cache.block_pool import BlockPool, PoolExhausted
from oxygen_ros.core.engine.streams import DeviceStreams, HostFence, StageClock


def busy_lane(streams: DeviceStreams, lane: str):
    """Start a thread inside a ``lane`` unit; returns (entered, release, thread)."""
    entered, release = threading.Event(), threading.Event()

    def work():
        with streams.action() if lane == "action" else streams.decode(after=None):
            entered.set()
            release.wait(10)

    t = threading.Thread(target=work)
    t.start()
    assert entered.wait(10)
    return release, t


def test_one_thread_never_fences():
    s = DeviceStreams(torch.device("cpu"))
    with s.decode():
        assert s.fence() is None
    with s.action():
        assert s.fence() is None
    assert s.fence() is None and s.is_done(None)


@pytest.mark.parametrize("lane", ["action", "decode"])
def test_blocks_freed_while_another_lane_runs_wait_for_its_unit(lane):
    s = DeviceStreams(torch.device("cpu"))
    pool = BlockPool(4, 2)
    mine = pool.allocate(2)
    release, t = busy_lane(s, lane)
    fence = s.fence()
    assert isinstance(fence, HostFence) and not s.is_done(fence)  # pending: the other unit still runs
    pool.free(mine, fence)
    assert pool.num_fenced == 2 and pool.num_free == 2
    assert pool.reclaim(s.is_done) == 0
    got = pool.allocate(2)
    assert set(got).isdisjoint(mine)  # the fenced blocks are not handed out
    with pytest.raises(PoolExhausted):
        pool.allocate(1)
    pool.check()
    release.set()
    t.join()
    assert s.is_done(fence) and pool.reclaim(s.is_done) == 2
    assert sorted(pool.allocate(2)) == sorted(mine)
    pool.check()


def test_a_later_unit_does_not_release_an_earlier_fence_early():
    s = DeviceStreams(torch.device("cpu"))
    release, t = busy_lane(s, "action")
    fence = s.fence()
    assert fence.marks[0][1] == s.action_lane.started  # waits for exactly the running unit
    release.set()
    t.join()
    release2, t2 = busy_lane(s, "action")  # a new unit starts: the old fence stays done
    assert s.is_done(fence)
    assert not s.is_done(s.fence())
    release2.set()
    t2.join()


def test_nested_units_count_once_and_lane_helpers():
    s = DeviceStreams(torch.device("cpu"))
    with s.action():
        with s.action():
            assert s.action_lane.started == 1
        assert s.action_lane.owner == threading.get_ident()
    assert s.action_lane.finished == 1 and s.action_lane.owner is None
    assert s.event() is None
    s.hand_over(torch.zeros(2), "decode")  # CPU tensor: nothing to record
    with pytest.raises(ValueError, match="unknown lane"):
        s.hand_over(torch.zeros(2), "vision")
    s.wait_default()
    s.sync()


def test_stage_clock_on_cpu_measures_host_time():
    c = StageClock(cuda=False)
    a = c.mark()
    torch.ones(64, 64) @ torch.ones(64, 64)
    b = c.mark()
    assert 0 <= c.seconds(a, b) < 5.0
