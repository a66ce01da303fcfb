"""``oxygen lifecycle get|configure|activate|deactivate|cleanup|shutdown``: the node's lifecycle
through the ``lifecycle_msgs`` services ``<node>/get_state``, ``<node>/get_available_transitions``
and ``<node>/change_state``.

A transition is looked up by its label among the ones available from the current state, so one
that is not valid there is refused with the list of those that are (``shutdown`` is whichever of
the three shutdown transitions the state has). When *configure* fails, the reason is read from the
node's ``/diagnostics`` status (``configure failed: …``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rclpy is imported by lifecycle(): the parser reads TRANSITIONS before any ROS import
    from oxygen_ros.ros.cli.peer import Peer

__all__ = ["TRANSITIONS", "lifecycle"]

#: The transitions ``oxygen lifecycle`` can request (labels of ``lifecycle_msgs/Transition``).
TRANSITIONS = ("configure", "activate", "deactivate", "cleanup", "shutdown")
#: Longest wait for the status that carries a configure error.
_STATUS_WAIT_S = 10.0


def lifecycle(peer: Peer, verb: str, write: Callable[[str], None], err: Callable[[str], None]) -> int:
    """``get``: write ``<node>: <state>``. A transition: request it and write
    ``<node>: <from> -> <to>``; on failure write the state it is left in and (configure) the
    node's reason to ``err``.

    Returns:
        0 on success, 1 when the transition failed.

    Raises:
        CliError: node or lifecycle services not found (code 2); a transition not available from
            the current state, or no answer within the timeout (code 1).
    """
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState, GetAvailableTransitions

    from oxygen_ros.ros.cli.peer import EXIT_FAILED, EXIT_OK, CliError
    from oxygen_ros.ros.cli.status import StatusWatch

    peer.find_node()
    before = peer.lifecycle_state()
    if verb == "get":
        write(f"{peer.fqn}: {before}\n")
        return EXIT_OK
    available = peer.call(
        GetAvailableTransitions, "get_available_transitions", GetAvailableTransitions.Request()
    ).available_transitions
    match = [t.transition for t in available if t.transition.label == verb]
    if not match:
        labels = ", ".join(sorted({t.transition.label for t in available})) or "none"
        raise CliError(f"cannot {verb} {peer.fqn} from state {before!r} (possible: {labels})")
    statuses = StatusWatch(peer) if verb == "configure" else None  # subscribed before the transition
    ok = peer.call(
        ChangeState,
        "change_state",
        ChangeState.Request(transition=Transition(id=match[0].id, label=verb)),
        idempotent=False,
    ).success
    after = peer.lifecycle_state()
    if ok:
        write(f"{peer.fqn}: {before} -> {after}\n")
        return EXIT_OK
    err(f"{verb} failed: {peer.fqn} is {after}\n")
    if statuses is not None:
        st = statuses.next(min(peer.timeout, _STATUS_WAIT_S), lambda s: s.message.startswith("configure failed"))
        hint = f"the reason is on /diagnostics: oxygen status --node {peer.fqn}"
        err(f"{st.message if st is not None else hint}\n")
    return EXIT_FAILED
