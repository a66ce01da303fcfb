"""The replay's two timing loops and the end-of-bag drain (see :mod:`.replay`)."""

from __future__ import annotations

import time

from oxygen_ros.bags.reader import BagInput
from oxygen_ros.replay.console import Console
from oxygen_ros.replay.node_sim import NodeSim

__all__ = ["DRAIN_LIMIT", "drain", "run_fast", "run_recorded"]

DRAIN_LIMIT = 10_000
"""Most language-only frames after the bag (a safety bound; requests are bounded anyway)."""


def run_fast(
    sim: NodeSim, bag: BagInput, read: list[str], trigger: str, frame_period_s: float, max_frames: int, console: Console
) -> None:
    """Fast timing: one frame per accepted ``trigger``-slot image (at least ``frame_period_s``
    bag seconds apart), run before the first message stamped after that image."""
    pending = None
    last_frame_t = None
    frames = 0
    for topic, log_ns, raw in bag.messages(read):
        if pending is not None and log_ns > pending:
            obs = sim.assemble()
            if obs is not None or sim.engine.in_flight:
                sim.frame(obs, log_ns=pending)
                frames += obs is not None
            pending = None
            if max_frames and frames >= max_frames:
                break
        slot = sim.feed(topic, log_ns, raw)
        if slot == trigger:
            t = sim.bag_time(log_ns)
            if last_frame_t is None or t - last_frame_t >= frame_period_s - 1e-9 or t < last_frame_t:
                pending, last_frame_t = log_ns, t
        console.advance(1, frames=frames)
    else:
        if pending is not None:
            obs = sim.assemble()
            if obs is not None or sim.engine.in_flight:
                sim.frame(obs, log_ns=pending)


def run_recorded(sim: NodeSim, bag: BagInput, read: list[str], rate: float, max_frames: int, console: Console) -> None:
    """Recorded timing: messages at their log times / ``rate``; the node's inference loop runs
    in between (a frame when a new image arrived or language is still running)."""
    wall0 = sim.now()
    frames = 0

    def once() -> bool:  # the node's InferenceWorker._once, without the blocking wait
        nonlocal frames
        got = sim.asm.wait_new(0.0)
        obs = sim.assemble() if got else None
        if obs is None and sim.engine.in_flight == 0:
            return False
        sim.bag_now_ns = max(sim.bag_now_ns, bag.start_ns + round((sim.now() - wall0) * rate * 1e9))
        sim.frame(obs)
        frames += obs is not None
        return True

    for topic, log_ns, raw in bag.messages(read):
        due = wall0 + (log_ns - bag.start_ns) / 1e9 / rate
        while sim.now() < due:
            if max_frames and frames >= max_frames:
                return
            if not once():
                time.sleep(min(max(due - sim.now(), 0.0), 0.02))
        sim.feed(topic, log_ns, raw, arrival=due)
        console.advance(1, frames=frames)
    while once() and not (max_frames and frames >= max_frames):
        pass


def drain(sim: NodeSim, decode: bool) -> None:
    """After the bag: decode running requests to the end (``decode``), cancel what is left.

    Queued requests start as running ones free their blocks; two language-only frames in a row with
    nothing decoding mean nothing can start any more (no observation was ever assembled, so there
    is no prefix to start from): the rest is cancelled and counted, not waited for until it expires.
    """
    steps = idle = 0
    while decode and sim.engine.in_flight and steps < DRAIN_LIMIT and idle < 2:
        sim.frame(None)
        steps += 1
        idle = idle + 1 if sim.engine.running == 0 else 0
    flush = getattr(sim.engine, "flush", None)  # the concurrent schedule's last grants
    if flush is not None:
        res = flush()
        sim.text(res.deltas, res.ended, sim.bag_now_ns, sim.bag_time())
    leftover = sim.engine.close()
    if leftover:
        sim.stats.drops["language requests cancelled at the end of the bag"] += len(leftover)
        sim.text([], leftover, sim.bag_now_ns, sim.bag_time())
