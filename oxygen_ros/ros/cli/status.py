"""``oxygen status``: the node's ``<name>: inference`` DiagnosticStatus from ``/diagnostics``
(:mod:`oxygen_ros.ros.node_status`), printed readably.

The status is matched by name: ``<node name>: inference`` (without namespace, as the node names
it), so two ``oxygen`` nodes of the same name in different namespaces cannot be told apart here.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus

from oxygen_ros.ros.cli.peer import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, Peer
from oxygen_ros.ros.qos import reliable_qos

__all__ = ["LEVELS", "StatusWatch", "format_status", "level_of", "status"]

#: DiagnosticStatus levels by number.
LEVELS = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}


def level_of(st: DiagnosticStatus) -> int:
    """The status level as an int (rclpy gives the ``byte`` field as ``bytes``)."""
    lvl = st.level
    return lvl[0] if isinstance(lvl, (bytes, bytearray)) else int(lvl)


def format_status(st: DiagnosticStatus, node: str, keys: Sequence[str] = ()) -> str:
    """``<LEVEL> <node>: <message>``, then ``  key: value`` lines (all, or those matching one of
    the glob patterns ``keys``), ending with a newline."""
    level = level_of(st)
    lines = [f"{LEVELS.get(level, str(level))} {node}: {st.message}"]
    lines += [
        f"  {kv.key}: {kv.value}" for kv in st.values if not keys or any(fnmatch.fnmatchcase(kv.key, k) for k in keys)
    ]
    return "\n".join(lines) + "\n"


class StatusWatch:
    """Collects the node's statuses from ``/diagnostics`` (subscribed on creation)."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.name = f"{peer.name}: inference"
        self.received: list[DiagnosticStatus] = []
        peer.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_msg, reliable_qos())

    def _on_msg(self, msg: DiagnosticArray) -> None:
        self.received.extend(st for st in msg.status if st.name == self.name)

    def next(
        self, timeout: float, pred: Callable[[DiagnosticStatus], bool] = lambda st: True
    ) -> DiagnosticStatus | None:
        """The next status (from now on) for which ``pred`` holds, or None after ``timeout`` s."""
        start = len(self.received)

        def found() -> DiagnosticStatus | None:
            return next((st for st in self.received[start:] if pred(st)), None)

        self.peer.spin_until(found, timeout)
        return found()


def status(peer: Peer, watch: bool, keys: Sequence[str], write: Callable[[str], None]) -> int:
    """Wait for the node's status and write it (:func:`format_status`); with ``watch`` write every
    status until Ctrl-C (separated by ``---`` lines).

    Returns:
        0 when the (last) status is OK, 1 for WARN / ERROR / STALE.

    Raises:
        CliError: (code 2) node not found, or no status within the peer's timeout.
    """
    peer.find_node()
    statuses = StatusWatch(peer)
    first = True
    while True:
        statuses.received.clear()
        st = statuses.next(peer.timeout)
        if st is None:
            raise CliError(
                f'no status "{statuses.name}" on /diagnostics within {peer.timeout:g} s '
                f"(diagnostics_period_s longer than --timeout?)",
                EXIT_USAGE,
            )
        write(("" if first else "---\n") + format_status(st, peer.fqn, keys))
        first = False
        if not watch:
            return EXIT_OK if level_of(st) == 0 else EXIT_FAILED
