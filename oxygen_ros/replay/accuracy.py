"""Open-loop action accuracy of a replay: predicted chunks against the bag's reference.

Every point of every action chunk is compared with the reference trajectory at the point's due
time: point ``i`` (0-based) of a chunk stamped ``s`` (its observation time) is due at
``s + (i + 1) * control_period_s`` (the ``time_from_start`` the node publishes). The reference is the
commanded action recorded in the bag (``kind='command'``) or, without one, the recorded joint
states (``kind='joint_state'``); it is interpolated linearly in time (``np.interp``) per joint.
Points due outside the reference's time span are excluded and counted.

Metrics are in the joint's own units (radians; grippers in theirs): per-joint MAE and RMSE over
all compared points, the same divided by the joint's recorded range (q01-q99 of the reference over
the bag; NaN for a joint whose range is ~0), the error per horizon index, means over joints, arms
and grippers apart. The *hold* baseline predicts, for every point, the robot's joint state at the
chunk's stamp (nothing moves): the figure a policy has to beat.

``report.json`` ``action_accuracy`` keys: ``available``, ``message`` (why not available, or notes:
fallback to joint states, missing joints, zero-range joints), ``reference_topic``, ``reference_kind``
(``command`` / ``joint_state``), ``n_chunks``, ``n_points``, ``points_outside_reference``, ``mae``,
``rmse``, ``mae_norm``, ``rmse_norm`` (means over joints), ``arms`` / ``grippers`` (the same four and
``joints``), ``per_joint`` (name -> the four, ``range_q01``, ``range_q99``, ``missing``),
``by_horizon`` (``mae`` / ``mae_norm`` lists by horizon index), ``missing_joints``, ``flat_joints`` and
``hold_baseline`` (the summary keys, ``by_horizon`` and ``per_joint`` of the hold predictor).

Pure numpy: no ROS, no torch. :func:`replay_accuracy` reads what a replay's ``NodeSim`` collected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, overload

import numpy as np

__all__ = ["align_samples", "evaluate", "format_accuracy", "reference_problem", "replay_accuracy", "unavailable"]

MIN_RANGE = 1e-6
"""A joint whose q01-q99 reference range is at most this has no normalised figures (NaN)."""
_EPS = 1e-6  # s: a point due this close to the reference's ends is inside (float stamps near 1.7e9 s)


def _f(x: Any) -> float | None:
    """float, NaN/inf -> None (JSON null)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _list(a: np.ndarray) -> list[float | None]:
    return [_f(v) for v in np.asarray(a, dtype=np.float64)]


