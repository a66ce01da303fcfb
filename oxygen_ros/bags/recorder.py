"""Record topics from the ROS graph into an mcap bag (``bag_player --record``), with rosbags.

For machines without ``ros2 bag record``: subscribes (reliable, depth 1000) to each topic once its
type is visible in the graph, waits until it has matched a publisher, and writes every message's CDR bytes as
received (a raw subscription: nothing is decoded or
re-encoded) through :class:`~oxygen_ros.bags.writer.BagOutput`, with the receiving node's clock as log
time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oxygen_ros.bags.reader import BagError, msg_class
from oxygen_ros.bags.writer import BagOutput

__all__ = ["Recorder"]


class Recorder:
    """Subscribes to ``topics`` (types from the graph, waited for) and writes them to a bag."""

    def __init__(self, node: Any, out: Path, topics: Sequence[str], overwrite: bool = False) -> None:
        self.node = node
        self.topics = ["/" + t.lstrip("/") for t in topics]  # the graph lists absolute names
        self.writer = BagOutput(out, overwrite=overwrite)
        self._lock = threading.Lock()
        self._subs: dict[str, Any] = {}
        self.unavailable: dict[str, str] = {}  # topic -> why it cannot be subscribed (type not installed)

    def subscribe(self, timeout: float, settle: float = 0.5) -> list[str]:
        """Subscribe to every topic whose type is known in the graph and wait until each
        subscription has matched a publisher, within ``timeout`` s, then ``settle`` s more (the
        publisher side matches a little after the subscriber side; a reliable message published
        before that is lost, as in ``wait_for_subscribers``). Returns the topics not found or not
        matched."""
        end = time.monotonic() + timeout
        while True:
            graph = dict(self.node.get_topic_names_and_types())
            for topic in self.topics:
                # subscribe once a publisher is known: its offered QoS picks ours (a topic the graph lists
                # only for a subscriber, e.g. the node's /joint_states, has no reliability to match yet)
                if (
                    topic not in self._subs
                    and topic not in self.unavailable
                    and graph.get(topic)
                    and self.node.count_publishers(topic) > 0
                ):
                    try:
                        cls = msg_class(graph[topic][0])
                    except BagError as exc:
                        self.unavailable[topic] = str(exc)
                        continue
                    self._subs[topic] = self.node.create_subscription(  # CDR bytes as received
                        cls,
                        topic,
                        lambda m, t=topic, k=graph[topic][0]: self._write(t, k, m),
                        self._qos(topic),
                        raw=True,
                    )
            missing = [t for t in self.topics if t not in self._subs or self._subs[t].get_publisher_count() == 0]
            if not missing or time.monotonic() >= end:
                break
            time.sleep(0.1)
        if len(missing) < len(self.topics):
            time.sleep(settle)
        return missing

    def _qos(self, topic: str) -> Any:
        """Reliable, depth 1000 — best effort when a publisher of ``topic`` offers only that (a
        reliable reader never matches a best-effort writer: cameras, joint states)."""
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        offered = [i.qos_profile.reliability for i in self.node.get_publishers_info_by_topic(topic)]
        best_effort = any(r == ReliabilityPolicy.BEST_EFFORT for r in offered)
        return QoSProfile(
            depth=1000, reliability=ReliabilityPolicy.BEST_EFFORT if best_effort else ReliabilityPolicy.RELIABLE
        )

    @property
    def subscribed(self) -> list[str]:
        """Topics subscribed so far (their type was found in the graph)."""
        return list(self._subs)

    def publishers(self, topic: str) -> int:
        """Publishers of ``topic`` now (matched by its subscription, else counted in the graph)."""
        sub = self._subs.get(topic)
        count: int = sub.get_publisher_count() if sub is not None else self.node.count_publishers(topic)
        return count

    def empty(self) -> list[str]:
        """Why the recording is empty, one line per topic that recorded nothing — or ``[]`` when it
        is not. It is empty when no topic recorded a message, or when a topic recorded nothing and
        has no publisher at the end (never in the graph, or its publisher went away: the node never
        configured, exited, or the name is wrong). Call before :meth:`close`, while the node spins."""
        with self._lock:
            counts = dict(self.writer.counts)
        silent = [(t, self.publishers(t)) for t in self.topics if not counts.get(t)]
        if len(silent) < len(self.topics) and all(n for _, n in silent):
            return []
        lines = []
        for topic, n in silent:
            if topic not in self._subs:
                why = "never in the graph" if n == 0 else "its publisher appeared after recording began: not subscribed"
            else:
                why = "no publisher at the end" if n == 0 else f"{n} publisher(s), nothing published"
            lines.append(f"{topic}: no message ({why})")
        return lines

    def _write(self, topic: str, msgtype: str, data: bytes) -> None:
        with self._lock:
            self.writer.write_raw(topic, msgtype, self.node.get_clock().now().nanoseconds, data)

    def close(self) -> Path:
        """Finish the bag."""
        with self._lock:
            return self.writer.close()
