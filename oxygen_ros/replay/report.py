"""What a replay measured, summarised with the metric definitions of docs/architecture.md, 'Metrics'.

- frame time T: wall time of one ``Engine.step`` (CPU: synchronous; CUDA: after device sync);
- action frequency H/T and chunk rate 1/T, from the median T of frames that produced a chunk;
- chunk latency: from the moment the observation was available (offline: assembled; recorded
  timing: the recorded arrival of its newest input) to the chunk being handed out;
- language throughput: tokens emitted / wall time of the run; time to first token per request
  (submission to first token, wall);
- deadline: ``engine.frame_deadline_s`` if set, else the input frame period (median interval of
  the camera that triggers frames); a chunk also "runs dry" when its latency exceeds the chunk's
  horizon H x control_period_s (the robot would have no action left to execute);
- warm-up frames (the first ``warmup`` frames with an observation) are excluded from timings;
- switch discontinuity (:mod:`oxygen_ros.streams.switches`): for each chunk taking over from the
  previous one, the largest absolute difference over joints between the two chunks' targets
  (linear interpolation between points) at the new chunk's first executed point — its first point
  due at or after the chunk became available (observation stamp + chunk latency) — in robot command
  units (what goes on the wire); a switch from a chunk that had already run out is counted as
  ``switches_after_hold``, not measured. Fewer than 2 executed chunks: no switch, no figure (null).

Drops are counted, never hidden: everything a node would have refused or lost is listed.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oxygen_ros.replay.accuracy import format_accuracy

__all__ = ["FrameRecord", "ReplayStats", "RequestRecord", "find_gaps", "format_report", "summarize"]

STAGES = ("vision", "prefill", "denoise", "start", "decode", "bookkeeping")


@dataclass
class FrameRecord:
    """One engine frame. Times in seconds; ``wall_*`` since the run started, ``bag_time`` since
    the first bag message (the replay's bag clock)."""

    frame_id: int
    wall_start: float
    bag_time: float
    has_obs: bool
    stamp: float | None = None
    action: bool = False
    latency: float | None = None
    frame_time: float = 0.0
    vision: float = 0.0
    prefill: float = 0.0
    denoise: float = 0.0
    start: float = 0.0
    decode: float = 0.0
    bookkeeping: float = 0.0
    decode_steps: int = 0
    decode_batch: int = 0
    tokens: int = 0
    running: int = 0
    blocks_in_use: int = 0
    blocks_total: int = 0
    masked: tuple[str, ...] = ()
    error: str | None = None
    warmup: bool = False
    language: bool = False
    batcher_busy: float | None = None


@dataclass
class RequestRecord:
    """One language request, as it ended."""

    id: int
    task: str
    ask: str
    status: str
    reason: str
    tokens: int
    text: str
    ttft: float | None
    latency: float | None
    frame_id: int


@dataclass
class ReplayStats:
    """Everything collected during one replay (filled by :mod:`oxygen_ros.replay.replay`)."""

    meta: dict[str, Any] = field(default_factory=dict)
    frames: list[FrameRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    drops: Counter[str] = field(default_factory=Counter)
    waiting: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    gaps: list[tuple[str, float, float]] = field(default_factory=list)
    lost: dict[str, int] = field(default_factory=dict)
    bag_error: str | None = None
    wall_total: float = 0.0
    outputs: dict[str, int] = field(default_factory=dict)
    switches: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] = field(default_factory=dict)

    def save_json(self, path: str | Path) -> None:
        """Write the summary, the action accuracy (:mod:`.accuracy`; when measured) and every
        frame/request record as JSON."""
        data = {
            "summary": summarize(self),
            "frames": [asdict(f) for f in self.frames],
            "requests": [asdict(r) for r in self.requests],
        }
        if self.accuracy:
            data["action_accuracy"] = self.accuracy
        Path(path).write_text(json.dumps(data, indent=1, default=str))


def find_gaps(
    times: dict[str, list[float]], min_gap_s: float = 0.25, factor: float = 5.0
) -> list[tuple[str, float, float]]:
    """Silences in periodic streams: intervals longer than ``max(min_gap_s, factor x median)``.

    Args:
        times: topic -> message times in seconds (bag clock), in order.

    Returns:
        ``(topic, start s, length s)`` for every gap, by start time.
    """
    out = []
    for topic, ts in times.items():
        if len(ts) < 3:
            continue
        d = np.diff(np.asarray(ts, dtype=np.float64))
        pos = d[d > 0]
        if pos.size == 0:
            continue
        limit = max(min_gap_s, factor * float(np.median(pos)))
        for i in np.nonzero(d > limit)[0]:
            out.append((topic, float(ts[i]), float(d[i])))
    return sorted(out, key=lambda g: (g[1], g[0]))


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(s: ReplayStats) -> dict[str, Any]:
    """Numbers of the report (JSON-serialisable)."""
    m = s.meta
    with_obs = [f for f in s.frames if f.has_obs]
    timed = [f for f in with_obs if not f.warmup]
    acted = [f for f in timed if f.action]
    horizon = int(m.get("horizon", 0))
    t_med = _pct([f.frame_time for f in acted], 50)
    deadline = float(m.get("frame_deadline_s") or 0.0) or float(m.get("input_period_s") or 0.0)
    chunk_span = horizon * float(m.get("control_period_s", 0.0))
    tokens = sum(f.tokens for f in s.frames)
    ttfts = [r.ttft for r in s.requests if r.ttft is not None]
    status = Counter(r.status for r in s.requests)
    masked = Counter(slot for f in with_obs for slot in f.masked)
    return {
        "bag": m.get("bag"),
        "bag_duration_s": m.get("bag_duration_s"),
        "model": m.get("model"),
        "timing": m.get("timing"),
        "frames": len(s.frames),
        "frames_with_observation": len(with_obs),
        "chunks": sum(f.action for f in s.frames),
        "frames_dropped": sum(1 for f in with_obs if not f.action),
        "warmup_frames": len(with_obs) - len(timed),
        "horizon": horizon,
        "frame_time_p50_s": t_med,
        "frame_time_p99_s": _pct([f.frame_time for f in acted], 99),
        "chunk_rate_hz": 1.0 / t_med if t_med else None,
        "action_hz": horizon / t_med if t_med else None,
        "chunk_latency_p50_s": _pct([f.latency for f in acted if f.latency is not None], 50),
        "chunk_latency_p99_s": _pct([f.latency for f in acted if f.latency is not None], 99),
        "schedule": m.get("schedule", "serial"),
        "chunk_latency_language_p50_s": _pct([f.latency for f in acted if f.latency is not None and f.language], 50),
        "chunk_latency_no_language_p50_s": _pct(
            [f.latency for f in acted if f.latency is not None and not f.language], 50
        ),
        "batcher_busy_mean": (
            float(np.mean(busy)) if (busy := [f.batcher_busy for f in timed if f.batcher_busy is not None]) else None
        ),
        "tokens_per_frame": tokens / len(s.frames) if s.frames else None,
        "stage_mean_s": {k: float(np.mean([getattr(f, k) for f in acted])) if acted else None for k in STAGES},
        "tokens": tokens,
        "tok_per_s": tokens / s.wall_total if s.wall_total > 0 else None,
        "ttft_p50_s": _pct(ttfts, 50),
        "ttft_p99_s": _pct(ttfts, 99),
        "requests": len(s.requests),
        "request_status": dict(status),
        "decode_batch_max": max((f.decode_batch for f in s.frames), default=0),
        "deadline_s": deadline or None,
        "deadline_misses": sum(1 for f in timed if deadline and f.frame_time > deadline),
        "chunk_span_s": chunk_span or None,
        "chunk_dry": sum(1 for f in acted if chunk_span and (f.latency or 0) > chunk_span),
        "drops": {k: v for k, v in sorted(s.drops.items()) if v},
        "waiting": dict(s.waiting),
        "masked_slots": dict(masked),
        "gaps": s.gaps,
        "rtc": dict(m.get("rtc") or {}),
        "frames_missed_in_gaps": _missed(s),
        "lost_messages": s.lost,
        "bag_error": s.bag_error,
        "warnings": s.warnings,
        "wall_total_s": s.wall_total,
        "outputs": s.outputs,
        "chunk_switches": s.switches.get("switches", 0),
        "switch_jump_median": s.switches.get("switch_jump_median"),
        "switch_jump_max": s.switches.get("switch_jump_max"),
        "switch_jump_last": s.switches.get("switch_jump_last"),
        "switches_after_hold": s.switches.get("switches_after_hold", 0),
        "chunks_never_executed": s.switches.get("chunks_never_executed", 0),
        "command_kind": m.get("command_kind"),
    }


def _missed(s: ReplayStats) -> int:
    """Trigger-camera frames that fell into gaps of the trigger topic (at its median period)."""
    period = float(s.meta.get("trigger_period_s") or 0.0)
    topic = s.meta.get("trigger_topic")
    if period <= 0:
        return 0
    return sum(max(0, round(length / period) - 1) for t, _, length in s.gaps if t == topic)


def _s(v: float | None, unit: str = "s", scale: float = 1.0, nd: int = 3) -> str:
    return "n/a" if v is None else f"{v * scale:.{nd}f} {unit}"


def _switch_line(r: dict[str, Any]) -> str:
    n, hold, never = r["chunk_switches"], r["switches_after_hold"], r["chunks_never_executed"]
    tail = f"{hold} after a hold (not measured)" + (f", {never} chunks never executed" if never else "")
    if not n:
        return (
            "no chunk switches (fewer than 2 executed chunks)" if not hold else "no measured chunk switches"
        ) + f"; {tail}"
    kind = f"{r['command_kind']} " if r.get("command_kind") else ""
    return (
        f"{n} measured, switch discontinuity median {r['switch_jump_median']:.4f}, max "
        f"{r['switch_jump_max']:.4f} (largest joint difference at the new chunk's first "
        f"executed point, {kind}command units); {tail}"
    )


def _rtc_line(rtc: dict[str, Any]) -> str:
    """``rtc             …``: real-time chunking's settings and what it did (chunks guided, unguided by
    reason, the inference delay in rows and where it came from)."""
    unguided = (
        ", ".join(
            f"{v} {k[len('rtc_unguided_') :].replace('_', ' ')}"
            for k, v in sorted(rtc.items())
            if k.startswith("rtc_unguided_") and v
        )
        or "none"
    )
    return (
        f"rtc             on ({rtc['rtc_guidance']} guidance, {rtc['rtc_schedule']} schedule, execution horizon "
        f"{rtc['rtc_execution_horizon']}, max weight {rtc['rtc_max_guidance_weight']:g}): "
        f"{rtc.get('rtc_guided', 0)} chunks guided, unguided: {unguided}; inference delay "
        f"{rtc['rtc_delay_rows']} rows ({rtc['rtc_delay_source']})"
    )


def format_report(s: ReplayStats) -> str:
    """The human-readable report printed at the end of a replay."""
    r = summarize(s)
    lines = [
        f"replay of {r['bag']} ({r['bag_duration_s']:.1f} s of bag) with {r['model']}, "
        f"{r['timing']}, wall {r['wall_total_s']:.1f} s"
    ]
    add = lines.append
    add(
        f"  frames          {r['frames_with_observation']} with an observation "
        f"({r['chunks']} action chunks, {r['frames_dropped']} dropped), "
        f"{r['frames'] - r['frames_with_observation']} language-only; warm-up excluded: "
        f"{r['warmup_frames']}"
    )
    hz = "n/a" if r["action_hz"] is None else f"{r['action_hz']:.1f} Hz"
    rate = "n/a" if r["chunk_rate_hz"] is None else f"{r['chunk_rate_hz']:.2f}"
    add(
        f"  action          {hz} (H={r['horizon']} / frame time p50 "
        f"{_s(r['frame_time_p50_s'])}; p99 {_s(r['frame_time_p99_s'])}); {rate} chunks/s"
    )
    add(
        f"  chunk latency   p50 {_s(r['chunk_latency_p50_s'])}, p99 {_s(r['chunk_latency_p99_s'])}"
        " (observation available -> chunk out)"
    )
    busy = "n/a" if r["batcher_busy_mean"] is None else f"{r['batcher_busy_mean']:.2f}"
    tpf = "n/a" if r["tokens_per_frame"] is None else f"{r['tokens_per_frame']:.2f}"
    add(
        f"  schedule        {r['schedule']}: chunk latency p50 with language {_s(r['chunk_latency_language_p50_s'])}, "
        f"without {_s(r['chunk_latency_no_language_p50_s'])}; batcher busy {busy}; {tpf} tokens/frame"
    )
    st = r["stage_mean_s"]
    add("  frame stages    " + ", ".join(f"{k} {_s(st[k], 'ms', 1e3, 0)}" for k in STAGES) + " (means)")
    status = ", ".join(f"{v} {k}" for k, v in sorted(r["request_status"].items())) or "none"
    tps = "n/a" if r["tok_per_s"] is None else f"{r['tok_per_s']:.1f} tok/s"
    add(
        f"  language        {r['requests']} requests ({status}); {r['tokens']} tokens, {tps}; "
        f"time to first token p50 {_s(r['ttft_p50_s'])}, p99 {_s(r['ttft_p99_s'])}; "
        f"decode batch max {r['decode_batch_max']}"
    )
    dl = "no deadline" if not r["deadline_s"] else f"{r['deadline_misses']} frames over {_s(r['deadline_s'])}"
    src = "engine.frame_deadline_s" if s.meta.get("frame_deadline_s") else "input frame period"
    dry = (
        "" if not r["chunk_span_s"] else f"; {r['chunk_dry']} chunks later than their {r['chunk_span_s']:.2f} s horizon"
    )
    add(f"  deadline misses {dl} ({src}){dry}")
    add(f"  chunk switches  {_switch_line(r)}")
    if r["rtc"]:
        add(f"  {_rtc_line(r['rtc'])}")
    lines += format_accuracy(s.accuracy)
    drops = ", ".join(f"{k} {v}" for k, v in r["drops"].items()) or "none"
    add(f"  drops           {drops}")
    if r["waiting"]:
        add("  no frame        " + "; ".join(f"{v}x {k}" for k, v in r["waiting"].items()))
    if r["masked_slots"]:
        add("  masked slots    " + ", ".join(f"{k} in {v} frames" for k, v in r["masked_slots"].items()))
    if r["gaps"]:
        add(
            "  input gaps      "
            + "; ".join(f"{t} silent {g:.2f} s from {a:.2f} s" for t, a, g in r["gaps"][:6])
            + (f" (+{len(r['gaps']) - 6} more)" if len(r["gaps"]) > 6 else "")
            + f"; about {r['frames_missed_in_gaps']} camera frames missing"
        )
    if r["lost_messages"]:
        add(
            "  LOST            "
            + ", ".join(f"{t} {n}" for t, n in r["lost_messages"].items())
            + " messages the bag index lists were not readable"
        )
    if r["bag_error"]:
        add(f"  BAG ERROR       {r['bag_error']}")
    for w in r["warnings"]:
        add(f"  warning         {w}")
    if r["outputs"]:
        add("  output bag      " + ", ".join(f"{t} {n}" for t, n in r["outputs"].items()))
    return "\n".join(lines)
