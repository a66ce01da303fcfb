"""``oxygen ask``, ``oxygen listen`` and ``oxygen instruct``: language tasks over the node's ask, delta and
text topics, and the task instruction over its instruction topic.

Topics, QoS profiles and the utterance header are read from the node's parameters
(``tasks.<task>.ask_topic`` / ``delta_topic`` / ``text_topic``, ``ask_qos``, ``text_qos``,
``text_header``); relative topic names resolve against the node's namespace. How the answer is
picked out of the streams: :mod:`oxygen_ros.ros.cli.utterances`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

from rclpy.qos import QoSProfile
from std_msgs.msg import String

from oxygen_ros.ros.cli.peer import EXIT_USAGE, CliError, Peer, resolve_topic
from oxygen_ros.ros.cli.utterances import AskReader, LinePrinter
from oxygen_ros.ros.qos import qos_from_name, reliable_qos, text_qos

__all__ = ["ask", "instruct", "listen"]

#: After the node's own endpoint is matched, how long to wait for the topic's other endpoints too.
_OTHERS_GRACE_S = 2.0


def _qos(name: object, fallback: Callable[[], QoSProfile]) -> QoSProfile:
    try:
        return qos_from_name(str(name))
    except ValueError:
        return fallback()


def _task_topics(peer: Peer, tasks: Sequence[str], keys: Sequence[str]) -> dict[str, dict[str, str]]:
    """``{task: {key: resolved topic}}`` for ``tasks.<task>.<key>_topic``.

    Raises:
        CliError: (code 2) a task the node does not have (naming the ones it has).
    """
    names = [f"tasks.{t}.{k}_topic" for t in tasks for k in keys]
    values = peer.parameters(names + ["task_names"])
    out = {}
    for t in tasks:
        if any(values[f"tasks.{t}.{k}_topic"] is None for k in keys):
            have = ", ".join(values["task_names"] or [])
            raise CliError(f"{peer.fqn} has no language task {t!r} (task_names: {have})", EXIT_USAGE)
        out[t] = {
            k: values[f"tasks.{t}.{k}_topic"]
            and resolve_topic(values[f"tasks.{t}.{k}_topic"], peer.namespace, peer.fqn)
            for k in keys
        }
    return out


def _node_matched(peer: Peer, matched: Callable[[], int], topic: str, publishers: bool, since: list[float]) -> bool:
    """True when our publisher / subscription on ``topic`` (``matched``: its count of matched
    endpoints, e.g. ``publisher.get_subscription_count``) has matched the node's endpoint and,
    within a short grace, every other endpoint of the topic in the graph."""
    graph = (
        peer.node.get_publishers_info_by_topic(topic)
        if publishers
        else peer.node.get_subscriptions_info_by_topic(topic)
    )
    others = [i for i in graph if (i.node_name, i.node_namespace) != (peer.node.get_name(), "/")]
    if not any((i.node_name, i.node_namespace) == (peer.name, peer.namespace) for i in others):
        return False
    count = matched()
    if count < 1:
        return False
    if not since:
        since.append(time.monotonic())
    return count >= len(others) or time.monotonic() - since[0] > _OTHERS_GRACE_S


def ask(peer: Peer, question: str, task: str, out: Callable[[str], None], err: Callable[[str], None]) -> int:
    """Publish ``question`` once on the task's ask topic and write the answer's deltas to ``out``
    as they stream (the header left out, a newline at the end); waiting notices and the reason of
    an answer that ended with a notice go to ``err``.

    Returns:
        0: the answer finished; 1: it ended with a notice (rejected, expired, failed, cancelled).

    Raises:
        CliError: node, task or topic missing (code 2); node not active, or no answer within the
            peer's timeout (code 1, saying what was waited for).
    """
    if not question.strip():
        raise CliError("the ask is empty", EXIT_USAGE)
    deadline = time.monotonic() + peer.timeout
    peer.find_node()
    topics = _task_topics(peer, [task], ("ask", "delta", "text"))[task]
    values = peer.parameters(["text_qos", "ask_qos", "text_header"])
    if not topics["ask"]:
        raise CliError(f"task {task!r} takes no asks (tasks.{task}.ask_topic is empty)", EXIT_USAGE)
    state = peer.lifecycle_state()
    if state != "active":
        raise CliError(f"{peer.fqn} is {state}: asks are ignored until it is active (oxygen lifecycle activate)")
    reader = AskReader(question, str(values["text_header"] or "ask"), out, err)
    qos = _qos(values["text_qos"], text_qos)
    subs = [
        peer.node.create_subscription(String, topics["delta"], lambda m: reader.delta(m.data), qos),
        peer.node.create_subscription(String, topics["text"], lambda m: reader.text(m.data), qos),
    ]
    pub = peer.node.create_publisher(String, topics["ask"], _qos(values["ask_qos"], reliable_qos))
    waits: list[tuple[Callable[[], int], str, bool, list[float]]] = [
        (pub.get_subscription_count, topics["ask"], False, []),
        (subs[0].get_publisher_count, topics["delta"], True, []),
        (subs[1].get_publisher_count, topics["text"], True, []),
    ]
    for matched, topic, publishers, since in waits:
        if not peer.spin_until(
            functools.partial(_node_matched, peer, matched, topic, publishers, since),
            max(0.0, deadline - time.monotonic()),
        ):
            side = "publisher" if publishers else "subscription"
            raise CliError(
                f"timed out after {peer.timeout:g} s waiting for the {side} of {peer.fqn} on {topic} "
                f"to match (is the node configured? remapped topics?)"
            )
    pub.publish(String(data=question))
    reader.published()
    if peer.spin_until(lambda: reader.done, max(0.0, deadline - time.monotonic())) and reader.code is not None:
        return reader.code  # (done: the code is set)
    if reader.request_id is None:
        what = f"an utterance answering it to begin on {topics['delta']} or end on {topics['text']}"
    else:
        what = f"request #{reader.request_id} to end on {topics['text']} ({reader.deltas} deltas so far)"
    out("\n" if reader.deltas else "")
    raise CliError(f"timed out after {peer.timeout:g} s: asked {question!r} on {topics['ask']}, waited for {what}")


def listen(peer: Peer, tasks: Sequence[str], count: int, duration: float | None, write: Callable[[str], None]) -> int:
    """Write every finished utterance of ``tasks`` (default: the node's ``task_names``) as a line
    ``<task>: <text>``, streamed live where the header allows (see
    :class:`~oxygen_ros.ros.cli.utterances.LinePrinter`), until ``count`` utterances (0: no limit)
    or ``duration`` seconds (None: no limit) or Ctrl-C.

    Returns:
        0.

    Raises:
        CliError: node or task missing (code 2).
    """
    peer.find_node()
    values = peer.parameters(["task_names", "text_qos", "text_header"])
    tasks = list(tasks) or list(values["task_names"] or [])
    if not tasks:
        raise CliError(f"{peer.fqn} has no language tasks (task_names is empty)", EXIT_USAGE)
    topics = _task_topics(peer, tasks, ("delta", "text"))
    printer = LinePrinter(tasks, str(values["text_header"] or "ask"), write)
    qos = _qos(values["text_qos"], text_qos)
    for t in tasks:
        peer.node.create_subscription(String, topics[t]["delta"], lambda m, t=t: printer.delta(t, m.data), qos)
        peer.node.create_subscription(String, topics[t]["text"], lambda m, t=t: printer.text(t, m.data), qos)
    peer.spin_for(duration, stop=lambda: count > 0 and printer.finished >= count)
    return 0


def instruct(peer: Peer, instruction: str, out: Callable[[str], None]) -> int:
    """Give the node its task instruction: publish ``instruction`` once on its ``instruction_topic``
    (with its ``instruction_qos``) after the node's subscription has matched, then wait for the
    node's ``/diagnostics`` to show it as the current ``instruction`` (the following observations
    carry it) and write ``instruction set: <text>``.

    Returns:
        0: the node took it.

    Raises:
        CliError: empty or too long (``max_instruction_chars``) text, node missing (code 2); node
            not configured, no match or no confirmation within the peer's timeout (code 1).
    """
    from oxygen_ros.ros.cli.status import StatusWatch
    from oxygen_ros.ros.node_status import INSTRUCTION_SHOWN

    if not instruction.strip():
        raise CliError("the instruction is empty", EXIT_USAGE)
    deadline = time.monotonic() + peer.timeout
    peer.find_node()
    values = peer.parameters(["instruction_topic", "instruction_qos", "max_instruction_chars"])
    limit = values["max_instruction_chars"]
    if isinstance(limit, int) and len(instruction) > limit:
        raise CliError(
            f"the instruction has {len(instruction)} characters, more than the node's max_instruction_chars = {limit}",
            EXIT_USAGE,
        )
    state = peer.lifecycle_state()
    if state not in ("inactive", "active"):
        raise CliError(f"{peer.fqn} is {state}: it takes instructions once configured (oxygen lifecycle configure)")
    topic = resolve_topic(str(values["instruction_topic"]), peer.namespace, peer.fqn)
    statuses = StatusWatch(peer)
    pub = peer.node.create_publisher(String, topic, _qos(values["instruction_qos"], reliable_qos))
    since: list[float] = []
    if not peer.spin_until(
        lambda: _node_matched(peer, pub.get_subscription_count, topic, False, since),
        max(0.0, deadline - time.monotonic()),
    ):
        raise CliError(
            f"timed out after {peer.timeout:g} s waiting for the subscription of {peer.fqn} on {topic} "
            "to match (remapped topic?)"
        )
    pub.publish(String(data=instruction))
    shown = instruction[:INSTRUCTION_SHOWN]
    took = statuses.next(
        max(0.0, deadline - time.monotonic()),
        lambda st: any(kv.key == "instruction" and kv.value == shown for kv in st.values),
    )
    if took is None:
        raise CliError(
            f"published on {topic}, but {peer.fqn}'s /diagnostics did not show it as its instruction "
            f"within {peer.timeout:g} s (see its log: refused?)"
        )
    out(f"instruction set: {instruction}\n")
    return 0
