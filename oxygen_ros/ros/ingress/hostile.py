"""Hostile input against a running ``oxygen`` node: what each attack costs the action path.

One command, one node process (pi05-tiny by default, one intra-op thread, three JPEG cameras at
30 Hz and joint states from this process over DDS)::

    hostile_inputs --phase-s 6 --json hostile.json

After a baseline phase it sends, one phase each: a 10 MB and a 1 MB ask, a PNG of 389 KB that
decodes to 20000 x 20000 pixels (and one of 30000 x 30000), a stream of corrupt PNGs, a payload
that is no image at all, a 10 MB instruction, 1,000 asks in one burst, and joint states stamped
a day ahead. Per phase it reports the longest gap between action chunks received (and that gap
in median chunk periods of the baseline, and between the chunks' header stamps: the node's own
cadence), the node process's RSS before and after, and what the node said: its /diagnostics
message of that kind, the notice on the task's text topic, the asks it counted and answered. The
checks a deployment wants — an attack costs at most one frame beyond the baseline's own longest
gap, RSS growth under 100 MB, every attack answered with a named reason — are printed beside the
numbers; the exit status is 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # rclpy is imported where the probe starts
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node

# rclpy and the messages are imported where the probe starts: `--help` answers before them

__all__ = ["ATTACKS", "UNCHECKED_GAP", "HostileProbe", "gap_allowed", "png_bomb", "run_attacks", "main"]

CONFIG = Path(__file__).resolve().parents[3] / "config" / "oxygen.yaml"
CAMERAS = {
    "base_0_rgb": "cam_high/image_raw/compressed",
    "left_wrist_0_rgb": "cam_left_wrist/image_raw/compressed",
    "right_wrist_0_rgb": "cam_right_wrist/image_raw/compressed",
}
JOINTS = (
    "left_waist",
    "left_shoulder",
    "left_elbow",
    "left_forearm_roll",
    "left_wrist_angle",
    "left_wrist_rotate",
    "left_gripper",
    "right_waist",
    "right_shoulder",
    "right_elbow",
    "right_forearm_roll",
    "right_wrist_angle",
    "right_wrist_rotate",
    "right_gripper",
)


def png_bomb(side: int) -> bytes:
    """A valid PNG of ``side`` x ``side`` black 8-bit grey pixels, a few hundred KB: the deflate
    stream of all-zero rows (filter byte 0 is a zero too), compressed in 4 MiB pieces so nothing of
    the decoded size is ever held here."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z, piece = zlib.compressobj(9), bytes(4 << 20)
    left, parts = side * (side + 1), []
    while left > 0:
        parts.append(z.compress(piece[: min(left, len(piece))]))
        left -= len(piece)
    parts.append(z.flush())
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b"")


