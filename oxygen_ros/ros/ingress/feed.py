"""Sensor feed for the ingress benchmark: three cameras at a fixed rate plus ``/joint_states``
whose rate alternates between a low and a high value on a fixed schedule.

Run as its own process (``python -m oxygen_ros.ros.ingress.feed ...``; domain from
``ROS_DOMAIN_ID``). Phases are laid out on ``CLOCK_MONOTONIC`` (shared by every process on the
host), so the bench driver can cut its chunk-time series at the same instants: phase ``i`` spans
``[start + i * window, start + (i + 1) * window)``, even phases low rate, odd phases high rate;
before ``start`` the joint states run at the low rate. With ``--decoy TOPIC`` the high-rate
stream runs in every phase and only changes topic (``joint_states`` in high phases, ``TOPIC`` in
low ones), so the publishing load on the machine is the same in both and only what the node
receives differs. The feed prints one JSON line at exit with
the number of joint states and images it published per phase.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time

import numpy as np
import rclpy
from rclpy.context import Context
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import Image, JointState

from oxygen_ros.ros.convert import rgb_to_image_msg, sec_to_stamp
from oxygen_ros.ros.qos import sensor_data_qos

__all__ = ["phase_of", "main"]

CAMERA_TOPICS = ("cam_high/image_raw", "cam_left_wrist/image_raw", "cam_right_wrist/image_raw")


def phase_of(t: float, start: float, window: float, phases: int) -> int:
    """Phase index of monotonic time ``t`` (``-1`` before ``start``, ``phases`` after the last)."""
    if t < start:
        return -1
    return min(int((t - start) // window), phases)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--joints", nargs="+", required=True, help="joint names (in message order)")
    ap.add_argument("--camera-hz", type=float, default=30.0)
    ap.add_argument("--low-hz", type=float, default=30.0, help="joint-state rate in even phases")
    ap.add_argument("--high-hz", type=float, default=1000.0, help="joint-state rate in odd phases")
    ap.add_argument("--start", type=float, required=True, help="CLOCK_MONOTONIC start of phase 0, s")
    ap.add_argument("--window", type=float, default=8.0, help="phase length, s")
    ap.add_argument("--phases", type=int, default=8)
    ap.add_argument("--size", type=int, default=224, help="square camera image side, pixels")
    ap.add_argument(
        "--decoy",
        default="",
        help="in low phases, publish the high-rate stream on this "
        "topic (nobody subscribes): the same publisher load in every phase",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Publish until the last phase ends (or SIGINT/SIGTERM); print the per-phase counts."""
    a = _parse(argv)
    ctx = Context()
    rclpy.init(context=ctx, signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node("ingress_feed", context=ctx)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    qos = sensor_data_qos(5)
    cams = [node.create_publisher(Image, t, qos) for t in CAMERA_TOPICS]
    joints = node.create_publisher(JointState, "joint_states", qos)
    decoy = node.create_publisher(JointState, a.decoy, qos) if a.decoy else None
    picture = np.random.default_rng(0).integers(0, 256, (a.size, a.size, 3), dtype=np.uint8)
    template = rgb_to_image_msg(picture, "rgb8")
    names = list(a.joints)
    sent_js = [0] * (a.phases + 2)  # index phase + 1
    sent_img = [0] * (a.phases + 2)
    end = a.start + a.window * a.phases
    now = time.monotonic()
    next_cam = next_slow = next_fast = now
    k = 0

    def joint_state() -> JointState:
        js = JointState(name=names, position=[0.1 * math.sin(0.001 * k + i) for i in range(len(names))])
        js.header.stamp = sec_to_stamp(time.time())
        return js

    while not stop.is_set() and now < end:
        phase = phase_of(now, a.start, a.window, a.phases)
        high = phase >= 0 and phase % 2 == 1
        if now >= next_cam:
            stamp = sec_to_stamp(time.time())
            for pub in cams:
                msg = Image(height=template.height, width=template.width, encoding="rgb8", step=template.step)
                msg.data = template.data  # bytes: fast
                msg.header.stamp = stamp
                pub.publish(msg)
            sent_img[phase + 1] += 1
            next_cam += 1.0 / a.camera_hz
        if not high and now >= next_slow:
            joints.publish(joint_state())
            sent_js[phase + 1] += 1
            k += 1
            next_slow = max(next_slow + 1.0 / a.low_hz, now - 0.01)
        fast = joints if high else decoy  # None: no high-rate stream in this phase
        if fast is not None and now >= next_fast:
            fast.publish(joint_state())
            if high:
                sent_js[phase + 1] += 1
            k += 1
            next_fast = max(next_fast + 1.0 / a.high_hz, now - 0.01)  # never burst > 10 ms behind
        due = [next_cam] + ([next_fast] if high or decoy is not None else []) + ([] if high else [next_slow])
        wait = min(due) - time.monotonic()
        if wait > 0:
            stop.wait(wait)
        now = time.monotonic()
    print(json.dumps({"joint_states": sent_js, "images": sent_img}), flush=True)
    node.destroy_node()
    ctx.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
