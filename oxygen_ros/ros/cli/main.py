"""The ``oxygen`` command (console script; also ``python -m oxygen_ros.ros.cli``): operate a running
``oxygen`` node without the ``ros2`` CLI — ask and listen to its language tasks, read its status,
its parameters and its lifecycle state.

Exit status: 0 success; 1 the operation failed (an answer that ended with a notice, a refused
parameter, a failed transition, a WARN/ERROR/STALE status, a timeout); 2 usage error, node or
service not found, or (``status``) no status within the timeout; 4 (``record``) an empty recording;
130 Ctrl-C (``listen``, ``status --watch`` and ``record``: 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TextIO

from oxygen_ros.core.process_exit import exit_now, run_then_exit
from oxygen_ros.ros.cli.lifecycle import TRANSITIONS

__all__ = ["DEFAULT_TIMEOUT_S", "build_parser", "entry", "main"]

#: ``--timeout`` when not given, by verb (``lifecycle`` transitions: ``configure`` loads the model).
DEFAULT_TIMEOUT_S = {
    "ask": 120.0,
    "instruct": 20.0,
    "record": 20.0,
    "listen": 20.0,
    "status": 20.0,
    "params": 20.0,
    "lifecycle": 20.0,
    "transition": 300.0,
}

_EXIT_CODES = """exit status: 0 success; 1 failed (answer ended with a notice, value refused, transition
failed, status not OK, timeout); 2 usage error, node or service not found, no status; 130 Ctrl-C."""
_ASK = """Publish TEXT once on the task's ask topic and print the answer as it streams.

