"""Ingress-load benchmark: the chunk period with ``/joint_states`` at 1 kHz vs. at 30 Hz.

One command, one node process, interleaved phases (issue 14, deliverable 4)::

    python -m oxygen_ros.bench.ingress --pairs 4 --window 8

starts the ``oxygen`` node (pi05-tiny, one intra-op thread, three raw 224×224 cameras), a feed
process (:mod:`oxygen_ros.ros.ingress.feed`: cameras at 30 Hz, joint states alternating 30 Hz /
1 kHz every ``window`` seconds; in the 30 Hz phases the 1 kHz stream goes on to an unsubscribed
topic, so the machine carries the same publishing load in both and only what the node receives
differs — ``--no-decoy`` turns that off) and a listener in this process. After warm-up it cuts the listener's
chunk receive times into the phases (the first ``settle`` seconds of each are skipped) and reports
per phase the median chunk period, the node's median frame time (its /diagnostics), the joint
states the node took in and the node process's CPU use (cores, from /proc via psutil — a measure
of the ingress cost that the machine's other load disturbs far less than wall times); then, per high-rate phase, the
ratio of its median chunk period to the
mean of its low-rate neighbours', and the median and range of those ratios. Interleaving makes the
ratio robust to the slow drifts of a shared machine; the spread shows what is left.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

if TYPE_CHECKING:  # rclpy is imported where the listener starts (`--help` answers before it)
    from diagnostic_msgs.msg import DiagnosticArray

__all__ = ["phase_report", "main"]

SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
CONFIG = Path(__file__).resolve().parents[3] / "config" / "oxygen.yaml"


class _Listener:
    """Chunk receive times and /diagnostics values, collected by a background spin thread."""

    def __init__(self, domain: int) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.signals import SignalHandlerOptions
        from trajectory_msgs.msg import JointTrajectory

        from oxygen_ros.ros.qos import reliable_qos

        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node("ingress_bench", context=self.context)
        self.chunks: list[float] = []
        self.diags: list[tuple[float, dict[str, str]]] = []
        self.node.create_subscription(
            JointTrajectory, "action_chunk", lambda m: self.chunks.append(time.monotonic()), reliable_qos()
        )
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, reliable_qos())
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name.endswith(": inference"):
                self.diags.append((time.monotonic(), {kv.key: kv.value for kv in status.values}))

    def _spin(self) -> None:
        while self.context.ok():
            try:
                self._executor.spin_once(timeout_sec=0.05)
            except Exception:  # shutdown race
                if not self.context.ok():
                    return
                raise

    def close(self) -> None:
        from oxygen_ros.ros.distro import close_context

        close_context(self.context, [self.node], self._executor, self._thread)


def _diag_at(diags: list[tuple[float, dict[str, str]]], t: float, key: str) -> float:
    """Value of ``key`` in the newest /diagnostics received at or before ``t`` (nan if none)."""
    vals = [float(d[key]) for td, d in diags if td <= t and key in d]
    return vals[-1] if vals else float("nan")


def _cpu_sampler(pid: int, out: list[tuple[float, float]], stop: threading.Event) -> None:
    """Append (monotonic s, CPU seconds used by process ``pid``, all threads) every 0.2 s."""
    import psutil

    proc = psutil.Process(pid)
    while not stop.wait(0.2):
        try:
            t = proc.cpu_times()
        except psutil.Error:
            return
        out.append((time.monotonic(), t.user + t.system))


def _cpu_rate(cpu: list[tuple[float, float]], lo: float, hi: float) -> float:
    """CPU seconds per second of the node between monotonic ``lo`` and ``hi`` (nan if unsampled)."""
    inside = [(t, c) for t, c in cpu if lo <= t <= hi]
    if len(inside) < 2:
        return float("nan")
    (t0, c0), (t1, c1) = inside[0], inside[-1]
    return (c1 - c0) / (t1 - t0)


def phase_report(
    chunks: list[float],
    diags: list[tuple[float, dict[str, str]]],
    start: float,
    window: float,
    phases: int,
    settle: float,
    cpu: list[tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """Per-phase chunk periods and the high/low ratios (see module doc).

    Args:
        chunks: monotonic receive times of the action chunks, seconds.
        diags: (monotonic receive time, key -> value) of the node's inference status.
        start, window, phases: the feed's schedule (seconds, seconds, count).
        settle: seconds skipped at the start of every phase.
        cpu: (monotonic s, CPU seconds of the node process) samples, for ``node_cpu`` per phase.

    Returns:
        ``{'phases': [...], 'ratios': [...], 'ratio_median', 'ratio_min', 'ratio_max'}``; periods in ms.
    """
    times = np.asarray(chunks)
    rows: list[dict[str, Any]] = []
    for i in range(phases):
        lo, hi = start + i * window + settle, start + (i + 1) * window
        t = times[(times >= lo) & (times < hi)]
        period = np.diff(t)
        js = [_diag_at(diags, x, "joint_states_received") for x in (lo, hi)]
        rows.append(
            {
                "phase": i,
                "joints": "high" if i % 2 else "low",
                "chunks": int(t.size),
                "period_p50_ms": float(np.median(period) * 1e3) if period.size else float("nan"),
                "period_p90_ms": float(np.percentile(period, 90) * 1e3) if period.size else float("nan"),
                "frame_p50_ms": _diag_at(diags, hi, "frame_time_p50_ms"),
                "joint_states_per_s": (js[1] - js[0]) / (hi - lo),
                "node_cpu": _cpu_rate(cpu or [], lo, hi),
            }
        )
    ratios = []
    for i in range(1, phases, 2):
        lows = [rows[j]["period_p50_ms"] for j in (i - 1, i + 1) if j < phases]
        ratios.append(rows[i]["period_p50_ms"] / float(np.mean(lows)))
    finite = [r for r in ratios if np.isfinite(r)]
    cpu_high = [r["node_cpu"] for r in rows if r["joints"] == "high" and np.isfinite(r["node_cpu"])]
    cpu_low = [r["node_cpu"] for r in rows if r["joints"] == "low" and np.isfinite(r["node_cpu"])]
    return {
        "phases": rows,
        "ratios": ratios,
        "ingress_cpu": (float(np.median(cpu_high) - np.median(cpu_low)) if cpu_high and cpu_low else float("nan")),
        "ratio_median": float(np.median(finite)) if finite else float("nan"),
        "ratio_min": min(finite, default=float("nan")),
        "ratio_max": max(finite, default=float("nan")),
    }


def _node_cmd(a: argparse.Namespace) -> list[str]:
    from oxygen_ros.ros.ingress.feed import CAMERA_TOPICS

    params = {
        "model": a.model,
        "num_threads": 1,
        "diagnostics_period_s": 0.5,
        "tasks.memory.every_n_frames": 0,
        "joint_state_topic": "joint_states",
    }
    for slot, topic in zip(SLOTS, CAMERA_TOPICS, strict=True):
        params[f"cameras.{slot}.topic"], params[f"cameras.{slot}.type"] = topic, "raw"
    cmd = [sys.executable, "-m", "oxygen_ros.ros.node", "--ros-args", "--params-file", str(a.params_file)]
    for key, value in params.items():
        cmd += ["-p", f"{key}:={value}"]
    for extra in a.node_param:
        cmd += ["-p", extra]
    return cmd


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="pi05-tiny")
    ap.add_argument("--params-file", type=Path, default=CONFIG)
    ap.add_argument("--node-param", action="append", default=[], help="extra node parameter k:=v")
    ap.add_argument("--pairs", type=int, default=4, help="(low, high) phase pairs; a final low phase is added")
    ap.add_argument("--window", type=float, default=8.0, help="phase length, s")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds skipped at each phase start")
    ap.add_argument("--high-hz", type=float, default=1000.0)
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of chunks before phase 0")
    ap.add_argument(
        "--no-decoy",
        action="store_true",
        help="low phases publish no high-rate stream at all (default: it goes to an "
        "unsubscribed topic, so both phases load the machine alike)",
    )
    ap.add_argument("--domain", type=int, default=None, help="ROS domain id (default: a free one)")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    ap.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "ingress_node.log", help="node output")
    return ap.parse_args(argv)


def _run(a: argparse.Namespace, domain: int) -> dict[str, Any]:
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1")
    doc = yaml.safe_load(a.params_file.read_text())
    joints = list(next(iter(doc.values()))["ros__parameters"]["joint_names"])
    phases = 2 * a.pairs + 1
    listener = _Listener(domain)
    feed = node = None
    cpu: list[tuple[float, float]] = []
    stop_cpu = threading.Event()
    try:
        with open(a.log, "wb") as log:
            node = subprocess.Popen(_node_cmd(a), env=env, stdout=log, stderr=subprocess.STDOUT)
            sampler = threading.Thread(target=_cpu_sampler, args=(node.pid, cpu, stop_cpu), daemon=True)
            sampler.start()
            start = time.monotonic() + 600.0  # rescheduled once the node publishes chunks
            # the feed starts at once (low rate) so the node warms up on real input
            feed_start = time.monotonic() + 300.0
            deadline = time.monotonic() + 240.0
            feed = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "oxygen_ros.ros.ingress.feed",
                    "--joints",
                    *joints,
                    "--start",
                    repr(feed_start),
                    "--window",
                    str(a.window),
                    "--phases",
                    str(phases),
                    "--high-hz",
                    str(a.high_hz),
                ],
                env=env,
                stdout=subprocess.PIPE,
            )
            while len(listener.chunks) < 5:
                if time.monotonic() > deadline or node.poll() is not None:
                    raise RuntimeError(f"no action chunks from the node; see {a.log}")
                time.sleep(0.2)
            feed.terminate()  # restart with the real schedule (warm-up counted from now)
            feed.wait(10)
            start = time.monotonic() + a.warmup
            feed = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "oxygen_ros.ros.ingress.feed",
                    "--joints",
                    *joints,
                    "--start",
                    repr(start),
                    "--window",
                    str(a.window),
                    "--phases",
                    str(phases),
                    "--high-hz",
                    str(a.high_hz),
                ]
                + ([] if a.no_decoy else ["--decoy", "joint_states_decoy"]),
                env=env,
                stdout=subprocess.PIPE,
            )
            out, _ = feed.communicate(timeout=a.warmup + a.window * phases + 60)
            sent = json.loads(out.decode().strip().splitlines()[-1])
    finally:
        for proc in (feed, node):
            if proc is not None and proc.poll() is None:
                proc.send_signal(2)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        stop_cpu.set()
        listener.close()
    report = phase_report(listener.chunks, listener.diags, start, a.window, phases, a.settle, cpu)
    for row, n in zip(report["phases"], sent["joint_states"][1:], strict=False):
        row["joint_states_sent_per_s"] = n / a.window
    report["command"] = " ".join(["ingress_bench"] + (sys.argv[1:] if sys.argv else []))
    return report


def main(argv: list[str] | None = None) -> int:
    """Console script ``ingress_bench``: run the benchmark, print the table and the ratio."""
    a = _parse(argv)
    if a.domain is not None:
        report = _run(a, a.domain)
    else:
        from domain_coordinator import domain_id

        with domain_id() as dom:
            report = _run(a, dom)
    print(
        f"{'phase':>5} {'joints':>6} {'chunks':>6} {'period p50/p90 ms':>18} {'frame p50 ms':>12} "
        f"{'js sent/s':>9} {'js taken/s':>10} {'node CPU':>8}"
    )
    for r in report["phases"]:
        print(
            f"{r['phase']:>5} {r['joints']:>6} {r['chunks']:>6} {r['period_p50_ms']:>8.1f}/"
            f"{r['period_p90_ms']:<9.1f} {r['frame_p50_ms']:>12.1f} "
            f"{r.get('joint_states_sent_per_s', float('nan')):>9.0f} {r['joint_states_per_s']:>10.0f} "
            f"{r['node_cpu']:>8.2f}"
        )
    print("chunk-period ratio high/low per pair: " + ", ".join(f"{x:.3f}" for x in report["ratios"]))
    print(
        f"ratio median {report['ratio_median']:.3f} (range {report['ratio_min']:.3f}-"
        f"{report['ratio_max']:.3f}); target <= 1.2"
    )
    print(f"node CPU for the 1 kHz joint states (median high - median low phase): {report['ingress_cpu']:.3f} cores")
    if a.json is not None:
        a.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
