"""The ``aloha_sim: executor`` status: the summary values and their DiagnosticStatus."""

from __future__ import annotations

import math
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

from oxygen_ros.sim.executor import ChunkExecutor, ExecState, Verdict
from oxygen_ros.sim.params import _ERROR, _OK, _WARN, STATUS_NAME
from oxygen_ros.sim.runtime import Pacer, Rates, Renderer

__all__ = ["executor_status", "sim_summary"]

_COUNTERS = (
    "steps",
    "executed_steps",
    "wait_steps",
    "hold_steps",
    "limited_steps",
    "chunks_received",
    "chunks_executed",
    "commands_received",
    "late_points",
    "same_stamp",
    "losses",
    "resumes",
)


def sim_summary(
    executor: ChunkExecutor, pacer: Pacer, rates: Rates, renderer: Renderer | None, resets: int, target_rtf: float
) -> dict[str, Any]:
    """Status values: executor state, sim time (s), rates, counters, chunk ages (ms) and chunk
    switches.

    Non-finite ages (no chunk yet) become ``None``; every verdict but ACCEPTED / WRONG_SOURCE is a
    counter of its own. Chunk switches (:meth:`ChunkExecutor.switch_stats`): ``switches``
    (measured), ``switches_after_hold``, ``switch_jump_last`` / ``switch_jump_median`` /
    ``switch_jump_max`` (the largest absolute joint difference between the previous and the new
    chunk's targets at the switch, joint units; ``None`` before the first measured switch).
    """
    values: dict[str, Any] = {
        "state": executor.state.value,
        "sim_time": round(pacer.elapsed, 3),
        "target_real_time_factor": target_rtf,
    }
    values.update({k: round(v, 3) for k, v in rates.summary(time.monotonic()).items()})
    values.update({k: (round(v, 2) if math.isfinite(v) else None) for k, v in executor.age_stats().items()})
    counts = executor.counts()
    for key in _COUNTERS:
        values[key] = counts.get(key, 0)
    values.update({k: (round(v, 6) if isinstance(v, float) else v) for k, v in executor.switch_stats().items()})
    for v in Verdict:
        if v not in (Verdict.ACCEPTED, Verdict.WRONG_SOURCE):
            values[v.value] = counts.get(v.value, 0)
    values.update(
        accepted=counts.get(Verdict.ACCEPTED.value, 0),
        resets=resets,
        overruns=pacer.overruns,
        camera_frames=renderer.frames if renderer else 0,
        camera_skipped=renderer.skipped if renderer else 0,
    )
    return values


def executor_status(values: dict[str, Any], failure: str) -> DiagnosticStatus:
    """ERROR on a sim failure, WARN while lost or waiting for the first chunk, OK otherwise."""
    state = values["state"]
    if failure:
        level, message = _ERROR, failure.splitlines()[0]
    elif state == ExecState.LOST.value:
        level, message = _WARN, f"command loss: holding the last command (losses {values['losses']})"
    elif state == ExecState.WAITING.value:
        level, message = _WARN, "waiting for the first action chunk; holding the start pose"
    else:
        level = _OK
        message = f"{state}: {values['sim_step_hz']:.1f} steps/s, real-time factor {values['real_time_factor']:.2f}"
    return DiagnosticStatus(
        level=bytes([level]),
        name=STATUS_NAME,
        hardware_id="mujoco",
        message=message,
        values=[KeyValue(key=k, value="" if v is None else str(v)) for k, v in values.items()],
    )
