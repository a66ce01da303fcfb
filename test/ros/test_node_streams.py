"""CommandStream (time-aligned per-step commands) and TaskTextStream (ordered text) — no ROS."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.core.engine.requests import RequestStatus
from oxygen_ros.core.types import TextDelta
from oxygen_ros.streams.commands import CommandStream
from oxygen_ros.streams.text import Emit, TaskTextStream, Utterances, end_notice, is_waiting_notice, waiting_notice


def chunk(h=5, n=2, base=0.0):
    return base + np.arange(h * n, dtype=np.float64).reshape(h, n)


def test_command_stream_steps_through_the_chunk_by_time():
    cs = CommandStream(period_s=0.1, max_hold_s=0.25)
    assert cs.sample(0.0).positions is None and cs.sample(0.0).reason == "no chunk yet"
    assert cs.set_chunk(chunk(), stamp=10.0)
    # point i is for t0 + (i + 1) * period
    assert cs.sample(10.1).index == 0
    assert cs.sample(10.29).index == 2
    np.testing.assert_array_equal(cs.sample(10.3).positions, chunk()[2])
    assert cs.sample(9.0).index == 0  # before the chunk: first point
    assert cs.sample(10.7).index == 4  # after the end: the last point is held ...
    assert cs.sample(10.75).index == 4
    late = cs.sample(10.76)  # ... for at most max_hold_s
    assert late.positions is None and late.reason == "chunk expired"


def test_command_stream_refuses_bad_or_older_chunks():
    cs = CommandStream(0.1, 0.5)
    bad = chunk()
    bad[1, 0] = np.nan
    assert not cs.set_chunk(bad, 1.0)
    assert not cs.set_chunk(np.zeros((0, 2)), 1.0)
    assert cs.set_chunk(chunk(base=100), 2.0)
    assert not cs.set_chunk(chunk(), 1.0)  # older than the current one
    assert cs.sample(2.1).positions[0] == 100
    cs.clear()
    assert cs.sample(2.1).positions is None
    with pytest.raises(ValueError):
        CommandStream(0.0, 1.0)


def test_command_stream_copies_the_chunk():
    cs = CommandStream(0.1, 0.5)
    a = chunk()
    cs.set_chunk(a, 0.0)
    a[:] = 7
    assert cs.sample(0.1).positions[0] == 0.0


def test_text_stream_serialises_interleaved_requests():
    ts = TaskTextStream("none")
    out = []
    out += ts.delta(1, "Hel")
    out += ts.delta(2, "Wo")  # request 2 decodes in the same batch: held back
    out += ts.delta(1, "lo")
    out += ts.delta(2, "rld")
    assert [(e.kind, e.text) for e in out] == [("delta", "Hel"), ("delta", "lo")]
    out2 = ts.end(2, "World")  # 2 ends first: still held behind 1
    assert out2 == []
    out3 = ts.delta(1, "") + ts.end(1, "Hello")
    assert [(e.kind, e.text, e.request_id) for e in out3] == [
        ("text", "Hello", 1),
        ("delta", "Wo", 2),
        ("delta", "rld", 2),
        ("text", "World", 2),
    ]
    assert ts.pending == 0


def test_text_stream_concatenation_equals_final_text_for_every_utterance():
    ts = TaskTextStream("none")
    rng = np.random.default_rng(0)
    texts = {i: "".join(rng.choice(list("ab€😀 "), size=9)) for i in range(1, 6)}
    emits, pos = [], {i: 0 for i in texts}
    while any(pos[i] < len(t) for i, t in texts.items()):
        for i, t in texts.items():
            if pos[i] < len(t):
                k = int(rng.integers(1, 4))
                emits += ts.delta(i, t[pos[i] : pos[i] + k])
                pos[i] += k
                if pos[i] >= len(t):
                    emits += ts.end(i, t)
    acc, finals = "", []
    for e in emits:
        if e.kind == "delta":
            acc += e.text
        else:
            assert acc == e.text
            finals.append(e.text)
            acc = ""
    assert finals == [texts[i] for i in sorted(texts)]


def test_text_stream_answers_every_ended_request():
    ts = TaskTextStream("none")
    assert [(e.kind, e.text) for e in ts.end(7, "")] == [("text", "")]  # finished with no output
    out = ts.delta(8, "par") + ts.end(8, "par")
    assert [(e.kind, e.text) for e in out] == [("delta", "par"), ("text", "par")]


def test_text_stream_says_why_a_request_ended_in_its_turn():
    ts = TaskTextStream("none")
    live = ts.delta(1, "the cube")  # an utterance is streaming
    notice = "[request 2 rejected: request needs 32 KV blocks but at most 11 fit beside the action path]"
    held = ts.end(2, "", notice=notice)
    assert [e.text for e in live] == ["the cube"] and held == []  # not inside request 1's utterance
    out = ts.end(1, "the cube")
    assert [(e.kind, e.text, e.request_id) for e in out] == [
        ("text", "the cube", 1),
        ("delta", notice, 2),
        ("text", notice, 2),
    ]
    assert ts.pending == 0
    later = ts.delta(4, "ok") + ts.end(4, "ok", notice="[request 4 cancelled]")  # after output: text + why
    assert [(e.kind, e.text) for e in later] == [
        ("delta", "ok"),
        ("delta", " [request 4 cancelled]"),
        ("text", "ok [request 4 cancelled]"),
    ]


@pytest.mark.parametrize(
    "header, ask_head, periodic_head",
    [("ask", "[#3 Q: What do you see?] ", "[#4] "), ("id", "[#3] ", "[#4] "), ("none", "", "")],
)
def test_text_stream_headers_keep_deltas_adding_up_to_the_text(header, ask_head, periodic_head):
    ts = TaskTextStream(header)
    ts.open(3, "What do\nyou  see?")  # one line in `ros2 topic echo`
    out = ts.delta(4, "memo") + ts.delta(3, "a cube") + ts.end(4, "memo") + ts.end(3, "a cube")
    by_rid: dict = {}
    for e in out:
        by_rid.setdefault(e.request_id, []).append(e)
    for rid, head, body in ((3, ask_head, "a cube"), (4, periodic_head, "memo")):
        emits = by_rid[rid]
        assert emits[-1].kind == "text" and emits[-1].text == head + body
        assert "".join(e.text for e in emits[:-1]) == emits[-1].text
    assert [e.request_id for e in out if e.kind == "text"] == [3, 4]  # opened first, answered first
    with pytest.raises(ValueError, match="text_header"):
        TaskTextStream("verbose")


def test_utterances_answer_asks_in_the_order_they_were_submitted():
    from oxygen_ros.core.types import TextDelta

    u = Utterances(["conversation", "memory"], "ask")
    ids = iter([5, 6, 7])
    asked = [u.submit("conversation", q, lambda: next(ids)) for q in ("one?", "two?", "three?")]
    assert asked == [5, 6, 7]
    # the third and second decode first (e.g. the first waited for blocks): held back, in order
    out = u.frame(
        [TextDelta(7, "conversation", "c", 0), TextDelta(6, "conversation", "b", 0)], [result(7, "c"), result(6, "b")]
    )
    assert out["conversation"] == [Emit("delta", "[#5 Q: one?] ", 5)]
    out = u.frame([], [result(5, "", RequestStatus.REJECTED, "expired: waited 30.0 s in the queue")])
    texts = [e.text for e in out["conversation"] if e.kind == "text"]
    assert texts == [
        "[#5 Q: one?] [request 5 expired: waited 30.0 s in the queue]",
        "[#6 Q: two?] b",
        "[#7 Q: three?] c",
    ]
    assert u.pending == 0
    with pytest.raises(KeyError):
        u.submit("conversation", "x", lambda: {}["bad task"])
    assert u.pending == 0  # nothing opened for a refused ask


@pytest.mark.parametrize(
    "status, reason, notice",
    [
        (RequestStatus.FINISHED, "length", None),
        (RequestStatus.CANCELLED, "cancelled", "[request 9 cancelled]"),
        (RequestStatus.REJECTED, "queue full", "[request 9 rejected: queue full]"),
        (RequestStatus.REJECTED, "expired: waited 1.0 s", "[request 9 expired: waited 1.0 s]"),
        (RequestStatus.FAILED, "failed in decode: boom", "[request 9 failed: failed in decode: boom]"),
    ],
)
def test_end_notice_names_every_outcome_but_finishing(status, reason, notice):
    assert end_notice(result(9, "", status, reason)) == notice


def result(rid, text, status=None, reason="length"):
    from oxygen_ros.core.engine.requests import RequestResult

    return RequestResult(rid, "conversation", status or RequestStatus.FINISHED, reason, text, [], 0, None, None)


def test_text_stream_sends_nul_as_replacement_so_deltas_still_add_up_on_the_wire():
    """A ROS string is NUL-terminated: serialising 'a\\x00b' yields 'a'. A decoded NUL byte must not
    cut a delta or the final text (the e2e test saw deltas != text when one did)."""
    from rclpy.serialization import deserialize_message, serialize_message
    from std_msgs.msg import String

    ts = TaskTextStream("id")
    out = ts.delta(1, "ab\x00c") + ts.delta(1, "\x00") + ts.end(1, "ab\x00c\x00")
    wire = [deserialize_message(serialize_message(String(data=e.text)), String).data for e in out]
    assert wire == ["[#1] ", "ab\ufffdc", "\ufffd", "[#1] ab\ufffdc\ufffd"]
    assert "".join(wire[:-1]) == wire[-1]


def test_waiting_notice_says_request_reason_and_the_queue_wait_and_is_recognised_by_its_prefix():
    assert waiting_notice(3, 30.0) == (
        "[request 3 waiting: no camera input yet; it waits up to 30.0 s (engine.max_queue_wait_s) for an observation]"
    )
    assert waiting_notice(12, 2.5, "no observation yet (waiting for joint states)") == (
        "[request 12 waiting: no observation yet (waiting for joint states); it waits up to 2.5 s "
        "(engine.max_queue_wait_s) for an observation]"
    )
    assert waiting_notice(4, 0.0) == (
        "[request 4 waiting: no camera input yet; it waits for an observation (engine.max_queue_wait_s = 0: no limit)]"
    )
    for n in (3, 12, 4):
        assert waiting_notice(n, 1.0).startswith(f"[request {n} waiting:")
        assert is_waiting_notice(waiting_notice(n, 1.0))
    for other in (
        "[request 3 expired: waited 30.0 s in the queue]",
        "[#3 Q: waiting: now?] yes",
        "[request x waiting: no]",
        "waiting: [request 3",
        "",
    ):
        assert not is_waiting_notice(other), other


def test_utterances_call_opened_with_the_request_id_before_any_frame_output():
    u = Utterances(["conversation"], "id")
    seen = []
    rid = u.submit("conversation", "q?", lambda: 9, opened=seen.append)
    assert rid == 9 and seen == [9]
    with pytest.raises(ValueError):
        u.submit("conversation", "bad", lambda: (_ for _ in ()).throw(ValueError("no")), opened=seen.append)
    assert seen == [9] and u.pending == 1


def test_the_ask_header_echoes_a_short_prefix_of_a_long_question():
    """A 10 MB ask must not come back whole in its header: at most HEADER_ASK_CHARS characters."""
    from oxygen_ros.streams.text import HEADER_ASK_CHARS, header_echo, ignored_notice

    ts = TaskTextStream("ask")
    ts.open(3, "x" * 10_000_000)
    ((head, *_),) = [ts.delta(3, "hi")]
    assert head.text.startswith("[#3 Q: xxx") and head.text.endswith("…] ") and len(head.text) < HEADER_ASK_CHARS + 16
    assert header_echo("  what   do\nyou see? ") == "what do you see?"
    assert ignored_notice("what?", "the node is inactive") == "[ask ignored: the node is inactive] Q: what?"


def test_abandon_ends_every_open_utterance_with_its_text_so_far_and_the_notice():
    """The last resort (an engine that cannot end its requests, a frame still running at exit):
    every open utterance ends, in order, with what it had said and the notice."""
    u = Utterances(["conversation"], "ask")
    u.submit("conversation", "first?", lambda: 1)
    u.submit("conversation", "second?", lambda: 2)
    u.frame([TextDelta(1, "conversation", "partial", 0)], [])
    out = u.abandon("node shutting down", "cancelled")["conversation"]
    texts = [e.text for e in out if e.kind == "text"]
    assert texts == [
        "[#1 Q: first?] partial [request 1 cancelled: node shutting down]",
        "[#2 Q: second?] [request 2 cancelled: node shutting down]",
    ]
    deltas = "".join(e.text for e in out if e.kind == "delta" and e.request_id == 1)
    assert deltas == " [request 1 cancelled: node shutting down]"  # 'partial' went out with its frame
    assert u.pending == 0 and u.abandon("again") == {}
