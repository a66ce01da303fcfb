"""The ``oxygen`` command's pieces without a node: reading an ask's answer and the listen lines out
of delta/text streams (every ``text_header``, cross-topic reordering, waiting and end notices),
parameter values as YAML, node and topic names, argument parsing."""

from __future__ import annotations

import pytest
from rcl_interfaces.msg import ParameterType as P

from oxygen_ros.ros.cli.main import build_parser, main
from oxygen_ros.ros.cli.params import format_value, parse_value
from oxygen_ros.ros.cli.peer import CliError, from_parameter_value, resolve_topic, split_node_name
from oxygen_ros.ros.cli.utterances import AskReader, LinePrinter, end_notice, split_header, waiting_notice
from oxygen_ros.streams.text import TaskTextStream


def _reader(ask: str, header: str = "ask") -> tuple[AskReader, list[str], list[str]]:
    out: list[str] = []
    err: list[str] = []
    return AskReader(ask, header, out.append, err.append), out, err


def _stream(header: str, rid: int, ask: str, deltas: list[str], notice: str | None = None) -> tuple[list[str], str]:
    """What the node publishes for one utterance: (delta messages, text message)."""
    s = TaskTextStream(header)
    s.open(rid, ask)
    emits = [e for d in deltas for e in s.delta(rid, d)] + s.end(rid, "".join(deltas), notice)
    return [e.text for e in emits if e.kind == "delta"], next(e.text for e in emits if e.kind == "text")


def test_the_answer_to_this_ask_streams_and_ends_with_its_text():
    r, out, err = _reader("What  do you\nsee?")
    old_d, old_t = _stream("ask", 4, "What do you see?", ["old"])
    for d in old_d:  # an earlier identical ask, before the publish: not ours
        r.delta(d)
    r.published()
    r.text(old_t)
    d, t = _stream("ask", 5, "What do you see?", ["A red", " cube"])
    for x in d:
        r.delta(x)
    assert "".join(out) == "A red cube" and not r.done and r.request_id == 5
    r.delta("[#6] ")  # the next utterance begins before our text arrives: not printed
    r.delta("noise")
    r.text(t)
    assert (r.code, "".join(out), err) == (0, "A red cube\n", [])


@pytest.mark.parametrize("text_first", [False, True])
def test_an_ask_holding_brackets_is_still_found(text_first):
    r, out, _ = _reader("is [x] here?")
    r.published()
    d, t = _stream("ask", 3, "is [x] here?", ["yes", " ] it is"])
    for msg in [t] + d if text_first else d + [t]:
        (r.text if msg is t else r.delta)(msg)
    assert (r.code, "".join(out), r.request_id) == (0, "yes ] it is\n", 3)
    assert split_header("[#3 Q: is [x] here?] yes", "is [x] here?") == (3, "is [x] here?", "yes")


def test_the_text_may_arrive_before_the_deltas():
    r, out, _ = _reader("hi")
    r.published()
    d, t = _stream("ask", 2, "hi", ["hel", "lo"])
    r.text(t)
    for x in d:
        r.delta(x)
    assert (r.code, "".join(out)) == (0, "hello\n")


def test_waiting_notice_is_not_the_end_and_an_end_notice_is_exit_1():
    r, out, err = _reader("hi")
    r.published()
    r.text("[request 3 waiting: no camera input yet; it waits up to 30.0 s (engine.max_queue_wait_s)]")
    assert not r.done and err == [
        "[request 3 waiting: no camera input yet; it waits up to 30.0 s (engine.max_queue_wait_s)]\n"
    ]
    d, t = _stream("ask", 3, "hi", ["so"], "[request 3 expired: waited 30.0 s]")
    for x in d:
        r.delta(x)
    r.text(t)
    assert r.code == 1 and "".join(out) == "so\n"  # the notice is not the answer: stdout has the answer only
    assert err[-1] == "request 3 expired: waited 30.0 s\n"
    r, out, err = _reader("hi")  # expired before any token: nothing on stdout, the reason on stderr
    r.published()
    d, t = _stream("ask", 4, "hi", [], "[request 4 expired: waited 30.0 s]")
    for x in d:
        r.delta(x)
    r.text(t)
    assert (r.code, out, err) == (1, [], ["request 4 expired: waited 30.0 s\n"])


