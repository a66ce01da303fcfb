"""Joint states at the controller rate (1 kHz) with three 30 Hz cameras: every joint state the node
receives is accounted for, the matched state is the one of the image's instant, chunks keep flowing.

Node process + the ingress feed process (:mod:`oxygen_ros.ros.ingress.feed`, straight into its
1 kHz phase) + a listener here. Behaviour only, loose bounds: how fast the action path runs under
this load is measured by ``python -m oxygen_ros.bench.ingress``, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from ros_helpers import ALOHA_JOINTS, REPO, RosPeer, node_process, ros_env
from trajectory_msgs.msg import JointTrajectory

pytestmark = [pytest.mark.ros, pytest.mark.slow]
SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
TOPICS = ("cam_high/image_raw", "cam_left_wrist/image_raw", "cam_right_wrist/image_raw")
PARAMS = {
    "model": "pi05-tiny",
    "num_threads": 1,
    "diagnostics_period_s": 0.25,
    "tasks.memory.every_n_frames": 0,
    **{f"cameras.{s}.type": "raw" for s in SLOTS},
    **{f"cameras.{s}.topic": t for s, t in zip(SLOTS, TOPICS, strict=True)},
}
HIGH_S = 12.0
LEAD_S = 8.0  # feed process start-up + first frames at the low rate, before the 1 kHz phase


def values(peer: RosPeer, since: float = 0.0) -> list[dict[str, str]]:
    return [
        {kv.key: kv.value for kv in m.status[0].values} for t, m in peer.received.get("/diagnostics", []) if t >= since
    ]


def test_every_joint_state_at_1khz_is_accounted_for_and_the_nearest_state_is_used(tmp_path):
    with domain_id() as dom:
        peer = RosPeer(dom, "joint_rate_listener")
        try:
            peer.collect(JointTrajectory, "action_chunk")
            peer.collect(DiagnosticArray, "/diagnostics")
            with node_process(dom, tmp_path / "node.log", REPO / "config" / "oxygen.yaml", PARAMS) as node:
                assert peer.wait_for(lambda: any(v.get("state") == "active" for v in values(peer)), 60)
                # a 2-phase schedule: 30 Hz joint states until LEAD_S from now (the feed starts up,
                # the node's frames flow), then HIGH_S of 1 kHz joint states
                start = time.monotonic() + LEAD_S - HIGH_S
                high = (start + HIGH_S, start + 2 * HIGH_S)
                feed = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "oxygen_ros.ros.ingress.feed",
                        "--joints",
                        *ALOHA_JOINTS,
                        "--start",
                        repr(start),
                        "--window",
                        str(HIGH_S),
                        "--phases",
                        "2",
                        "--size",
                        "96",
                    ],
                    cwd=REPO,
                    env=ros_env(dom),
                    stdout=subprocess.PIPE,
                )
                out, _ = feed.communicate(timeout=LEAD_S + HIGH_S + 60)
                t_end = time.monotonic()
                assert feed.returncode == 0
                assert peer.wait_for(lambda: values(peer, t_end + 0.5), 10)  # diagnostics after the run
                assert node.poll() is None
            assert node.returncode == 0, (tmp_path / "node.log").read_text()
        finally:
            peer.close()
    per_phase = json.loads(out.decode().strip().splitlines()[-1])["joint_states"]  # index phase + 1
    sent = sum(per_phase)
    diags = values(peer)
    last = diags[-1]
    counts = {k: int(last[f"joint_states_{k}"]) for k in ("received", "accepted", "bad", "out_of_order", "inactive")}
    summary = f"sent {sent} ({per_phase} by phase), node counts {counts}"
    print(summary)
    # every message the node received is in exactly one outcome, none was bad or out of order
    assert counts["received"] == counts["accepted"] + counts["bad"] + counts["out_of_order"] + counts["inactive"], (
        summary
    )
    assert counts["bad"] == 0 and counts["out_of_order"] == 0, summary
    # best effort, keep-last 2: a late executor loses superseded samples in DDS, never most of them
    assert 0.5 * sent <= counts["received"] <= sent, summary
    assert per_phase[2] >= 0.5 * 1000 * HIGH_S, summary  # it was a 1 kHz stream
    # the matched state is the one of the image's instant (the feed stamps both at publish time):
    # at 1 kHz the nearest state is well under a 30 Hz camera period away
    offsets = [int(v["state_offset_us"]) for v in diags if int(v.get("state_offset_us", -1)) >= 0]
    assert offsets and np.median(offsets[len(offsets) // 3 :]) < 5000, offsets
    chunk_times = peer.times("action_chunk")
    assert len([t for t in chunk_times if high[0] <= t <= high[1]]) >= 2 * HIGH_S, summary
