"""``oxygen record``: record topics of the live graph into a rosbag2 (mcap) folder, where the ``ros2
bag`` CLI is not installed (this venv, the PyPI install).

Each topic's type is read from the graph; a topic that is not there yet is subscribed as soon as it
appears. Messages are written with rosbags (:class:`~oxygen_ros.bags.recorder.Recorder`), stamped
with the time they were received. Recording stops after ``--duration`` seconds, on Ctrl-C (SIGINT)
or SIGTERM; the bag is finished in every case and appears at ``-o`` only then, readable by
``replay``, ``bag_player``, ``norm_stats`` and ``ros2 bag``. ``--duration`` counts from the moment the first
topic is subscribed (graph discovery takes a moment); when none appears within ``--timeout`` the
recording ends empty.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from oxygen_ros.ros.cli.peer import EXIT_USAGE, CliError, Peer

__all__ = ["EXIT_EMPTY", "record"]

#: Exit status of a recording in which no topic received a message.
EXIT_EMPTY = 4


def record(
    peer: Peer,
    topics: Sequence[str],
    out_path: Path,
    duration: float | None,
    overwrite: bool,
    out: Callable[[str], None],
    err: Callable[[str], None],
) -> int:
    """Record ``topics`` into the bag folder ``out_path`` for ``duration`` seconds from the first topic
    whose subscription matched a publisher (None: until Ctrl-C / SIGTERM), then print one line per topic with its
    message count.

    Topics not in the graph after the peer's timeout are named on stderr once (recording goes on
    and picks them up if they appear); a topic whose message type is not installed is named and
    skipped.

    Returns:
        0: something was recorded; :data:`EXIT_EMPTY` (4): nothing at all (``EMPTY RECORDING``,
        with the reason per topic).

    Raises:
        CliError: ``out_path`` exists without ``overwrite``, or is not a bag folder (code 2).
    """
    from oxygen_ros.bags.reader import BagError
    from oxygen_ros.bags.recorder import Recorder

    if (out_path.exists() or out_path.is_symlink()) and not overwrite:
        raise CliError(f"{out_path} exists; choose another -o or pass --overwrite to replace it", EXIT_USAGE)
    try:
        rec = Recorder(peer.node, out_path, topics, overwrite)
    except BagError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    stop = [False]
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    start = time.monotonic()
    end = None  # --duration counts from the first topic subscribed (discovery takes its time)
    warned = False
    next_look = 0.0
    matched: set[str] = set()
    err(
        f"recording {', '.join(rec.topics)} into {out_path} ({f'for {duration:g} s' if duration else 'until Ctrl-C'})\n"
    )
    try:
        while not stop[0] and (end is None or time.monotonic() < end):
            now = time.monotonic()
            if now >= next_look:  # subscribe to topics that appeared since
                rec.subscribe(0.0, settle=0.0)
                next_look = now + 0.2
                for topic in rec.subscribed:  # matched a publisher: its messages arrive from now on
                    if topic not in matched and rec.publishers(topic) > 0:
                        matched.add(topic)
                        err(f"oxygen record: {topic} subscribed\n")
                for topic in list(rec.unavailable):
                    err(f"oxygen record: {topic} not recorded: {rec.unavailable.pop(topic)}\n")
            if duration is not None and end is None and matched:
                end = now + duration
            if not warned and now - start > peer.timeout:
                absent = [t for t in rec.topics if t not in rec.subscribed]
                if absent:
                    err(
                        f"oxygen record: not in the graph after {peer.timeout:g} s: {absent} "
                        "(recording the others; they are picked up if they appear)\n"
                    )
                warned = True
                if duration is not None and not matched:
                    break  # nothing to record appeared: an empty recording, said below
            peer.spin_for(0.1 if end is None else min(0.1, max(0.0, end - now)))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    empty = rec.empty() if not any(rec.writer.counts.values()) else []
    counts = dict(rec.writer.counts)
    path = rec.close()
    for topic in rec.topics:
        out(f"  {topic}: {counts.get(topic, 0)} messages\n")
    out(f"recorded {sum(counts.values())} messages in {time.monotonic() - start:.1f} s into {path}\n")
    silent = [t for t in rec.topics if not counts.get(t)]
    if not empty and silent:
        err(f"oxygen record: no message on {silent}\n")
    if empty:
        err(f"oxygen record: EMPTY RECORDING in {path}: nothing was received on any topic\n")
        for line in empty:
            err(f"  {line}\n")
        return EXIT_EMPTY
    return 0