@pytest.mark.parametrize("header", ["id", "none"])
def test_without_the_question_in_the_header_the_first_utterance_after_the_publish(header):
    r, out, _ = _reader("hi", header)
    d1, t1 = _stream(header, 1, "x", ["one ", "two"])
    r.delta(d1[0])  # an utterance is streaming at the publish
    r.published()
    for x in d1[1:]:
        r.delta(x)
    r.text(t1)
    assert not r.done and out == []
    d2, t2 = _stream(header, 2, "hi", ["three"])
    for x in d2:
        r.delta(x)
    r.text(t2)
    assert (r.code, "".join(out)) == (0, "three\n")


def test_listen_lines_stream_one_task_at_a_time_in_order():
    out: list[str] = []
    p = LinePrinter(["conversation", "memory"], "ask", out.append)
    p.delta("memory", "tail of one begun before listening")  # no header seen: not shown live
    p.text("memory", "[#1] whole of it")
    p.delta("memory", "[#2] ")
    p.delta("memory", "hello")
    p.delta("conversation", "[#3 Q: hi] ")
    p.delta("conversation", "yo")
    assert "".join(out) == "memory: [#1] whole of it\nmemory: [#2] hello"
    p.text("conversation", "[#3 Q: hi] yo!")  # waits for the open line
    p.text("memory", "[request 9 waiting: no camera input yet]")
    p.delta("memory", " world")
    p.text("memory", "[#2] hello world")
    assert "".join(out) == (
        "memory: [#1] whole of it\nmemory: [#2] hello world\nconversation: [#3 Q: hi] yo!\n"
        "memory: [request 9 waiting: no camera input yet]\n"
    )
    assert p.finished == 3


def test_listen_without_headers_prints_whole_lines():
    out: list[str] = []
    p = LinePrinter(["memory"], "none", out.append)
    p.delta("memory", "a")
    p.text("memory", "a b")
    assert out == ["memory: a b\n"] and p.finished == 1


def test_notices_and_headers_are_parsed():
    assert split_header("[#3 Q: a] b] c") == (3, "a", "b] c")
    assert split_header("[#7] x") == (7, None, "x") and split_header("plain") == (None, None, "plain")
    assert waiting_notice("[request 12 waiting: no observation yet]") == 12
    assert waiting_notice("[#12 Q: a] [request 12 waiting: x]") == 12 and waiting_notice("[request 1 x]") is None
    assert end_notice("text [request 4 rejected: queue full]") == (4, "rejected", "queue full")
    assert end_notice("[request 5 cancelled]") == (5, "cancelled", "") and end_notice("fine") is None


@pytest.mark.parametrize(
    "text,ptype,kind,value",
    [
        ("2.0", P.PARAMETER_NOT_SET, P.PARAMETER_DOUBLE, 2.0),
        ("4", P.PARAMETER_NOT_SET, P.PARAMETER_INTEGER, 4),
        ("4", P.PARAMETER_DOUBLE, P.PARAMETER_DOUBLE, 4.0),
        ("true", P.PARAMETER_NOT_SET, P.PARAMETER_BOOL, True),
        ("[a, b]", P.PARAMETER_NOT_SET, P.PARAMETER_STRING_ARRAY, ["a", "b"]),
        ("[1, 2]", P.PARAMETER_DOUBLE_ARRAY, P.PARAMETER_DOUBLE_ARRAY, [1.0, 2.0]),
        ("[1, 2.5]", P.PARAMETER_NOT_SET, P.PARAMETER_DOUBLE_ARRAY, [1.0, 2.5]),
        ("[]", P.PARAMETER_STRING_ARRAY, P.PARAMETER_STRING_ARRAY, []),
        ("1e-3", P.PARAMETER_DOUBLE, P.PARAMETER_DOUBLE, 0.001),  # YAML 1.1 reads it as text
        ("42", P.PARAMETER_STRING, P.PARAMETER_STRING, "42"),
        ("pick it up", P.PARAMETER_NOT_SET, P.PARAMETER_STRING, "pick it up"),
    ],
)
def test_values_are_yaml_shaped_by_the_declared_type(text, ptype, kind, value):
    v = parse_value(text, ptype)
    assert v.type == kind and from_parameter_value(v) == value
    assert from_parameter_value(parse_value(format_value(value), ptype)) == value  # get's output reads back


