"""FrameStats: the schedule metrics (chunk latency with / without language load, batcher busy
fraction, tokens per frame) over the rolling window, next to the existing rates."""

from oxygen_ros.core.types import FrameMetrics
from oxygen_ros.ros.diagnostics import FrameStats


def frame(i, latency, language, busy, tokens):
    m = FrameMetrics(frame_id=i, frame_time=0.05, tokens_emitted=tokens)
    m.extra.update(chunk_latency=latency, language_load=float(language))
    if busy is not None:
        m.extra["batcher_busy"] = busy
    return m


def test_schedule_metrics_split_by_language_load_over_the_window():
    st = FrameStats(window_s=1.0)
    st.record(0.0, frame(0, 0.5, False, None, 0), True)  # falls out of the window
    st.record(1.5, frame(1, 0.040, False, 0.0, 0), True)
    st.record(1.6, frame(2, 0.044, True, 0.5, 3), True)
    st.record(1.7, frame(3, 0.046, True, 0.7, 1), True)
    s = st.summary(1.8, horizon=10)
    assert abs(s["chunk_latency_no_language_ms"] - 40.0) < 1e-6
    assert abs(s["chunk_latency_language_ms"] - 45.0) < 1e-6
    assert abs(s["batcher_busy"] - 0.4) < 1e-9
    assert abs(s["tokens_per_frame"] - 4 / 3) < 1e-9


def test_engine_without_schedule_metrics_reports_zeros():
    st = FrameStats()
    st.record(0.0, FrameMetrics(frame_id=0, frame_time=0.05), True)
    s = st.summary(0.1, horizon=10)
    assert s["chunk_latency_language_ms"] == s["chunk_latency_no_language_ms"] == s["batcher_busy"] == 0.0


def test_compile_notes_name_each_eager_fallback_with_its_reason_and_every_recompile():
    """The node's status turns WARN with these notes: a compiled stage that runs eagerly says why,
    and stages that compiled after warm-up say how often (never "compiled" while eager)."""
    from oxygen_ros.ros.node_status import compile_notes

    values = {
        "compiled_stages": "vision,prefill,denoise",
        "graphs_decode": 5,
        "recompiles_decode": 3,
        "recompiles_prefill": 1,
        "fallback_decode": "5 graphs exceed the budget of 4 (...)",
    }
    assert compile_notes(values) == [
        "compiled decode stage fell back to eager (5 graphs exceed the budget of 4 (...))",
        "recompiled after warm-up: decode x3, prefill x1 (an input shape warm-up did not cover)",
    ]
    assert compile_notes({"compiled_stages": "vision,prefill,denoise,decode", "graphs_decode": 5}) == []


def test_stopped_inputs_turn_the_status_warn_then_stale_and_back_to_ok():
    """An input silent past input_timeout_s: WARN naming it and for how long; every input
    stopped: STALE; all sending again: OK ("running")."""
    from types import SimpleNamespace

    from oxygen_ros.ros.diagnostics import ProblemLog
    from oxygen_ros.ros.node_status import inference_status
    from oxygen_ros.streams.liveness import InputWatch

    watch = InputWatch(["camera base_0_rgb", "joint_states"], timeout_s=1.0)
    inputs = SimpleNamespace(liveness=watch.state)
    node = SimpleNamespace(
        cfg=None,
        policy=None,
        inputs=inputs,
        worker=None,
        problems=ProblemLog(),
        configure_error="",
        lifecycle_state="active",
        assembler=SimpleNamespace(status=lambda: (None, [])),
        get_name=lambda: "oxygen",
        get_parameter=lambda name: SimpleNamespace(value="pi05-tiny" if name == "model" else "cpu"),
    )
    watch.start(0.0)
    watch.seen("camera base_0_rgb", 3.0)
    watch.seen("joint_states", 3.0)
    st = inference_status(node, 3.5)
    assert st.level[0] == 0 and st.message.startswith("running"), st.message
    watch.seen("camera base_0_rgb", 6.1)  # the joint states stop at 3.0
    st = inference_status(node, 6.2)
    assert st.level[0] == 1 and st.message == "stale: joint_states 3.2 s", st.message
    st = inference_status(node, 7.2)  # the camera too: every input has stopped
    assert (
        st.level[0] == 3 and st.message == "stale: joint_states 4.2 s, camera base_0_rgb 1.1 s; every input has stopped"
    )
    node.problems.report("frame_dropped", "x", 7.2, 2)  # an ERROR does not hide STALE
    assert inference_status(node, 7.2).level[0] == 3
    node.problems.clear()
    watch.seen("camera base_0_rgb", 8.0)
    watch.seen("joint_states", 8.0)
    st = inference_status(node, 8.1)
    assert st.level[0] == 0 and st.message.startswith("running"), st.message
