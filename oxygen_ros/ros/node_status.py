"""The ``<node>: inference`` DiagnosticStatus of the ``oxygen`` node.

Level and message: ERROR when configure failed, when inference raised recently (a contained engine
fault, a supervised restart of the frame loop), or — health derived from what actually leaves the
node — when observations arrive but no action chunk has been published for ``chunk_timeout_s``
(automatic by default: the larger of 2 s, twice ``input_timeout_s`` and ten median frame times),
or the inference thread is not running; STALE when every
input (each camera, the joint states) has stopped; WARN while not active, while an input has sent
nothing for more than ``input_timeout_s`` (``stale: joint_states 3.2 s, camera base_0_rgb 3.1 s``),
while waiting for input, with masked (stale) cameras, or after recent dropped input;
WARN too while the engine is not ready (warm-up), when a compiled stage fell back to eager (with
the reason), or when a compiled stage recompiled after warm-up. OK otherwise. Key/values: lifecycle state, engine
readiness / warm-up time / compile mode, model, device, dtype, rates (frame, chunk, action = H/T,
command), tok/s, p50/p99 frame time, schedule and its metrics (chunk latency with / without
language load, batcher busy fraction, tokens per frame), decode batch, requests running/queued, KV blocks in use /
total, deadline misses and every drop counter; while active, per input the seconds since its
last message (``since_last_message_s <input>``, -1 when nothing arrived since activation); per
language task the request accounting
(``requests_<task>_submitted`` / finished / rejected / expired / failed / cancelled / in_flight)
and, per output topic, the subscriptions its publisher has matched (``subscribers <topic>``).
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from diagnostic_msgs.msg import DiagnosticStatus

from oxygen_ros.ros.diagnostics import ERROR, OK, STALE, WARN, FrameStats, ProblemLog, build_status

__all__ = ["INSTRUCTION_SHOWN", "NodeView", "chunk_timeout", "compile_notes", "inference_status"]

#: Characters of the current instruction shown under the ``instruction`` key (the rest is cut).
INSTRUCTION_SHOWN = 200


class NodeView(Protocol):
    """What the status reads of the node (``oxygen_ros.ros.node.OxygenNode`` provides it).

    A protocol rather than an import of the node class, so this module stays below the node.
    """

    cfg: Any
    policy: Any
    engine: Any
    worker: Any
    assembler: Any
    inputs: Any
    outputs: Any
    stats: FrameStats
    problems: ProblemLog
    configure_error: str

    @property
    def lifecycle_state(self) -> str: ...

    def get_name(self) -> str: ...

    def get_parameter(self, name: str) -> Any: ...


def _values(node: NodeView, now: float) -> dict[str, object]:
    cfg = node.cfg
    values: dict[str, object] = {"state": node.lifecycle_state}
    if node.policy is None or cfg is None:
        values["model"] = node.get_parameter("model").value
        return values
    model = node.policy.model
    values.update(
        model=cfg.model,
        device=str(model.device),
        dtype=str(model.dtype).replace("torch.", ""),
        engine_mode=cfg.engine.mode,
        engine_schedule=cfg.engine.schedule,
    )
    values.update(node.stats.summary(now, node.policy.cfg.action_horizon))
    values.update(node.worker.snapshot if node.worker else {})
    values.update(
        kv_blocks_in_use=node.stats.blocks_in_use,
        kv_blocks_total=node.stats.blocks_total,
        frames=node.stats.total_frames,
        chunks=node.stats.total_chunks,
        tokens=node.stats.total_tokens,
        deadline_misses=node.stats.deadline_misses,
        dropped_observations=node.engine.dropped_observations,
    )
    values.update(node.engine.diagnostics())  # ready, warmup_s, compile, compiled stages, fallbacks
    faults = node.engine.faults
    values.update(faults_total=faults.total, **{f"faults_{k}": v for k, v in sorted(faults.counts.items())})
    values.update(kv_pool_requests_in_flight=node.engine.pool_plan.sustained)
    values.update(node.assembler.counts())
    values.update(instruction=node.assembler.instruction[:INSTRUCTION_SHOWN])
    if node.worker is not None:
        last = node.worker.last_chunk_at
        values.update(
            inference_restarts=node.worker.restarts,
            since_last_chunk_s=-1 if last is None else round(now - last, 3),
            chunk_timeout_s=chunk_timeout(cfg, values),
        )
    if node.inputs is not None:
        values.update(
            asks=node.inputs.asks,
            ignored_while_inactive=node.inputs.ignored_inactive,
            images_dropped_undecoded=node.inputs.dropped_images,
            instructions_received=node.inputs.instructions,
            instructions_refused=node.inputs.refused_instructions,
        )
        values.update({f"joint_states_{k}": v for k, v in node.inputs.joint_state_counts.items()})
        values.update(
            {f"since_last_message_s {k}": -1 if v is None else v for k, v in node.inputs.liveness(now).ages.items()}
        )
    if node.outputs is not None:
        values.update(node.outputs.subscribers())
        values.update(shadow=not node.outputs.commanding)
        if node.outputs.shadow is not None:
            values.update(node.outputs.shadow.comparison.summary())
    values.update({f"count_{k}": v for k, v in node.problems.counts().items()})
    return values


def chunk_timeout(cfg: Any, values: dict[str, object]) -> float:
    """Seconds without a published chunk (while observations arrive) that make the node ERROR:
    ``chunk_timeout_s``, or when 0 the larger of 2 s, ``2 x input_timeout_s`` and ten times the
    window's median frame time (``frame_time_p50_ms``)."""
    if cfg.chunk_timeout_s > 0:
        return float(cfg.chunk_timeout_s)
    p50 = float(values.get("frame_time_p50_ms", 0.0) or 0.0) * 1e-3  # type: ignore[arg-type]
    return round(max(2.0, 2.0 * float(cfg.input_timeout_s), 10.0 * p50), 3)


