"""The chunk publish period stays steady while the node's subscriptions are flooded.

Node process + a steady 30 Hz sensor publisher process; after a baseline, a second publisher
process floods the same camera and joint-state topics as fast as it can. This process measures
the period of the action chunks and of the per-step command stream in both windows. Loose
assertions: the machine has 2 cores shared by all three processes (and the node's executor and
inference threads share one GIL).
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from ros_helpers import REPO, RosPeer, node_process, ros_env, stop_process
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory

pytestmark = [pytest.mark.ros, pytest.mark.slow]
PARAMS = {
    "model": "pi05-tiny",
    "num_threads": 1,
    "action_rate_hz": 50.0,
    "diagnostics_period_s": 0.5,
    "tasks.memory.every_n_frames": 0,
    **{f"cameras.{s}.type": "raw" for s in ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")},
    "cameras.base_0_rgb.topic": "cam_high/image_raw",
    "cameras.left_wrist_0_rgb.topic": "cam_left_wrist/image_raw",
    "cameras.right_wrist_0_rgb.topic": "cam_right_wrist/image_raw",
}


def publisher(dom: int, rate: float, duration: float) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(REPO / "test" / "ros_helpers.py"),
            "publish",
            "--domain",
            str(dom),
            "--rate",
            str(rate),
            "--duration",
            str(duration),
        ],
        env=ros_env(dom),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )


def image_counts(peer: RosPeer) -> list[tuple[float, int]]:
    """(receive time, base camera images the node has taken in) from /diagnostics."""
    return [
        (t, int(kv.value))
        for t, m in peer.received.get("/diagnostics", [])
        for kv in m.status[0].values
        if kv.key == "images_base_0_rgb"
    ]


def image_rate(peer: RosPeer, window: float, end: float | None = None) -> float:
    """Base camera images per second taken in by the node over ``window`` s before ``end``."""
    counts = image_counts(peer)
    end = counts[-1][0] if end is None and counts else end
    if len(counts) < 2 or end is None:
        return 0.0
    t, n = zip(*counts, strict=True)
    lo, hi = np.interp([end - window, end], t, n)
    return (hi - lo) / window


def periods(times: list[float]) -> np.ndarray:
    return np.diff(np.asarray(times))


def test_chunk_period_is_steady_under_a_subscription_flood(tmp_path):
    with domain_id() as dom:
        peer = RosPeer(dom, "flood_listener")
        try:
            peer.collect(JointTrajectory, "action_chunk")
            peer.collect(JointState, "joint_command")
            peer.collect(DiagnosticArray, "/diagnostics")
            with node_process(dom, tmp_path / "node.log", REPO / "config" / "oxygen.yaml", PARAMS) as node:
                steady = publisher(dom, 30.0, 600.0)  # stopped below
                try:
                    assert peer.wait_for(lambda: len(peer.messages("action_chunk")) > 10, 90)
                    t0 = time.monotonic()
                    time.sleep(4.0)
                    t1 = time.monotonic()
                    flood = publisher(dom, 2000.0, 600.0)
                    try:
                        # measure once the flood has got going (the node takes in images fast)
                        assert peer.wait_for(lambda: image_rate(peer, 1.0) > 150, 60), (
                            f"no flood: {image_rate(peer, 1.0)} images/s"
                        )
                        t2 = time.monotonic()
                        time.sleep(6.0)
                        t3 = time.monotonic()
                    finally:
                        assert stop_process(flood) == 0
                finally:
                    assert stop_process(steady) == 0
                assert node.poll() is None
            assert node.returncode == 0, (tmp_path / "node.log").read_text()
        finally:
            peer.close()
    log = (tmp_path / "node.log").read_text()
    chunk_times = peer.times("action_chunk")
    base = periods([t for t in chunk_times if t0 <= t <= t1])
    flooded = periods([t for t in chunk_times if t2 <= t <= t3])
    cmd_times = peer.times("joint_command")
    cmd_flooded = periods([t for t in cmd_times if t2 <= t <= t3])
    summary = (
        f"chunk period p50/p90 ms: base {np.median(base) * 1e3:.1f}/"
        f"{np.percentile(base, 90) * 1e3:.1f}, flood {np.median(flooded) * 1e3:.1f}/"
        f"{np.percentile(flooded, 90) * 1e3:.1f}; command period p50 under flood "
        f"{np.median(cmd_flooded) * 1e3:.1f} ms"
    )
    print(summary)
    assert len(base) > 20 and len(flooded) > 8, (summary, log)
    # it was a flood: the node took in several times more camera images per second
    base_rate, flood_rate = image_rate(peer, t1 - t0, t1), image_rate(peer, t3 - t2, t3)
    assert flood_rate > 4 * base_rate, (base_rate, flood_rate)
    # Loose on purpose: on 2 cores the flood publisher, the executor thread (one Python callback
    # per message) and the inference thread share the CPU and the GIL. Measured ~6x the base
    # period with rclpy's Python executor; with the EventsExecutor and raw joint states the
    # flooded p50 was no longer than the base (32.8 -> 24.1 ms; more images, more frames). The
    # bound still catches starvation (e.g. a busy-spinning executor: >800 ms).
    assert np.median(flooded) <= 10.0 * np.median(base) + 0.050, summary
    assert np.percentile(flooded, 90) <= 10.0 * np.percentile(base, 90) + 0.100, summary
    assert np.median(cmd_flooded) == pytest.approx(0.02, abs=0.006), summary