@pytest.mark.parametrize("text", ["", "null", "{a: 1}", "[1, a]", "[]"])
def test_values_no_parameter_can_hold_are_usage_errors(text):
    with pytest.raises(CliError) as e:
        parse_value(text)
    assert e.value.code == 2


def test_node_and_topic_names():
    assert split_node_name("oxygen") == ("/", "oxygen") and split_node_name("/robot/oxygen") == ("/robot", "oxygen")
    with pytest.raises(CliError):
        split_node_name("bad name")
    assert resolve_topic("ask", "/", "/oxygen") == "/ask"
    assert resolve_topic("conversation/text", "/robot", "/robot/oxygen") == "/robot/conversation/text"
    assert resolve_topic("/ask", "/robot", "/robot/oxygen") == "/ask"
    assert resolve_topic("~/debug", "/robot", "/robot/oxygen") == "/robot/oxygen/debug"


def test_global_options_go_before_or_after_the_verb():
    p = build_parser()
    assert p.parse_args(["--node", "/a/oxygen", "status"]).node == "/a/oxygen"
    args = p.parse_args(["--node", "/a/oxygen", "params", "get", "x", "--timeout", "3"])
    assert (args.node, args.timeout) == ("/a/oxygen", 3.0)
    assert p.parse_args(["status"]).node == "oxygen" and p.parse_args(["params", "set", "x", "-1"]).pairs == ["x", "-1"]


def test_bad_node_names_exit_2_without_touching_ros(capsys):
    assert main(["--node", "bad name", "lifecycle", "get"]) == 2
    assert "not a ROS node name" in capsys.readouterr().err


def test_the_watchdog_ends_a_command_stuck_outside_its_waits():
    import subprocess
    import sys

    code = 'import time; from oxygen_ros.ros.cli.main import _watchdog; _watchdog(0.2, "params"); time.sleep(30)'
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert r.returncode == 1 and "oxygen params: gave up after 0.2 s" in r.stderr, r


def test_the_exit_deadline_ends_a_stuck_shutdown_with_the_commands_status_and_output():
    import subprocess
    import sys

    code = (
        "import sys, time; from oxygen_ros.ros.cli.main import _exit_deadline; "
        "sys.stdout.write('set x = 1'); _exit_deadline(0.2, 3); time.sleep(30)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert (r.returncode, r.stdout, r.stderr) == (3, "set x = 1", ""), r


def test_main_called_in_process_leaves_no_watchdog_behind(capsys):
    import threading

    before = set(threading.enumerate())
    assert main(["--node", "not a name", "params", "get", "x"]) == 2
    timers = [t for t in set(threading.enumerate()) - before if isinstance(t, threading.Timer)]
    for t in timers:
        t.join(2.0)  # cancelled: the thread ends at once
    assert timers and not [t for t in timers if t.is_alive()]


@pytest.mark.ros
def test_no_node_is_reported_after_the_short_discovery_wait_not_the_verbs_timeout():
    """``oxygen status`` without a node: exit 2 naming the node and the wait — 5 s of graph discovery
    by default (it waited the verb's 20 s before), as long as ``--timeout`` when that is given."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}
    for extra, wait in (([], "5"), (["--timeout", "1"], "1")):
        r = subprocess.run(
            [sys.executable, "-m", "oxygen_ros.ros.cli", "--node", "/no_node_here/oxygen", *extra, "status"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert r.returncode == 2 and r.stdout == "", r
        assert r.stderr.startswith(
            f"oxygen status: node /no_node_here/oxygen not found within {wait} s; is it running? (ROS_DOMAIN_ID="
        ), r.stderr