def compile_notes(values: dict[str, object]) -> list[str]:
    """WARN notes from the engine's compile diagnostics: each stage that fell back to eager (with
    its reason) and the stages that compiled a graph after warm-up."""
    notes = [
        f"compiled {k[len('fallback_') :]} stage fell back to eager ({values[k]})"
        for k in sorted(values)
        if k.startswith("fallback_")
    ]
    recompiled = [f"{k[len('recompiles_') :]} x{values[k]}" for k in sorted(values) if k.startswith("recompiles_")]
    if recompiled:
        notes.append(f"recompiled after warm-up: {', '.join(recompiled)} (an input shape warm-up did not cover)")
    return notes


def _worse(a: int, b: int) -> int:
    """The level to report of two: the larger (STALE, every input stopped, is not hidden by an
    ERROR it explains)."""
    return max(a, b)


def inference_status(node: NodeView, now: float) -> DiagnosticStatus:
    """Build the status from the node's current state (``now``: monotonic seconds)."""
    name = f"{node.get_name()}: inference"
    values = _values(node, now)
    hw = str(values.get("device", node.get_parameter("device").value or "unknown"))
    if node.configure_error and node.lifecycle_state == "unconfigured":
        return build_status(name, hw, ERROR, f"configure failed: {node.configure_error}", values)
    if node.lifecycle_state != "active":
        return build_status(name, hw, WARN, f"not active ({node.lifecycle_state})", values)
    level, parts = OK, []
    live = node.inputs.liveness(now)
    worker = node.worker
    dead = worker is not None and not worker.alive
    # chunk_timeout_s: a float (chunk_timeout()) that _values sets whenever there is a worker
    stalled = None if worker is None else worker.stalled(now, float(cast(float, values["chunk_timeout_s"])))
    if stalled and (dead or not live.all_stopped):  # inputs that stopped explain a silent action path
        level = ERROR
        parts.append(stalled)
    if live.stale:
        level = _worse(level, STALE if live.all_stopped else WARN)
        parts.append("stale: " + ", ".join(f"{n} {s:.1f} s" for n, s in live.stale))
        if live.all_stopped:
            parts.append("every input has stopped")
    waiting, notes = node.assembler.status()
    parts += ([waiting] if waiting else []) + list(notes)
    if parts:
        level = _worse(level, WARN)
    if not values.get("ready", True):
        level, parts = _worse(level, WARN), parts + ["engine warming up (compiling shapes)"]
    compile_parts = compile_notes(values) + ([str(values["rtc_note"])] if "rtc_note" in values else [])
    if compile_parts:
        level, parts = _worse(level, WARN), parts + compile_parts
    for plevel, kind, message, count in node.problems.recent(now):
        level = _worse(level, plevel)
        parts.append(f"{kind} x{count}: {message}")
    if not parts:
        parts = [f"running: {values.get('chunk_hz', 0.0):.1f} chunks/s, {values.get('tok_per_s', 0.0):.1f} tok/s"]
    if values.get("shadow"):
        parts.insert(0, "SHADOW: nothing commanded")
    return build_status(name, hw, level, "; ".join(parts), values)
