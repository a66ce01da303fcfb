"""Open-loop action accuracy of a replay (oxygen_ros.replay.accuracy): the metrics on synthetic
arrays, and end to end through ``replay()`` with a policy that predicts the bag's reference shifted
by a known offset."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from bag_edit import SAMPLE_BAG, TS, edit_bag, start_ns, window

from oxygen_ros.replay.accuracy import align_samples, evaluate, format_accuracy, reference_problem
from oxygen_ros.replay.prepare import default_params_file, load_node_config, load_policy
from oxygen_ros.replay.replay import ReplayOptions, build_parser, options_from_args, replay

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")

P = 0.02  # control period (s)
NAMES = ["left_waist", "left_elbow", "left_gripper"]


def _due(stamps: np.ndarray, h: int) -> np.ndarray:
    return stamps[:, None] + P * np.arange(1, h + 1)[None, :]


def _at(t: np.ndarray, ref_t: np.ndarray, ref_v: np.ndarray) -> np.ndarray:
    """Independent reference at ``t`` ([C, H]) for these tests -> [C, H, J]."""
    return np.stack([np.interp(t, ref_t, ref_v[:, j]) for j in range(ref_v.shape[1])], axis=-1)


@pytest.fixture
def moving():
    """A 10 s reference of 3 joints (one sine, one ramp, one gripper ramp) and 18 chunks of H=5."""
    t = np.arange(0.0, 10.0 + 1e-9, P)
    v = np.stack([np.sin(t), 0.3 * t, 0.01 * t], axis=1)
    return t, v, np.arange(0.0, 9.0, 0.5)


# ------------------------------------------------------------------ unit tests on arrays
def test_known_offset_is_the_mae_and_rmse(moving):
    t, v, stamps = moving
    offset = np.array([0.1, -0.2, 0.05])
    pred = _at(_due(stamps, 5), t, v) + offset
    acc = evaluate(pred, stamps, P, t, v, t, v, NAMES, reference_topic="/cmd")
    assert acc["available"] and acc["message"] is None and acc["reference_kind"] == "command"
    assert acc["n_chunks"] == 18 and acc["n_points"] == 90 and acc["points_outside_reference"] == 0
    for j, name in enumerate(NAMES):
        pj = acc["per_joint"][name]
        q01, q99 = np.quantile(v[:, j], [0.01, 0.99])
        assert pj["range_q01"] == pytest.approx(q01) and pj["range_q99"] == pytest.approx(q99)
        assert pj["mae"] == pytest.approx(abs(offset[j])) and pj["rmse"] == pytest.approx(abs(offset[j]))
        assert pj["mae_norm"] == pytest.approx(abs(offset[j]) / (q99 - q01))
        assert pj["rmse_norm"] == pytest.approx(abs(offset[j]) / (q99 - q01))
    assert acc["mae"] == pytest.approx(np.abs(offset).mean())
    assert acc["rmse"] == pytest.approx(np.abs(offset).mean())
    assert acc["arms"]["joints"] == NAMES[:2] and acc["grippers"]["joints"] == NAMES[2:]
    assert acc["arms"]["mae"] == pytest.approx(0.15) and acc["grippers"]["mae"] == pytest.approx(0.05)
    assert acc["by_horizon"]["mae"] == pytest.approx([np.abs(offset).mean()] * 5)
    # the gripper grouping can be overridden
    acc = evaluate(pred, stamps, P, t, v, t, v, NAMES, grippers=["left_elbow"])
    assert acc["grippers"]["joints"] == ["left_elbow"] and acc["grippers"]["mae"] == pytest.approx(0.2)
    assert set(json.loads(json.dumps(acc))) >= {
        "available",
        "message",
        "reference_topic",
        "reference_kind",
        "n_chunks",
        "n_points",
        "points_outside_reference",
        "mae",
        "rmse",
        "mae_norm",
        "rmse_norm",
        "arms",
        "grippers",
        "per_joint",
        "by_horizon",
        "hold_baseline",
    }


def test_error_growing_with_the_horizon_index(moving):
    t, v, stamps = moving
    growth = np.array([0.01, 0.02, 0.03])
    h = np.arange(1, 6)[None, :, None]
    pred = _at(_due(stamps, 5), t, v) + growth * h
    acc = evaluate(pred, stamps, P, t, v, t, v, NAMES)
    assert acc["by_horizon"]["mae"] == pytest.approx(0.02 * np.arange(1, 6))
    rng = np.array([np.subtract(*np.quantile(v[:, j], [0.99, 0.01])) for j in range(3)])
    assert acc["by_horizon"]["mae_norm"] == pytest.approx((growth / rng).mean() * np.arange(1, 6))
    assert acc["mae"] == pytest.approx(0.02 * 3)  # mean over horizon indices 1..5


def test_hold_baseline_on_a_linear_reference():
    t = np.arange(0.0, 10.0 + 1e-9, P)
    speed = np.array([0.5, -1.0, 0.2])
    v = t[:, None] * speed
    stamps = np.arange(0.0, 9.0, 0.37)
    pred = _at(_due(stamps, 4), t, v)  # a perfect policy
    acc = evaluate(pred, stamps, P, t, v, t, v, NAMES)
    base = acc["hold_baseline"]
    assert acc["mae"] == pytest.approx(0.0, abs=1e-9)
    # holding the state at the stamp: the error at index i is |speed| x (i + 1) x period
    assert base["by_horizon"]["mae"] == pytest.approx(np.abs(speed).mean() * P * np.arange(1, 5))
    assert base["mae"] == pytest.approx(np.abs(speed).mean() * P * 2.5)
    assert base["rmse"] == pytest.approx(np.abs(speed).mean() * P * np.sqrt(np.mean(np.arange(1, 5) ** 2)))
    assert base["arms"]["mae"] == pytest.approx(0.75 * P * 2.5)
    assert base["per_joint"]["left_elbow"]["mae"] == pytest.approx(1.0 * P * 2.5)
    assert set(base) >= {"mae", "rmse", "mae_norm", "rmse_norm", "arms", "grippers", "by_horizon"}


def test_zero_range_joint_has_null_normalised_values(moving):
    t, v, stamps = moving
    v = v.copy()
    v[:, 2] = 0.7  # the gripper never moved
    pred = _at(_due(stamps, 5), t, v) + 0.1
    acc = evaluate(pred, stamps, P, t, v, t, v, NAMES)
    g = acc["per_joint"]["left_gripper"]
    assert g["mae"] == pytest.approx(0.1) and g["mae_norm"] is None and g["rmse_norm"] is None
    assert acc["grippers"]["mae_norm"] is None and acc["mae_norm"] is not None  # arms only
    assert acc["flat_joints"] == ["left_gripper"] and "range ~0" in acc["message"]
    assert "null" in json.dumps(acc["per_joint"]["left_gripper"])


def test_points_outside_the_reference_are_excluded_and_counted(moving):
    t, v, stamps = moving
    stamps = np.array([-0.05, 1.0, 9.95])  # 2 points before the start, 5 - 2 after the end
    pred = _at(_due(stamps, 5), t, v) + 0.1
    pred[0, :2] = 99.0  # outside: never compared
    pred[2, 3:] = 99.0
    acc = evaluate(pred, stamps, P, t, v, t, v, NAMES)
    assert acc["points_outside_reference"] == 2 + 3 and acc["n_points"] == 15 - 5
    assert acc["n_chunks"] == 3 and acc["mae"] == pytest.approx(0.1)
    late = evaluate(pred[:1] * 0, np.array([20.0]), P, t, v, t, v, NAMES, reference_topic="/cmd")
    assert not late["available"] and "time span of /cmd" in late["message"]


def test_missing_joints_are_reported_not_zero(moving):
    t, v, stamps = moving
    samples = [(ti, ["left_gripper", "left_waist", "other"], [vi[2], vi[0], 5.0]) for ti, vi in zip(t, v)]
    ref_t, ref_v = align_samples(samples[::-1], NAMES)  # any order: sorted by time
    assert np.all(np.diff(ref_t) > 0) and np.isnan(ref_v[:, 1]).all()
    pred = _at(_due(stamps, 5), t, v) + 0.1
    acc = evaluate(pred, stamps, P, ref_t, ref_v, t, v, NAMES)
    assert acc["available"] and acc["missing_joints"] == ["left_elbow"]
    assert acc["per_joint"]["left_elbow"]["missing"] and acc["per_joint"]["left_elbow"]["mae"] is None
    assert acc["mae"] == pytest.approx(0.1) and acc["arms"]["joints"] == ["left_waist"]
    assert "missing in the reference" in acc["message"]
    none = evaluate(pred, stamps, P, *align_samples(samples, ["x", "y", "z"]), t, v, ["x", "y", "z"])
    assert not none["available"] and "--reference-joints" in none["message"]
    assert format_accuracy(none) == [f"  action accuracy not available: {none['message']}"]


def test_unnamed_reference_messages_take_the_given_names():
    t, v = align_samples([(1.0, [], [1.0, 2.0, 3.0]), (0.0, (), [4.0, 5.0, 6.0])], NAMES[::-1], NAMES)
    assert t.tolist() == [0.0, 1.0] and v.tolist() == [[6.0, 5.0, 4.0], [3.0, 2.0, 1.0]]


def test_reference_problems_and_cli_options():
    assert reference_problem("/c", {"/c": "sensor_msgs/msg/JointState"}) is None
    assert "has no /c" in reference_problem("/c", {})
    assert "not a sensor_msgs/msg/JointState" in reference_problem("/c", {"/c": "std_msgs/msg/String"})
    opts = options_from_args(
        build_parser().parse_args(["bag", "--reference-joints", "a, b,c", "--gripper-joints", "c"])
    )
    assert opts.reference_joints == ("a", "b", "c") and opts.gripper_joints == ("c",)
    assert options_from_args(build_parser().parse_args(["bag"])).gripper_joints is None


# ------------------------------------------------------------------ end to end through replay()
TINY = ("model:=pi05-tiny", "num_threads:=1")
JOINT_NAMES = list(load_node_config(default_params_file(), TINY).joint_names)  # the sample bag's
T0 = start_ns() / 1e9
SLOPE = np.linspace(-0.5, 0.5, 14)
BASE = np.linspace(-1.0, 1.0, 14)
OFFSET = np.where(["gripper" in n for n in JOINT_NAMES], 0.01, 0.05)


def linear_reference(t: np.ndarray) -> np.ndarray:
    """The commanded action written into the test bag: ``[..., 14]`` linear in time."""
    return BASE + SLOPE * (np.asarray(t)[..., None] - T0)


class ShiftedReference:
    """A pi05-tiny policy whose every chunk is the bag's reference at each point's due time plus
    OFFSET (the engine runs the model as usual; only the unnormalised actions are replaced)."""

    def __init__(self, policy, period: float) -> None:
        self._policy, self._period, self._stamp = policy, period, None
        outer = self

        class Norm:
            def __getattr__(self, name):
                return getattr(policy.normalizer, name)

            def unnormalize_actions(self, x):
                due = outer._stamp + outer._period * np.arange(1, x.shape[0] + 1)
                return linear_reference(due) + OFFSET

        self.normalizer = Norm()

    def __getattr__(self, name):
        return getattr(self._policy, name)

    def encode_observation(self, obs):
        self._stamp = obs.stamp
        return self._policy.encode_observation(obs)


@pytest.fixture(scope="module")
def tiny_policy():
    cfg = load_node_config(default_params_file(), TINY)
    return ShiftedReference(load_policy(cfg), cfg.control_period_s)


def edited(tmp_path, commands: str = "linear", state_prefix: str = ""):
    """1.5 s of the sample bag; /commanded_action linear in time ('linear'), without names
    ('unnamed') or dropped ('drop'); joint state names prefixed with ``state_prefix``."""
    src = window(SAMPLE_BAG, tmp_path / "short", 1.5)

    def edit(topic, stamp, raw):
        if topic == "/commanded_action":
            if commands == "drop":
                return []
            msg = TS.deserialize_cdr(raw, "sensor_msgs/msg/JointState")
            msg.position = linear_reference(msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9)
            if commands == "unnamed":
                msg.name = []
            raw = TS.serialize_cdr(msg, "sensor_msgs/msg/JointState")
        elif topic == "/joint_states" and state_prefix:
            msg = TS.deserialize_cdr(raw, "sensor_msgs/msg/JointState")
            msg.name = [state_prefix + n for n in msg.name]
            raw = TS.serialize_cdr(msg, "sensor_msgs/msg/JointState")
        return [(topic, stamp, bytes(raw))]

    return edit_bag(src, tmp_path / f"bag_{commands}_{state_prefix}", edit)


def run(bag, out, policy, *params, **kw):
    opts = ReplayOptions(bag=bag, out=out, params=TINY + params, progress="off", show_text=False, overwrite=True, **kw)
    return replay(opts, policy=policy)


def test_replay_reports_the_known_offset(tmp_path, tiny_policy):
    result = run(edited(tmp_path), tmp_path / "out", tiny_policy)
    assert result.ok, result.problems
    acc = json.loads((tmp_path / "out" / "report.json").read_text())["action_accuracy"]
    assert acc["available"] and acc["reference_kind"] == "command"
    assert acc["reference_topic"] == "/commanded_action"
    for name, off in zip(JOINT_NAMES, OFFSET):
        assert acc["per_joint"][name]["mae"] == pytest.approx(off, abs=1e-5)
        assert acc["per_joint"][name]["rmse"] == pytest.approx(off, abs=1e-5)
    assert acc["grippers"]["mae"] == pytest.approx(0.01, abs=1e-5)
    assert acc["arms"]["mae"] == pytest.approx(0.05, abs=1e-5)
    # points due after the last command are excluded and counted
    h = len(acc["by_horizon"]["mae"])
    last = 1.48  # the last command of the 1.5 s window (50 Hz, stamped at log time), from T0
    due = np.array([c.stamp - T0 for c in result.chunks])[:, None] + 0.02 * np.arange(1, h + 1)
    assert acc["points_outside_reference"] == int((due > last + 1e-6).sum()) > 0
    assert acc["n_points"] + acc["points_outside_reference"] == len(result.chunks) * h
    assert acc["hold_baseline"]["mae"] > 0 and len(acc["hold_baseline"]["by_horizon"]["mae"]) == h
    assert "action accuracy vs /commanded_action" in result.report
    assert (tmp_path / "out" / "action_error.png").read_bytes()[:4] == b"\x89PNG"


def test_unnamed_reference_needs_reference_joints(tmp_path, tiny_policy):
    bag = edited(tmp_path, "unnamed")
    plain = run(bag, tmp_path / "a", tiny_policy, plots=False)
    acc = plain.stats.accuracy
    assert plain.ok and acc["available"] and acc["reference_kind"] == "joint_state"
    assert "--reference-joints" in acc["message"] and "compared with the joint states" in acc["message"]
    named = run(bag, tmp_path / "b", tiny_policy, plots=False, reference_joints=tuple(JOINT_NAMES))
    acc = named.stats.accuracy
    assert acc["reference_kind"] == "command" and acc["mae"] == pytest.approx(OFFSET.mean(), abs=1e-5)
    assert not (tmp_path / "b" / "action_error.png").exists()


def test_no_usable_reference_says_so_once(tmp_path, tiny_policy):
    names = "[" + ",".join("s_" + n for n in JOINT_NAMES) + "]"
    result = run(edited(tmp_path, "drop", "s_"), tmp_path / "out", tiny_policy, f"state_joint_names:={names}")
    assert result.ok, result.problems
    acc = json.loads((tmp_path / "out" / "report.json").read_text())["action_accuracy"]
    assert acc["available"] is False and acc["mae"] is None and acc["per_joint"] == {}
    assert "no usable reference: /commanded_action has no messages" in acc["message"]
    assert "the joint states /joint_states cannot be used either" in acc["message"]
    assert "--reference-topic" in acc["message"] and "--reference-joints" in acc["message"]
    text = (tmp_path / "out" / "report.txt").read_text()
    assert text.count("action accuracy not available") == 1 and acc["message"] in text
    assert not (tmp_path / "out" / "action_error.png").exists()
