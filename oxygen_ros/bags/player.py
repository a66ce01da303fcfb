"""Play a rosbag2 over DDS at its recorded timing, like ``ros2 bag play`` (console ``bag_player``).

For machines without the ``ros2`` CLI / ``rosbag2_py`` (PyPI installs): the bag is read with
``rosbags`` and every message is published as the recorded serialized bytes (no re-encoding) from
an rclpy node, so subscribers — the ``oxygen`` node included — receive exactly what ``ros2 bag
play`` would send. Options follow ``ros2 bag play``: ``--rate``, ``--clock [HZ]`` (publish
``/clock`` from the bag time, for nodes with ``use_sim_time``), ``--topics``, ``--remap``,
``--start-offset``, ``--delay``; QoS per topic is adapted from the recorded publishers' offered
profiles (reliable unless one was best effort; transient-local only if all were).

``--record OUT --record-topics T ...`` also subscribes to the given topics (e.g. the node's
``/action_chunk`` and text topics) and writes what arrives into an mcap bag, so a node fed by the
player can be evaluated offline with the same tools as ``replay``'s output bag.

Exit status: 0 ok; 2 unusable bag/arguments (an existing ``--record`` folder without
``--overwrite`` included) or nothing to play — no message in the bag, on the ``--topics``, or
between ``--start-offset`` and ``--duration`` (one line says which); 3 the bag could not be read
to its end; 4 the recording is empty — no message on any ``--record-topics`` topic — or incomplete: a
topic with no message and no publisher at the end (the node never configured, so its publishers never
appeared; it exited; or the name is wrong). The bag is still written; the reason is printed per
topic.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from oxygen_ros.bags.reader import BagError, BagInput, msg_class
from oxygen_ros.core.process_exit import run_then_exit

__all__ = ["BagPlayer", "PlayStats", "build_parser", "entry", "main", "qos_from_recorded"]

_LATE_S = 0.05


def qos_from_recorded(profiles: Sequence[Any]) -> Any:
    """rclpy QoS for republishing a topic recorded with the offered ``profiles`` (rosbags Qos)."""
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
    from rosbags.interfaces import QosDurability, QosReliability

    best_effort = any(p.reliability == QosReliability.BEST_EFFORT for p in profiles)
    transient = bool(profiles) and all(p.durability == QosDurability.TRANSIENT_LOCAL for p in profiles)
    depth = max([int(p.depth) for p in profiles if int(p.depth) > 0] + [10])
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
        reliability=ReliabilityPolicy.BEST_EFFORT if best_effort else ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if transient else DurabilityPolicy.VOLATILE,
    )


@dataclass
class PlayStats:
    """What a playback did: messages published per (output) topic, messages published more than
    50 ms behind schedule and the worst lateness (s), clock messages, skipped topics (with why),
    the bag read error if any, wall time (s)."""

    published: Counter[str] = field(default_factory=Counter)
    late: int = 0
    max_late_s: float = 0.0
    clock: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    read_error: str | None = None
    lost: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0


class BagPlayer:
    """Publishes a bag's messages from ``node`` (an rclpy node of any context).

    Args:
        bag: the open input bag; node: publishing node.
        topics: bag topics to play (None: all whose message type is installed).
        remap: bag topic -> published topic.
        clock_hz: publish ``/clock`` at this rate (0: no clock).
    """

    def __init__(
        self,
        bag: BagInput,
        node: Any,
        topics: Sequence[str] | None = None,
        remap: dict[str, str] | None = None,
        clock_hz: float = 0.0,
    ) -> None:
        self.bag, self.node, self.remap = bag, node, dict(remap or {})
        self.stats = PlayStats()
        unknown = sorted(set(topics or ()) - set(bag.topics))
        if unknown:
            raise BagError(f"topics {unknown} are not in {bag.path} (it has {sorted(bag.topics)})")
        self.pubs: dict[str, Any] = {}
        for topic in topics or sorted(bag.topics):
            info = bag.topics[topic]
            try:
                cls = msg_class(info.msgtype)
            except BagError as exc:
                if topics:
                    raise
                self.stats.skipped[topic] = str(exc)
                continue
            self.pubs[topic] = node.create_publisher(cls, self.remap.get(topic, topic), qos_from_recorded(info.qos))
        if not self.pubs:
            raise BagError(
                f"nothing to play in {bag.path}: "
                + ("; ".join(f"{t}: {w}" for t, w in self.stats.skipped.items()) or "no topics")
            )
        if not bag.count(self.pubs):
            full = ", ".join(f"{t} ({i.count})" for t, i in sorted(bag.topics.items()) if i.count)
            raise BagError(
                f"nothing to play: {bag.path} has no message "
                + (
                    f"on {sorted(self.pubs)}; messages are on {full}"
                    if full
                    else f"at all (its topics {', '.join(sorted(bag.topics))} are empty)"
                )
            )
        self.clock_hz = clock_hz
        self._clock_pub = None
        if clock_hz > 0:
            from rclpy.qos import QoSProfile
            from rosgraph_msgs.msg import Clock

            self._clock_cls = Clock
            self._clock_pub = node.create_publisher(Clock, "/clock", QoSProfile(depth=10))

    def wait_for_subscribers(self, timeout: float, settle: float = 0.5, clock: bool = False) -> list[str]:
        """Wait up to ``timeout`` s until every publisher (with ``clock``, the ``/clock`` one too)
        has a subscriber, then ``settle`` s more; returns the topics still without one.

        A publisher sees a subscription before that subscription has matched the publisher in
        turn; messages sent in between are lost even when both are reliable (``ros2 bag play``
        has the same race, hence its ``--delay``), so playback starts ``settle`` s later.
        """
        pubs = dict(self.pubs) | ({"/clock": self._clock_pub} if clock and self._clock_pub is not None else {})
        end = time.monotonic() + timeout
        while True:
            missing = [t for t, p in pubs.items() if p.get_subscription_count() == 0]
            if not missing or time.monotonic() >= end:
                break
            time.sleep(0.05)
        if len(missing) < len(pubs):
            time.sleep(settle)
        return missing

    def _publish_clock(self, bag_ns: int) -> None:
        from builtin_interfaces.msg import Time

        assert self._clock_pub is not None  # only called with a clock period, i.e. clock_hz > 0
        self._clock_pub.publish(self._clock_cls(clock=Time(sec=bag_ns // 10**9, nanosec=bag_ns % 10**9)))
        self.stats.clock += 1

    def play(
        self,
        rate: float = 1.0,
        start_offset: float = 0.0,
        duration: float | None = None,
        stop: threading.Event | None = None,
        progress: bool = False,
    ) -> PlayStats:
        """Publish the messages at their recorded times x ``1/rate`` (blocking).

        Args:
            start_offset: skip this many bag seconds from the start.
            duration: play at most this many bag seconds after the offset (None: to the end).
            stop: set it to end playback early.
        """
        from tqdm import tqdm

        if not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        stop = stop or threading.Event()
        begin = self.bag.start_ns + round(start_offset * 1e9)
        end = None if duration is None else begin + round(duration * 1e9)
        wall0 = time.perf_counter()
        clock_period = 1.0 / self.clock_hz if self.clock_hz > 0 else None
        next_clock = wall0

        def bag_now() -> int:
            return begin + round((time.perf_counter() - wall0) * rate * 1e9)

        def wait_until(due: float) -> None:
            nonlocal next_clock
            while not stop.is_set():
                now = time.perf_counter()
                if clock_period is not None and now >= next_clock:
                    self._publish_clock(bag_now())
                    next_clock += clock_period
                    continue
                if now >= due:
                    return
                wake = due if clock_period is None else min(due, next_clock)
                stop.wait(min(wake - now, 0.1))

        bar = tqdm(total=self.bag.count(self.pubs), unit="msg", desc="playing", disable=not progress)
        for topic, log_ns, raw in self.bag.messages(self.pubs):
            if log_ns < begin:
                bar.update(1)
                continue
            if end is not None and log_ns >= end or stop.is_set():
                break
            due = wall0 + (log_ns - begin) / 1e9 / rate
            wait_until(due)
            if stop.is_set():
                break
            late = time.perf_counter() - due
            self.pubs[topic].publish(raw)
            self.stats.published[self.remap.get(topic, topic)] += 1
            if late > _LATE_S:
                self.stats.late += 1
            self.stats.max_late_s = max(self.stats.max_late_s, late)
            bar.update(1)
        bar.close()
        if clock_period is not None and not stop.is_set():
            self._publish_clock(bag_now())
        self.stats.read_error = self.bag.read_error
        if end is None and not stop.is_set() and not start_offset:
            self.stats.lost = self.bag.lost(self.pubs)
        self.stats.wall_s = time.perf_counter() - wall0
        return self.stats


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of ``bag_player``."""
    p = argparse.ArgumentParser(
        prog="bag_player",
        description=__doc__.split("\n\n")[0],
        epilog=" ".join(__doc__.split("\n\n")[-1].replace("``", "").split()),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("bag", type=Path, help="rosbag2 folder or .mcap file")
    p.add_argument("-r", "--rate", type=float, default=1.0)
    p.add_argument(
        "--clock",
        type=float,
        nargs="?",
        const=40.0,
        default=0.0,
        metavar="HZ",
        help="publish /clock at HZ (default 40 when given without a value)",
    )
    p.add_argument("--topics", nargs="+", default=None, help="play only these topics")
    p.add_argument("--remap", nargs="+", default=[], metavar="FROM:=TO")
    p.add_argument("--start-offset", type=float, default=0.0, help="skip this many bag seconds")
    p.add_argument("--duration", type=float, default=None, help="play this many bag seconds")
    p.add_argument("--delay", type=float, default=0.0, help="wall seconds to wait before playing")
    p.add_argument(
        "--wait-for-subscribers",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS until every played topic has a subscriber",
    )
    p.add_argument(
        "--record",
        type=Path,
        default=None,
        metavar="OUT",
        help="also record --record-topics into this mcap bag folder (new, or --overwrite); "
        "exit status 4 when the recording is empty (see below)",
    )
    p.add_argument("--record-topics", nargs="+", default=[], metavar="TOPIC")
    p.add_argument("--record-linger", type=float, default=2.0, help="seconds to keep recording after the bag ended")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --record bag")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """Play (and record) as the command line says; returns the exit status (module doc). The
    recording is closed and the rclpy context shut down before it returns."""
    args = build_parser().parse_args(argv)  # before rclpy: --help and a bad flag answer at once
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    remap = {}
    for item in args.remap:
        if ":=" not in item:
            print(f"bag_player: error: --remap {item!r} must be FROM:=TO", file=sys.stderr)
            return 2
        src, dst = item.split(":=", 1)
        remap[src] = dst
    if args.record is not None and not args.record_topics:
        print("bag_player: error: --record needs --record-topics", file=sys.stderr)
        return 2
    if args.record is not None and (args.record.exists() or args.record.is_symlink()) and not args.overwrite:
        print(
            f"bag_player: error: --record {args.record} already exists; pass --overwrite to replace it "
            "or choose another folder",
            file=sys.stderr,
        )
        return 2
    ctx = Context()
    rclpy.init(args=[], context=ctx, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    executor = recorder = spin = node = None
    empty: list[str] = []
    try:
        with BagInput(args.bag) as bag:
            node = rclpy.create_node("oxygen_bag_player", context=ctx)
            player = BagPlayer(bag, node, args.topics, remap, args.clock)
            for topic, why in player.stats.skipped.items():
                print(f"bag_player: skipping {topic}: {why}", file=sys.stderr)
            if args.record is not None:
                from oxygen_ros.bags.recorder import Recorder

                recorder = Recorder(node, args.record, args.record_topics, args.overwrite)
                executor = SingleThreadedExecutor(context=ctx)
                executor.add_node(node)
                spin = threading.Thread(target=lambda: _spin(executor, ctx, stop), daemon=True)
                spin.start()
                missing = recorder.subscribe(max(args.wait_for_subscribers, 1.0))
                absent = [t for t in missing if t not in recorder.subscribed]
                if absent:
                    print(f"bag_player: not (yet) in the graph, not recorded: {absent}", file=sys.stderr)
                if len(absent) < len(missing):
                    print(
                        f"bag_player: no publisher matched yet, may miss the first messages: "
                        f"{[t for t in missing if t not in absent]}",
                        file=sys.stderr,
                    )
            if args.wait_for_subscribers > 0:
                missing = player.wait_for_subscribers(args.wait_for_subscribers)
                if missing:
                    print(f"bag_player: no subscriber on {missing}; playing anyway", file=sys.stderr)
            stop.wait(args.delay)
            stats = player.play(args.rate, args.start_offset, args.duration, progress=args.progress)
            if recorder is not None:
                time.sleep(args.record_linger)
                empty = recorder.empty()
    except (BagError, ValueError) as exc:
        print(f"bag_player: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bag_player: interrupted", file=sys.stderr)
        return 130
    finally:
        stop.set()
        if spin is not None:
            spin.join(5)
        if recorder is not None:
            path = recorder.close()
            print(f"recorded {dict(recorder.writer.counts)} into {path}")
        if node is not None:  # Jazzy's Context.shutdown leaves the node in the graph (ros/distro.py)
            node.destroy_node()
        ctx.try_shutdown()
    print(
        f"played {sum(stats.published.values())} messages in {stats.wall_s:.1f} s "
        f"({stats.late} more than {_LATE_S * 1e3:.0f} ms late, worst {stats.max_late_s * 1e3:.1f} ms); "
        f"/clock {stats.clock}"
    )
    for topic, n in sorted(stats.published.items()):
        print(f"  {topic}: {n}")
    problems = ([stats.read_error] if stats.read_error else []) + [
        f"{n} unreadable messages on {t}" for t, n in stats.lost.items()
    ]
    for p in problems:
        print(f"bag_player: INCOMPLETE: {p}", file=sys.stderr)
    if not problems and not sum(stats.published.values()):
        print(
            f"bag_player: error: nothing played: no message of {args.topics or 'the bag'} between "
            f"--start-offset {args.start_offset:g} s and "
            + ("the end" if args.duration is None else f"--duration {args.duration:g} s")
            + f" (the bag spans {bag.duration_s:.3f} s)",
            file=sys.stderr,
        )
        return 2
    if empty:
        recorded = sum(recorder.writer.counts.values()) if recorder is not None else 0
        what = (
            "EMPTY RECORDING"
            if not recorded
            else f"INCOMPLETE RECORDING ({recorded} messages recorded, but not on every topic)"
        )
        print(
            f"bag_player: {what} in {args.record}: nothing was published on "
            f"{'the recorded topics' if not recorded else 'these'} "
            "(is the node configured and active? its log says 'active, ready'; is each topic one it publishes?):",
            file=sys.stderr,
        )
        for line in empty:
            print(f"  {line}", file=sys.stderr)
        return 4
    return 3 if problems else 0


def _spin(executor: Any, ctx: Any, stop: threading.Event) -> None:
    while ctx.ok() and not stop.is_set():
        try:
            executor.spin_once(timeout_sec=0.05)
        except Exception:  # noqa: BLE001 - shutdown races end the thread
            return


def entry() -> NoReturn:
    """The ``bag_player`` process: :func:`main`, then the process ends with its status, its output
    flushed, without the interpreter's teardown of native DDS threads, which can hang or crash a
    command that has finished (:mod:`oxygen_ros.core.process_exit`)."""
    run_then_exit(main)


if __name__ == "__main__":
    entry()