@overload
def _nanmean(a: np.ndarray, axis: None = None) -> float: ...
@overload
def _nanmean(a: np.ndarray, axis: int) -> np.ndarray: ...
def _nanmean(a: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """Mean ignoring NaN; NaN (no warning) where there is no finite value (a float64 scalar
    without ``axis``, an array along ``axis``)."""
    a = np.asarray(a, dtype=np.float64)
    n = np.isfinite(a).sum(axis=axis)
    s = np.where(np.isfinite(a), a, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean: np.ndarray | float = s / np.where(n > 0, n, np.nan)
    return mean


def align_samples(
    samples: Sequence[tuple[float, Sequence[str], Sequence[float]]],
    joint_names: Sequence[str],
    default_names: Sequence[str] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Reference messages to a time-sorted matrix in ``joint_names`` order, by name.

    Args:
        samples: ``(stamp s, names, positions)`` per message; a message with no names uses
            ``default_names`` (e.g. ``--reference-joints``) in order.
        joint_names: the ``[J]`` joints to compare (the node's ``joint_names``).

    Returns:
        ``(times [N] s, values [N, J])`` sorted by time; NaN where a message lacks a joint or has a
        non-finite position (a joint never present is all NaN: *missing*, never zero).
    """
    col = {n: j for j, n in enumerate(joint_names)}
    times = np.array([s[0] for s in samples], dtype=np.float64)
    values = np.full((len(samples), len(joint_names)), np.nan)
    for k, (_, names, pos) in enumerate(samples):
        names = list(names) or list(default_names)
        arr = np.asarray(pos, dtype=np.float64)
        idx = [(col[n], i) for i, n in enumerate(names) if n in col and i < arr.shape[0]]
        if idx:
            cols, src = zip(*idx)
            values[k, list(cols)] = arr[list(src)]
    order = np.argsort(times, kind="stable")
    return times[order], values[order]


def _interp(t: np.ndarray, times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values [N, J]`` at times ``t`` (any shape) per joint, from its finite samples ->
    ``[*t.shape, J]`` (NaN for a joint without samples)."""
    out = np.full((*t.shape, values.shape[1]), np.nan)
    for j in range(values.shape[1]):
        ok = np.isfinite(values[:, j])
        if ok.any():
            out[..., j] = np.interp(t, times[ok], values[ok, j])
    return out


def _summary(
    err: np.ndarray, rng: np.ndarray, joints: np.ndarray, names: Sequence[str], grippers: np.ndarray
) -> dict[str, Any]:
    """Summary keys of one predictor from ``err [P, H, J]`` (NaN = not compared)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mae = _nanmean(np.abs(err).reshape(-1, err.shape[2]), axis=0)
        rmse = np.sqrt(_nanmean((err**2).reshape(-1, err.shape[2]), axis=0))
        mae_n, rmse_n = mae / rng, rmse / rng
        h_mae = _nanmean(np.abs(err), axis=0)  # [H, J]
        h_norm = h_mae / rng

    def group(mask: np.ndarray) -> dict[str, Any]:
        m = mask & joints
        return {
            "mae": _f(_nanmean(mae[m])),
            "rmse": _f(_nanmean(rmse[m])),
            "mae_norm": _f(_nanmean(mae_n[m])),
            "rmse_norm": _f(_nanmean(rmse_n[m])),
            "joints": [n for n, k in zip(names, m) if k],
        }

    everything = group(np.ones_like(joints))
    return {
        "mae": everything["mae"],
        "rmse": everything["rmse"],
        "mae_norm": everything["mae_norm"],
        "rmse_norm": everything["rmse_norm"],
        "arms": group(~grippers),
        "grippers": group(grippers),
        "by_horizon": {
            "mae": _list(_nanmean(h_mae[:, joints], axis=1)),
            "mae_norm": _list(_nanmean(h_norm[:, joints], axis=1)),
        },
        "_per_joint": (mae, rmse, mae_n, rmse_n),
    }


def unavailable(message: str, reference_topic: str | None = None, reference_kind: str | None = None) -> dict[str, Any]:
    """The ``action_accuracy`` entry of a replay without a usable reference (``message``: why,
    and which option to use)."""

    def summary() -> dict[str, Any]:
        none = {"mae": None, "rmse": None, "mae_norm": None, "rmse_norm": None}
        return {
            **none,
            "arms": {**none, "joints": []},
            "grippers": {**none, "joints": []},
            "by_horizon": {"mae": [], "mae_norm": []},
        }

    return {
        "available": False,
        "message": message,
        "reference_topic": reference_topic,
        "reference_kind": reference_kind,
        "n_chunks": 0,
        "n_points": 0,
        "points_outside_reference": 0,
        **summary(),
        "per_joint": {},
        "hold_baseline": summary(),
    }


def evaluate(
    pred: np.ndarray,
    stamps: np.ndarray,
    period: float,
    ref_t: np.ndarray,
    ref_v: np.ndarray,
    state_t: np.ndarray,
    state_v: np.ndarray,
    joint_names: Sequence[str],
    grippers: Sequence[str] | None = None,
    reference_topic: str | None = None,
    reference_kind: str = "command",
    min_range: float = MIN_RANGE,
) -> dict[str, Any]:
    """Open-loop accuracy of predicted chunks against a reference, and of the hold baseline.

    Args:
        pred: ``[C, H, J]`` predicted joint positions (joint units) in ``joint_names`` order.
        stamps: ``[C]`` chunk stamps (observation times, s); point ``i`` is due at
            ``stamps + (i + 1) * period``.
        period: control period (s).
        ref_t, ref_v: reference ``[N]`` times (s, sorted) and ``[N, J]`` values (NaN = missing;
            see :func:`align_samples`).
        state_t, state_v: recorded joint states ``[M]``, ``[M, J]`` (same convention) for the hold
            baseline (the state interpolated at each chunk stamp, held for all ``H`` points).
        joint_names: ``[J]`` names; grippers: names of the gripper joints (default: names
            containing ``gripper``).
        min_range: a joint with ``q99 - q01 <= min_range`` gets NaN (null) normalised values.

    Returns:
        The ``action_accuracy`` dict of ``report.json`` (module doc; NaN -> None); ``available``
        is False (with ``message``) when no joint is in the reference or no point falls inside its
        time span.
    """
    pred = np.asarray(pred, dtype=np.float64)
    stamps = np.asarray(stamps, dtype=np.float64)
    ref_t, ref_v = np.asarray(ref_t, np.float64), np.asarray(ref_v, np.float64).reshape(len(ref_t), -1)
    names = list(joint_names)
    if pred.ndim != 3 or pred.shape[0] == 0 or pred.shape[2] != len(names):
        return unavailable(
            f"no action chunk of {len(names)} joint positions to compare", reference_topic, reference_kind
        )
    c, h, _ = pred.shape
    present = np.asarray(np.isfinite(ref_v).any(axis=0)) if len(ref_t) else np.zeros(len(names), bool)
    if not present.any():
        return unavailable(
            f"{reference_topic or 'the reference'} has no joint of joint_names "
            f"({', '.join(names[:3])}, ...)"
            + (": check the names, or give them with --reference-joints" if reference_kind == "command" else ""),
            reference_topic,
            reference_kind,
        )
    t0 = ref_t[0]  # work relative to the first sample: absolute stamps lose precision
    due = stamps[:, None] - t0 + period * np.arange(1, h + 1)[None, :]  # [C, H]
    inside = (due >= -_EPS) & (due <= ref_t[-1] - t0 + _EPS)
    n_in = int(inside.sum())
    if n_in == 0:
        return unavailable(
            f"no predicted point is due inside the time span of {reference_topic} "
            f"({c * h} points outside): reference and chunk stamps do not overlap",
            reference_topic,
            reference_kind,
        )
    target = _interp(due, ref_t - t0, ref_v)
    err = np.where(inside[..., None], pred - target, np.nan)
    hold = (
        _interp(
            stamps - t0, np.asarray(state_t, np.float64) - t0, np.asarray(state_v, np.float64).reshape(len(state_t), -1)
        )
        if len(state_t)
        else np.full((c, len(names)), np.nan)
    )
    hold_err = np.where(inside[..., None], hold[:, None, :] - target, np.nan)
    gr = np.array([(n in grippers) if grippers is not None else "gripper" in n for n in names])
    q01 = np.full(len(names), np.nan)
    q99 = np.full(len(names), np.nan)
    for j in np.nonzero(present)[0]:
        q01[j], q99[j] = np.quantile(ref_v[np.isfinite(ref_v[:, j]), j], [0.01, 0.99])
    rng = np.where(q99 - q01 > min_range, q99 - q01, np.nan)
    pol = _summary(err, rng, present, names, gr)
    base = _summary(hold_err, rng, present, names, gr)
    mae, rmse, mae_n, rmse_n = pol.pop("_per_joint")
    per_joint = {
        n: {
            "mae": _f(mae[j]),
            "rmse": _f(rmse[j]),
            "mae_norm": _f(mae_n[j]),
            "rmse_norm": _f(rmse_n[j]),
            "range_q01": _f(q01[j]),
            "range_q99": _f(q99[j]),
            "missing": not present[j],
        }
        for j, n in enumerate(names)
    }
    b_mae, b_rmse, b_mae_n, b_rmse_n = base.pop("_per_joint")
    base["per_joint"] = {
        n: {"mae": _f(b_mae[j]), "rmse": _f(b_rmse[j]), "mae_norm": _f(b_mae_n[j]), "rmse_norm": _f(b_rmse_n[j])}
        for j, n in enumerate(names)
    }
    missing = [n for n, p in zip(names, present) if not p]
    flat = [n for j, n in enumerate(names) if present[j] and not np.isfinite(rng[j])]
    notes = ([f"joints missing in the reference (not compared): {', '.join(missing)}"] if missing else []) + (
        [f"no normalised figures (recorded range ~0) for: {', '.join(flat)}"] if flat else []
    )
    return {
        "available": True,
        "message": "; ".join(notes) or None,
        "reference_topic": reference_topic,
        "reference_kind": reference_kind,
        "n_chunks": int(inside.any(axis=1).sum()),
        "n_points": n_in,
        "points_outside_reference": int(c * h - n_in),
        **pol,
        "per_joint": per_joint,
        "missing_joints": missing,
        "flat_joints": flat,
        "hold_baseline": base,
    }


def reference_problem(topic: str | None, types: dict[str, str]) -> str | None:
    """Why ``topic`` cannot be the commanded-action reference of a bag with topics ``types``
    (topic -> message type), or None when it can."""
    if not topic:
        return "no --reference-topic given"
    if topic not in types:
        return f"the bag has no {topic} (--reference-topic)"
    if types[topic] != "sensor_msgs/msg/JointState":
        return f"{topic} is a {types[topic]}, not a sensor_msgs/msg/JointState"
    return None


def replay_accuracy(
    sim: Any,
    joint_state_topic: str,
    reference_topic: str | None,
    reference_note: str | None = None,
    reference_joints: Sequence[str] = (),
    grippers: Sequence[str] | None = None,
) -> dict[str, Any]:
    """:func:`evaluate` on what a replay's ``NodeSim`` collected.

    Uses ``sim.chunks`` (``actions [H, J]`` joint positions in ``sim.cfg.joint_names`` order,
    ``stamp`` s), ``sim.reference_samples`` (``(stamp, names, positions)`` of the reference topic),
    ``sim.states`` (``(stamp, [S])`` in ``sim.state_names`` order) and ``sim.position_chunks``.

    Args:
        joint_state_topic: the node's joint-state topic (the fallback reference).
        reference_topic: the commanded-action topic read from the bag (None: not usable).
        reference_note: why the reference topic is not usable (said in the message).
        reference_joints: names of the reference positions when its messages carry none.
        grippers: gripper joint names (default: names containing ``gripper``).
    """
    names = list(sim.cfg.joint_names)
    period = float(sim.cfg.control_period_s)
    if not sim.position_chunks:
        return unavailable(
            "the action chunks are not joint positions of joint_names (action space "
            f"{sim.cfg.action_space.kind}): no open-loop comparison",
            reference_topic,
        )
    state_names = list(sim.state_names)
    state_t, state_v = align_samples([(s, state_names, v) for s, v in sim.states], names)
    kind, topic, note = "command", reference_topic, None
    ref_t, ref_v = align_samples(sim.reference_samples, names, reference_joints)
    if topic is None or not len(ref_t) or not np.isfinite(ref_v).any():
        note = reference_note or (
            f"{topic} has no messages"
            if not len(ref_t)
            else f"{topic} has no joint of joint_names (use --reference-joints)"
        )
        kind, topic = "joint_state", joint_state_topic
        ref_t, ref_v = state_t, state_v
    if not sim.chunks:
        return unavailable("no action chunk was produced", topic, kind)
    pred = np.stack([np.asarray(c.actions, dtype=np.float64) for c in sim.chunks])
    stamps = np.array([c.stamp for c in sim.chunks], dtype=np.float64)
    out = evaluate(pred, stamps, period, ref_t, ref_v, state_t, state_v, names, grippers, topic, kind)
    if note and out["available"]:
        out["message"] = f"{note}; compared with the joint states {topic}" + (
            f" ({out['message']})" if out["message"] else ""
        )
    elif note:
        out["message"] = (
            f"no usable reference: {note}, and the joint states {topic} cannot be used "
            f"either ({out['message']}); pass --reference-topic TOPIC (a JointState "
            "topic of commands; --reference-joints NAMES when it has no names)"
        )
    return out


def _v(x: float | None, nd: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def format_accuracy(acc: dict[str, Any], first: int = 5) -> list[str]:
    """The report.txt lines of an ``action_accuracy`` dict (a single line when unavailable)."""
    if not acc:
        return []
    if not acc["available"]:
        return [f"  action accuracy not available: {acc['message']}"]
    b = acc["hold_baseline"]
    lines = [
        f"  action accuracy vs {acc['reference_topic']} ({acc['reference_kind']}; "
        f"{acc['n_chunks']} chunks, {acc['n_points']} points, "
        f"{acc['points_outside_reference']} outside the reference excluded)"
    ]
    add = lines.append
    add("                  policy MAE (normalised)   hold-state baseline MAE (normalised)")
    for label, p, q in (
        ("all joints", acc, b),
        ("arms", acc["arms"], b["arms"]),
        ("grippers", acc["grippers"], b["grippers"]),
    ):
        if label != "all joints" and not p["joints"]:
            continue
        add(
            f"    {label:<14}{_v(p['mae']):>8} ({_v(p['mae_norm'], 3):>5})"
            f"{'':12}{_v(q['mae']):>8} ({_v(q['mae_norm'], 3):>5})"
        )
    hp, hb = acc["by_horizon"]["mae"][:first], b["by_horizon"]["mae"][:first]
    add(
        "    by horizon  policy "
        + " ".join(_v(x) for x in hp)
        + " | hold "
        + " ".join(_v(x) for x in hb)
        + f" (MAE, first {len(hp)} of {len(acc['by_horizon']['mae'])})"
    )
    worst = sorted(
        ((v["mae_norm"], n) for n, v in acc["per_joint"].items() if v["mae_norm"] is not None), reverse=True
    )[:3]
    if worst:
        add("    worst joints " + ", ".join(f"{n} {v:.3f}" for v, n in worst) + " (normalised MAE)")
    if acc["message"]:
        add(f"    note        {acc['message']}")
    return lines