class HostileProbe:
    """An rclpy peer (own context and domain, spun in a thread): feeds the node cameras and joint
    states at ``rate_hz``, sends the attacks, and records chunk times, /diagnostics and text."""

    def __init__(self, domain: int, rate_hz: float = 30.0) -> None:
        from diagnostic_msgs.msg import DiagnosticArray
        from sensor_msgs.msg import CompressedImage, JointState
        from std_msgs.msg import String
        from trajectory_msgs.msg import JointTrajectory

        from oxygen_ros.ros.convert import rgb_to_compressed_msg
        from oxygen_ros.ros.qos import reliable_keep_all_qos, reliable_qos, sensor_data_qos

        self.lock = threading.Lock()
        self.chunks: list[tuple[float, float]] = []  # (receive time, header stamp) of each chunk
        self.diags: list[tuple[float, int, str, dict[str, str]]] = []
        self.texts: list[tuple[float, str]] = []
        self._stop = threading.Event()
        # chunks are timed by a participant of their own, spun by its own thread: the text flood an
        # attack provokes must not delay the receive times it measures
        self._spins: list[tuple[Context, Node, SingleThreadedExecutor, threading.Thread]] = []
        timing = self._participant(domain, "hostile_inputs_timing")
        timing.create_subscription(JointTrajectory, "action_chunk", self._on_chunk, reliable_qos(100))
        n = self.node = self._participant(domain, "hostile_inputs")
        n.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, reliable_qos(100))
        n.create_subscription(
            String,
            "conversation/text",
            lambda m: self._add(self.texts, (time.monotonic(), m.data)),
            reliable_keep_all_qos(),
        )
        self.cams = {s: n.create_publisher(CompressedImage, t, sensor_data_qos(5)) for s, t in CAMERAS.items()}
        self.joints = n.create_publisher(JointState, "joint_states", sensor_data_qos(5))
        self.ask = n.create_publisher(String, "ask", reliable_keep_all_qos())
        self.instruction = n.create_publisher(String, "instruction", reliable_qos())
        picture = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
        self.jpeg = rgb_to_compressed_msg(picture, "jpeg")
        self.rate_hz = rate_hz
        self.joint_offset_s = 0.0
        self.replace: dict[str, tuple[str, bytes]] = {}  # slot -> (format, payload) for the next tick
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._feeder.start()

    def _participant(self, domain: int, name: str) -> Node:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.signals import SignalHandlerOptions

        context = Context()
        rclpy.init(context=context, domain_id=domain, signal_handler_options=SignalHandlerOptions.NO)
        node = rclpy.create_node(name, context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        thread = threading.Thread(target=self._spin, args=(context, executor), daemon=True)
        self._spins.append((context, node, executor, thread))
        thread.start()
        return node

    def _on_chunk(self, msg: Any) -> None:  # trajectory_msgs/JointTrajectory
        stamp = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
        self._add(self.chunks, (time.monotonic(), stamp))

    def _add(self, book: list[Any], item: Any) -> None:
        with self.lock:
            book.append(item)

    def _on_diag(self, msg: Any) -> None:  # diagnostic_msgs/DiagnosticArray
        for s in msg.status:
            if s.name.endswith(": inference"):
                self._add(self.diags, (time.monotonic(), s.level[0], s.message, {kv.key: kv.value for kv in s.values}))

    @staticmethod
    def _spin(context: Any, executor: Any) -> None:
        while context.ok():
            try:
                executor.spin_once(timeout_sec=0.05)
            except Exception:  # shutdown race
                if not context.ok():
                    return
                raise

    def _feed(self) -> None:
        from sensor_msgs.msg import CompressedImage, JointState

        from oxygen_ros.ros.convert import sec_to_stamp

        period, k = 1.0 / self.rate_hz, 0
        next_t = time.monotonic()
        while not self._stop.is_set() and self.node.context.ok():
            stamp = sec_to_stamp(time.time())
            for slot, pub in self.cams.items():
                fmt, data = self.replace.pop(slot, (self.jpeg.format, self.jpeg.data))
                msg = CompressedImage(format=fmt)
                msg.header.stamp, msg.data = stamp, data
                pub.publish(msg)
            js = JointState(name=list(JOINTS), position=[0.1 * np.sin(0.05 * k + i) for i in range(len(JOINTS))])
            js.header.stamp = sec_to_stamp(time.time() + self.joint_offset_s)
            self.joints.publish(js)
            k += 1
            next_t += period
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def chunk_times(self, lo: float, hi: float) -> list[float]:
        """Receive times (monotonic s) of the chunks received in ``[lo, hi]``."""
        with self.lock:
            return [t for t, _ in self.chunks if lo <= t <= hi]

    def chunk_stamps(self, lo: float, hi: float) -> list[float]:
        """Header stamps (observation times, s) of the chunks received in ``[lo, hi]``."""
        with self.lock:
            return [st for t, st in self.chunks if lo <= t <= hi]

    def diag_with(self, text: str, since: float) -> tuple[int, str, dict[str, str]] | None:
        """(level, message, values) of the first status after ``since`` whose message holds ``text``."""
        with self.lock:
            found = [(lv, m, v) for t, lv, m, v in self.diags if t >= since and text in m]
        return found[0] if found else None

    def latest_values(self) -> dict[str, str]:
        """Key/values of the newest status."""
        with self.lock:
            return dict(self.diags[-1][3]) if self.diags else {}

    def texts_since(self, since: float) -> list[str]:
        """Text-topic messages received after ``since``."""
        with self.lock:
            return [m for t, m in self.texts if t >= since]

    def close(self) -> None:
        """Stop the feed and the spin threads, destroy the nodes."""
        self._stop.set()
        self._feeder.join(5)
        from oxygen_ros.ros.distro import close_context

        for context, node, executor, thread in self._spins:
            close_context(context, [node], executor, thread)


Done = Callable[[HostileProbe, float], str | None]
"""``done(probe, t0)``: what the node said about the attack started at ``t0``, or None while nothing yet."""
Attack = Callable[[HostileProbe], tuple[str, Done]]
"""``attack(probe)`` starts an attack and returns (description, its :data:`Done`)."""


def _ask(size: int) -> Attack:
    def attack(p: HostileProbe) -> tuple[str, Done]:
        p.ask.publish(p.ask.msg_type(data="x" * size))

        def answered(p: HostileProbe, t0: float) -> str | None:
            return next((m for m in p.texts_since(t0) if "engine.max_request_chars" in m), None)

        return f"one ask of {size / 2**20:.0f} MiB", answered

    return attack


def _image(side: int | None, fmt: str, payload: Callable[[], bytes], what: str, expect: str, repeat: int = 1) -> Attack:
    made: list[bytes] = []

    def prepare() -> None:  # built before the phase starts: a bomb takes seconds of zlib
        if not made:
            made.append(payload())

    def attack(p: HostileProbe) -> tuple[str, Done]:
        prepare()
        data = made[0]
        for _ in range(repeat):
            p.replace["base_0_rgb"] = (fmt, data)
            time.sleep(1.0 / p.rate_hz)
        return what, lambda p, t0: (d := p.diag_with(expect, t0)) and d[1]

    attack.prepare = prepare  # type: ignore[attr-defined]
    return attack


def _instruction(p: HostileProbe) -> tuple[str, Done]:
    p.instruction.publish(p.instruction.msg_type(data="pick up the cube " * 600_000))
    return "one instruction of 10 MB", lambda p, t0: (d := p.diag_with("instruction_too_long", t0)) and d[1]


def _flood(n: int) -> Attack:
    def attack(p: HostileProbe) -> tuple[str, Done]:
        before = int(p.latest_values().get("asks", 0))
        for i in range(n):
            p.ask.publish(p.ask.msg_type(data=f"flood {i}?"))

        def answered(p: HostileProbe, t0: float) -> str | None:
            got = int(p.latest_values().get("asks", 0)) - before
            ended = sum(1 for m in p.texts_since(t0) if "Q: flood " in m)
            return f"{got} asks taken, {ended} answered or refused" if ended >= n else None

        return f"{n} asks in one burst", answered

    return attack


def _future_joints(p: HostileProbe) -> tuple[str, Done]:
    p.joint_offset_s = 86400.0
    return "joint states stamped a day ahead", lambda p, t0: (d := p.diag_with("stamped", t0)) and d[1]


#: Attacks whose chunk gap is reported but not checked, and why: while joint states are stamped a
#: day ahead no observation can be assembled (no chunk is due; the node must say why), and a burst
#: of 1,000 asks is 1,000 callbacks of real work for the node's executor thread (the check there is
#: that every ask is taken and answered).
UNCHECKED_GAP = {"joints_day_ahead": "no observation can be assembled", "asks_1000": "a burst is CPU work"}
#: name -> attack: ``attack(probe)`` starts it and returns (description, ``done(probe, t0)`` giving
#: what the node said, or None while it has said nothing yet).
ATTACKS: dict[str, Attack] = {
    "ask_10mb": _ask(10 * 2**20),
    "ask_1mb": _ask(2**20),
    "png_20000": _image(20000, "png", lambda: png_bomb(20000), "a 20000x20000 PNG", "image_too_large"),
    "png_30000": _image(
        30000,
        "png",
        lambda: png_bomb(30000),
        "a 30000x30000 PNG (x5: 854 KB, best effort)",
        "image_too_large",
        repeat=5,
    ),
    "png_corrupt": _image(None, "png", lambda: png_bomb(64)[:60], "30 truncated PNGs", "bad_image", repeat=30),
    "not_an_image": _image(None, "jpeg", lambda: b"GIF89a" + bytes(200), "a GIF labelled jpeg", "bad_image"),
    "instruction_10mb": _instruction,
    "asks_1000": _flood(1000),
    "joints_day_ahead": _future_joints,
}


def run_attacks(
    probe: HostileProbe, pid: int, names: list[str], phase_s: float, baseline_s: float = 5.0
) -> dict[str, Any]:
    """Run ``names`` one after the other against the node process ``pid`` (already publishing
    chunks), each for ``phase_s`` seconds (longer while the node has not answered, up to 3x).

    Returns:
        ``{'baseline_period_s', 'baseline_max_gap_s', 'phases': [{name, what, max_gap_s, gap_periods,
        max_stamp_gap_s, chunks,
        rss_mb_before, rss_mb_after, answer}]}``: ``max_gap_s`` between chunk receive times (the phase's
        start and end included), ``max_stamp_gap_s`` between their header stamps (observation times:
        the node's own cadence, free of this process's receive delays).
    """
    import psutil

    proc = psutil.Process(pid)
    for name in names:  # payloads first (a bomb is seconds of zlib): no phase follows that load
        getattr(ATTACKS[name], "prepare", lambda: None)()
    t0 = time.monotonic()
    time.sleep(baseline_s)
    base = np.diff(probe.chunk_times(t0, time.monotonic()))
    period = float(np.median(base)) if base.size else float("nan")
    base_gap = float(np.max(base)) if base.size else float("nan")
    rows = []
    for name in names:
        rss0 = proc.memory_info().rss / 2**20
        start = time.monotonic()
        what, done = ATTACKS[name](probe)
        answer = None
        while time.monotonic() - start < 3 * phase_s:
            time.sleep(0.2)
            answer = answer or done(probe, start)
            if answer and time.monotonic() - start >= phase_s:
                break
        end = time.monotonic()
        probe.joint_offset_s = 0.0
        times = [start] + probe.chunk_times(start, end) + [end]
        gap = float(np.max(np.diff(times)))
        stamps = probe.chunk_stamps(start - 1.0, end)
        stamp_gap = float(np.max(np.diff(stamps))) if len(stamps) > 1 else float("nan")
        rows.append(
            {
                "name": name,
                "what": what,
                "max_gap_s": gap,
                "gap_periods": gap / period,
                "max_stamp_gap_s": stamp_gap,
                "chunks": len(times) - 2,
                "rss_mb_before": rss0,
                "rss_mb_after": proc.memory_info().rss / 2**20,
                "answer": answer,
            }
        )
        time.sleep(1.0)  # let the node settle before the next attack
    return {"baseline_period_s": period, "baseline_max_gap_s": base_gap, "phases": rows}


def gap_allowed(report: dict[str, Any]) -> float:
    """The longest chunk gap an attack may cause, seconds: one chunk period more than the longest gap
    of the baseline (the same node and machine with no attack) — an attack may cost one frame."""
    allowed: float = report["baseline_max_gap_s"] + report["baseline_period_s"]
    return allowed


def node_command(model: str, params_file: Path, extra: list[str]) -> list[str]:
    """The node process's command line: ``model``, one thread, the three JPEG cameras."""
    params = {"model": model, "num_threads": 1, "diagnostics_period_s": 0.25, "tasks.memory.every_n_frames": 0}
    for slot, topic in CAMERAS.items():
        params[f"cameras.{slot}.topic"], params[f"cameras.{slot}.type"] = topic, "compressed"
    cmd = [sys.executable, "-m", "oxygen_ros.ros.node", "--ros-args", "--params-file", str(params_file)]
    for key, value in params.items():
        cmd += ["-p", f"{key}:={value}"]
    for item in extra:
        cmd += ["-p", item]
    return cmd


def _run(a: argparse.Namespace, domain: int) -> dict[str, Any]:
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1")
    probe = HostileProbe(domain)
    node = None
    try:
        with open(a.log, "wb") as log:
            node = subprocess.Popen(
                node_command(a.model, a.params_file, a.node_param), env=env, stdout=log, stderr=subprocess.STDOUT
            )
            deadline = time.monotonic() + 240.0
            while len(probe.chunk_times(0.0, float("inf"))) < 10:
                if time.monotonic() > deadline or node.poll() is not None:
                    raise RuntimeError(f"no action chunks from the node; see {a.log}")
                time.sleep(0.2)
            report = run_attacks(probe, node.pid, a.attack or list(ATTACKS), a.phase_s)
    finally:
        if node is not None and node.poll() is None:
            node.send_signal(2)
            try:
                node.wait(20)
            except subprocess.TimeoutExpired:
                node.kill()
        probe.close()
    report["node_exit"] = None if node is None else node.returncode
    report["command"] = " ".join(["hostile_inputs"] + sys.argv[1:])
    return report


def main(argv: list[str] | None = None) -> int:
    """Console script ``hostile_inputs``: run the attacks, print the table; exit 1 if a check failed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="pi05-tiny")
    ap.add_argument("--params-file", type=Path, default=CONFIG)
    ap.add_argument("--node-param", action="append", default=[], help="extra node parameter k:=v")
    ap.add_argument("--attack", action="append", choices=list(ATTACKS), help="run only these (repeatable)")
    ap.add_argument("--phase-s", type=float, default=6.0, help="seconds per attack")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    ap.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "hostile_node.log", help="node output")
    a = ap.parse_args(argv)
    from domain_coordinator import domain_id

    with domain_id() as dom:
        report = _run(a, dom)
    period = report["baseline_period_s"]
    print(
        f"baseline, no attack: median chunk period {period * 1e3:.0f} ms, longest gap "
        f"{report['baseline_max_gap_s'] * 1e3:.0f} ms"
    )
    print(f"{'attack':<18} {'longest gap':>11} {'periods':>7} {'stamp gap':>9} {'RSS MB before -> after':>22}  answer")
    ok = True
    for r in report["phases"]:
        fine = (
            (r["max_gap_s"] <= gap_allowed(report) or r["name"] in UNCHECKED_GAP)
            and r["rss_mb_after"] - r["rss_mb_before"] <= 100
            and r["answer"]
        )
        ok = ok and bool(fine)
        print(
            f"{r['name']:<18} {r['max_gap_s'] * 1e3:>8.0f} ms {r['gap_periods']:>7.2f} "
            f"{r['max_stamp_gap_s'] * 1e3:>6.0f} ms "
            f"{r['rss_mb_before']:>10.0f} -> {r['rss_mb_after']:<9.0f}  {(r['answer'] or 'NOTHING')[:110]}"
            + ("" if fine else "   <-- check failed")
        )
    print(
        f"node exit status {report['node_exit']}; checks: longest gap <= the baseline's + one period "
        f"({gap_allowed(report) * 1e3:.0f} ms; not for {', '.join(UNCHECKED_GAP)}), RSS growth <= 100 MB, a named "
        "answer: " + ("all passed" if ok else "FAILED")
    )
    if a.json is not None:
        a.json.write_text(json.dumps(report, indent=1))
    return 0 if ok and report["node_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