Topics, QoS and the utterance header come from the node's parameters (tasks.<task>.ask_topic,
delta_topic, text_topic, ask_qos, text_qos, text_header). The answer is the utterance whose header
is [#N Q: TEXT] (text_header: ask). With text_header 'id' or 'none' it is the first utterance that
begins after the publish (with 'none': after the one streaming at the publish, if any), which may
be another client's ask made at the same moment. A '[request N waiting: ...]' notice is printed to
stderr and the wait goes on. Exit 0 when the answer finished, 1 when it ended with a notice
(rejected, expired, failed, cancelled), the node is not active, or the timeout passed."""
_ROS2 = {
    "ask": "ros2 topic echo /conversation/delta, then "
    "ros2 topic pub --once /ask std_msgs/String \"{data: 'What do you see?'}\"",
    "listen": "ros2 topic echo /conversation/text (one topic per command)",
    "record": "ros2 bag record -s mcap -o BAG TOPIC ...",
    "instruct": "ros2 topic pub --once /instruction std_msgs/String \"{data: 'fold the towel'}\"",
    "status": "ros2 topic echo /diagnostics",
    "params": "ros2 param list|get|set|describe /oxygen ...",
    "lifecycle": "ros2 lifecycle get|set /oxygen <transition>",
}


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be > 0")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0")
    return value


def _global_options(top_level: bool) -> argparse.ArgumentParser:
    """``--node`` and ``--timeout``: defaults on the top level only, so after the verb they override
    what came before it without resetting it (a fresh parser per use: argparse shares actions)."""
    opts = argparse.ArgumentParser(add_help=False)
    opts.add_argument(
        "--node",
        default="oxygen" if top_level else argparse.SUPPRESS,
        metavar="NAME",
        help="the node: name, or namespace/name like /robot/oxygen (default: oxygen)",
    )
    opts.add_argument(
        "--timeout",
        type=_positive,
        default=None if top_level else argparse.SUPPRESS,
        metavar="SEC",
        help="longest wait, seconds (default by verb: ask 120, lifecycle transitions 300, "
        "others 20; finding the node waits 5 unless --timeout is given)",
    )
    return opts


def build_parser() -> argparse.ArgumentParser:
    """The ``oxygen`` argument parser (``--node`` / ``--timeout`` go before or after the verb)."""
    top = argparse.ArgumentParser(
        prog="oxygen",
        parents=[_global_options(True)],
        epilog=_EXIT_CODES,
        description="Operate a running oxygen node (no ros2 CLI needed).",
    )
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(
        name: str,
        help_text: str,
        description: str | None = None,
        where: argparse._SubParsersAction[argparse.ArgumentParser] = verbs,
        ros2: str | None = None,
    ) -> argparse.ArgumentParser:
        equivalent = ros2 or _ROS2.get(name)
        return where.add_parser(
            name,
            parents=[_global_options(False)],
            help=help_text,
            description=description or help_text,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=(f"ros2 equivalent: {equivalent}\n" if equivalent else "") + _EXIT_CODES,
        )

    p = verb("ask", "ask a language task a question and print the streamed answer", _ASK)
    p.add_argument("text", metavar="TEXT", help="the question (quote it)")
    p.add_argument("--task", default="conversation", help="language task to ask (default: conversation)")

    p = verb(
        "instruct",
        "give the node its task instruction (what the policy is to do)",
        "Publish TEXT once on the node's instruction topic (instruction_topic, instruction_qos), after\n"
        "the node's subscription has matched, and wait until its /diagnostics shows it as the current\n"
        "instruction: every following observation carries it. The node must be configured.\n"
        "Exit 0 when the node took it, 1 when it did not within --timeout.",
    )
    p.add_argument("text", metavar="TEXT", help='the instruction (quote it), e.g. "fold the towel"')

    p = verb(
        "record",
        "record topics into a rosbag2 (mcap) folder, as ros2 bag record does",
        "Record TOPICs (types from the graph; a topic that appears later is picked up) into the\n"
        "rosbag2 folder BAG until --duration seconds, Ctrl-C or SIGTERM; the bag is finished in every\n"
        "case. Prints a count per topic. Exit 0; 2 BAG exists (without --overwrite); 4 EMPTY RECORDING:\n"
        "no message on any topic. Topics still absent after --timeout are named on stderr.",
    )
    p.add_argument("topics", nargs="+", metavar="TOPIC", help="topics to record (e.g. /joint_states /action_chunk)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="BAG", help="the bag folder to write")
    p.add_argument(
        "--duration",
        type=_positive,
        default=None,
        metavar="SEC",
        help="record SEC seconds, counted from the first topic subscribed",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing bag folder BAG")

    p = verb(
        "listen",
        "print the language tasks' utterances as they stream, one line each",
        'Print every finished utterance of the tasks as "<task>: <text>", streaming one at a time\n'
        "live where text_header marks utterance starts ('ask', 'id'); with 'none' whole lines.\n"
        "Stops after --count utterances, --duration seconds or Ctrl-C (exit 0).",
    )
    p.add_argument("tasks", nargs="*", metavar="TASK", help="tasks to listen to (default: the node's task_names)")
    p.add_argument("--count", type=_count, default=0, metavar="N", help="stop after N utterances (0: no limit)")
    p.add_argument("--duration", type=_positive, default=None, metavar="SEC", help="stop after SEC seconds")

    p = verb(
        "status",
        "print the node's status from /diagnostics",
        'Wait for the node\'s "<name>: inference" status on /diagnostics and print its level\n'
        "(OK, WARN, ERROR, STALE), message and key: value lines. Exit 0 for OK, 1 otherwise,\n"
        "2 when none arrives within --timeout.",
    )
    p.add_argument("--watch", action="store_true", help="print every status until Ctrl-C (exit 0)")
    p.add_argument(
        "--key",
        dest="keys",
        action="append",
        default=[],
        metavar="GLOB",
        help="print only keys matching GLOB (repeatable), e.g. --key 'requests_*'",
    )

    p = verb("params", "list, get, set or describe the node's parameters")
    params = p.add_subparsers(dest="params_verb", required=True, metavar="ACTION")
    q = verb("list", "list parameter names", where=params, ros2="ros2 param list /oxygen")
    q.add_argument("prefix", nargs="?", default="", metavar="PREFIX", help="only names starting with PREFIX")
    q.add_argument("--values", action="store_true", help="print name = value")
    q = verb("get", "print parameter values (name = value)", where=params, ros2="ros2 param get /oxygen NAME")
    q.add_argument("names", nargs="+", metavar="NAME")
    q = verb(
        "set",
        "set parameters",
        "Set parameters. VALUE is YAML as for ros2 param set: 2.0 double, 4 integer,\n"
        "true bool, [a, b] string array; an integer for a double parameter is sent as a\n"
        'double. Prints "set NAME = VALUE", or "refused NAME: <reason>" and exits 1. A value\n'
        "of another type than the parameter's, an integer beyond 64 bits or a name the node\n"
        "does not have is refused here, in type names, and not sent.",
        where=params,
        ros2="ros2 param set /oxygen NAME VALUE",
    )
    q.add_argument("pairs", nargs="+", metavar="NAME VALUE", help="one or more NAME VALUE pairs")
    q = verb(
        "describe",
        "print type, description, range and read-only flag",
        where=params,
        ros2="ros2 param describe /oxygen NAME",
    )
    q.add_argument("names", nargs="+", metavar="NAME")

    p = verb(
        "lifecycle",
        "get the node's lifecycle state or request a transition",
        'get: print the state. A transition prints "<node>: <from> -> <to>"; one not available\n'
        "from the current state is refused with the possible ones; a failed configure prints the\n"
        "node's reason (from /diagnostics). Exit 1 on failure.",
    )
    p.add_argument("transition", choices=("get",) + TRANSITIONS, metavar="{get," + ",".join(TRANSITIONS) + "}")
    return top


def _writer(stream: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


def _run(
    args: argparse.Namespace,
    timeout: float,
    out: Callable[[str], None],
    err: Callable[[str], None],
    settled: Callable[[int], None],
) -> int:
    """Find the node, run the verb and return its exit status; ``settled(status)`` is called once
    the status is known (its output written), before the command's node is shut down."""
    from oxygen_ros.ros.cli.peer import CliError, Peer

    # finding the node: NODE_DISCOVERY_S (a missing node says so at once), or as long as --timeout says
    with Peer(args.node, timeout, discovery_s=args.timeout) as peer:
        try:
            code = _dispatch(args, peer, out, err)
        except CliError as exc:
            err(f"oxygen {args.verb}: {exc}\n")
            code = exc.code
        except KeyboardInterrupt:
            code = _interrupted(args, err)
        settled(code)
    return code


def _interrupted(args: argparse.Namespace, err: Callable[[str], None]) -> int:
    """The exit status after Ctrl-C: 0 where watching is what the verb does, else 130."""
    watching = args.verb == "listen" or (args.verb == "status" and args.watch)
    err("\n")
    return 0 if watching else 130


def _dispatch(args: argparse.Namespace, peer: Any, out: Callable[[str], None], err: Callable[[str], None]) -> int:
    """Run the verb of ``args`` through ``peer``; its exit status."""
    from oxygen_ros.ros.cli import lifecycle, params, record, status, text

    if args.verb == "ask":
        return text.ask(peer, args.text, args.task, out, err)
    if args.verb == "record":
        return record.record(peer, args.topics, args.output, args.duration, args.overwrite, out, err)
    if args.verb == "instruct":
        return text.instruct(peer, args.text, out)
    if args.verb == "listen":
        return text.listen(peer, args.tasks, args.count, args.duration, out)
    if args.verb == "status":
        return status.status(peer, args.watch, args.keys, out)
    if args.verb == "lifecycle":
        return lifecycle.lifecycle(peer, args.transition, out, err)
    if args.params_verb == "list":
        return params.list_names(peer, args.prefix, args.values, out)
    if args.params_verb == "get":
        return params.get(peer, args.names, out)
    if args.params_verb == "describe":
        return params.describe(peer, args.names, out)
    return params.set_values(peer, list(zip(args.pairs[::2], args.pairs[1::2])), out)


#: Upper bound of a command's graph discovery and rclpy start/stop, seconds (for the watchdog).
DISCOVERY_BOUND_S = 30.0


def _watchdog(seconds: float, verb: str) -> threading.Timer:
    """End the process with status 1 and a line on stderr if it still runs after ``seconds``
    (a daemon timer: it never delays a normal exit); :func:`main` cancels it when it returns."""

    def fire() -> None:
        sys.stderr.write(f"oxygen {verb}: gave up after {seconds:g} s (no answer from the ROS graph)\n")
        exit_now(1)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


#: Upper bound of shutting the command's node down once its exit status is known, seconds.
TEARDOWN_BOUND_S = 10.0


def _exit_deadline(seconds: float, code: int) -> threading.Timer:
    """End the process with ``code`` (its output flushed) if it still runs after ``seconds``: the
    result is written, only the shutdown of rclpy/DDS is left, and that must not hang the command."""

    def fire() -> None:
        exit_now(code)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def main(argv: list[str] | None = None) -> int:
    """Run ``oxygen`` with ``argv`` (default: the command line); returns the exit status (module
    doc). Errors are one line on stderr (``oxygen <verb>: …``), never a traceback.

    Every wait has its deadline; a watchdog (``4 × timeout + 60`` s) bounds what rclpy/DDS could
    block outside them, and once the status is known the node's shutdown gets ``TEARDOWN_BOUND_S``
    before the process ends with that status (run as a process; in-process calls cancel both)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from oxygen_ros.ros.cli.peer import CliError  # rclpy: after the arguments (--help answers at once)

    if args.verb == "params" and args.params_verb == "set" and len(args.pairs) % 2:
        parser.error("params set takes NAME VALUE pairs")
    key = "transition" if args.verb == "lifecycle" and args.transition != "get" else args.verb
    timeout = args.timeout if args.timeout is not None else DEFAULT_TIMEOUT_S[key]
    out, err = _writer(sys.stdout), _writer(sys.stderr)
    endless = (
        (args.verb == "listen" and args.duration is None)
        or (args.verb == "status" and args.watch)
        or args.verb == "record"
    )  # record ends by --duration or a signal
    timers = [] if endless else [_watchdog(4 * timeout + 2 * DISCOVERY_BOUND_S, args.verb)]

    def settled(code: int) -> None:
        for timer in timers:
            timer.cancel()
        timers[:] = [_exit_deadline(TEARDOWN_BOUND_S, code)]

    try:
        return _run(args, timeout, out, err, settled)
    except CliError as exc:
        err(f"oxygen {args.verb}: {exc}\n")
        return exc.code
    except KeyboardInterrupt:  # before the node was found (after: handled in _run)
        return _interrupted(args, err)
    except BrokenPipeError:  # e.g. `oxygen listen | head -3`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        for timer in timers:  # main() returned (also when called in-process, e.g. by tests)
            timer.cancel()


def entry() -> NoReturn:
    """The ``oxygen`` process: :func:`main`, its output flushed, then the process ends with its
    status at once — rclpy's context is already shut down and its node destroyed, so nothing is left
    for the interpreter's own shutdown but native DDS threads, which must not hold the exit."""
    run_then_exit(main)


if __name__ == "__main__":
    entry()
