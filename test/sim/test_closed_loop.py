"""The closed loop (ALOHA sim <-> oxygen node, pi05-tiny) through the ``closed_loop`` script.

- 30+ control frames: the sim executes the chunks (its joints move), an ask sent mid-run streams
  deltas, both processes exit 0 after SIGINT, no QoS / dropped-chunk warnings in either log.
- The oxygen node killed (SIGKILL) mid-run: the sim holds its last command (finite, no jump, no
  motion while lost), reports the loss; a restarted node resumes the loop.
- Episode mode with the scripted oracle policy: a successful episode (report['episode']), and a
  latency beyond the chunk horizon reported as the failure it is.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time

import pytest
from ros_helpers import REPO, alive, child_pids, ros_env

pytest.importorskip("mujoco")
pytest.importorskip("gym_aloha")

from domain_coordinator import domain_id  # noqa: E402

from oxygen_ros.sim.closed_loop.report import checks as _checks  # noqa: E402
from oxygen_ros.sim.closed_loop.report import format_report, switch_line
from oxygen_ros.sim.closed_loop.run import build_parser, main  # noqa: E402


def _run_loop(tmp_path, *extra: str, timeout: float = 170.0) -> tuple[dict, str, int]:
    out = tmp_path / "report.json"
    with domain_id() as dom:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "oxygen_ros.sim.closed_loop.run",
                "--domain-id",
                str(dom),
                "--model",
                "pi05-tiny",
                "--num-threads",
                "1",
                "--json",
                str(out),
                "--log-dir",
                str(tmp_path / "logs"),
                "--timeout",
                str(timeout - 30),
                *extra,
            ],
            cwd=REPO,
            env=ros_env(dom),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    assert out.is_file(), proc.stdout + proc.stderr
    assert f"  wrote {out}\n" in proc.stdout  # says where
    return json.loads(out.read_text()), proc.stdout + proc.stderr, proc.returncode


def _logs(tmp_path) -> str:
    files = sorted((tmp_path / "logs").glob("*.log"))
    return "\n".join(p.read_text(errors="replace") for p in files)


@pytest.mark.ros
@pytest.mark.slow
def test_closed_loop_runs_with_language_and_exits_cleanly(tmp_path):
    report, output, rc = _run_loop(tmp_path, "--frames", "30", "--ask", "What do you see?", "--ask-at-frame", "10")
    print(output)
    assert rc == 0, output
    assert report["ok"] and all(report["checks"].values()), report["checks"]
    oxygen, sim = report["oxygen"], report["sim"]
    assert oxygen["chunks_seen"] >= 30
    assert oxygen["action_hz"] > 0 and oxygen["tok_per_s_peak"] > 0
    # the sim received and executed the chunks, and its joints moved in response
    assert sim["chunks_executed"] >= 20 and sim["executed_steps"] > 0
    assert report["joint_motion_max_rad"] > 0.05
    assert sim["real_time_factor"] > 0 and math.isfinite(sim["chunk_age_p50_ms"])
    for key in ("out_of_order", "expired", "bad_names", "bad_shape", "non_finite", "bad_times"):
        assert sim[key] == 0, key
    assert report["language"]["deltas"] > 0
    assert report["exit_codes"] == {"sim": [0], "oxygen": [0]}
    assert report["command"]["non_finite"] == 0
    logs = _logs(tmp_path).lower()
    assert "incompatible" not in logs  # rclpy's QoS-mismatch warning
    assert "[warn]" not in logs and "[error]" not in logs and "traceback" not in logs
    assert "action rate" in output and "chunk age at execution" in output
    # chunk switches measured by the sim's executor (independent chunks: some discontinuity)
    assert sim["switches"] >= 10 and sim["switch_jump_max"] >= sim["switch_jump_median"] >= 0
    assert f"{sim['switches']:.0f} measured, switch discontinuity median" in output


@pytest.mark.ros
@pytest.mark.slow
def test_killed_oxygen_node_sim_holds_reports_loss_and_resumes_after_restart(tmp_path):
    report, output, rc = _run_loop(
        tmp_path,
        "--frames",
        "12",
        "--kill-at-frame",
        "8",
        "--hold-s",
        "1.5",
        "--frames-after-restart",
        "5",
        "--ask",
        "",
    )
    print(output)
    assert rc == 0, output
    kill, cmd = report["kill"], report["command"]
    assert kill["exit_code"] == -9
    assert kill["loss_reported"] and kill["resumed"]
    assert kill["state_before_restart"] == "lost"
    # held: finite, never a jump, no motion at all while lost
    assert cmd["non_finite"] == 0
    assert cmd["max_step_change"] <= cmd["step_limit"] + 1e-9
    assert cmd["lost_messages"] > 10 and cmd["max_change_while_lost"] == 0.0
    assert report["sim"]["losses"] >= 1 and report["sim"]["resumes"] >= 1
    assert report["sim"]["switches_after_hold"] >= 1  # the restarted node's first chunk
    assert report["exit_codes"]["sim"] == [0] and report["exit_codes"]["oxygen"][-1] == 0
    sim_log = (tmp_path / "logs" / "sim.log").read_text()
    assert "command loss" in sim_log and "commands resumed" in sim_log


def test_report_formatting_survives_missing_values():
    args = build_parser().parse_args(["--frames", "5", "--kill-at-frame", "2"])
    nan = float("nan")
    report = {
        "model": "pi05-tiny",
        "frames_target": 5,
        "target_real_time_factor": 0.25,
        "checks": {},
        "error": "no action chunk within 1 s",
        "oxygen": {
            k: nan
            for k in (
                "action_hz",
                "chunk_hz",
                "frame_time_p50_ms",
                "tok_per_s_last",
                "tok_per_s_peak",
                "tokens",
                "frames",
            )
        }
        | {"chunks_seen": 0, "chunk_hz_seen": 0.0},
        "sim": {"state": None},
        "command": {
            "executed_messages": 0,
            "non_finite": 0,
            "max_step_change": 0.0,
            "max_change_while_lost": 0.0,
            "lost_messages": 0,
            "step_limit": 0.06,
        },
        "joint_motion_max_rad": 0.0,
        "language": {"deltas": 0, "text": "", "finished": []},
        "warnings": {"sim.log": ["[ERROR] [x]: boom"]},
        "exit_codes": {"sim": [1]},
        "kill": {"at_frame": 2, "exit_code": -9},
    }
    for key in (
        "sim_step_hz",
        "real_time_factor",
        "camera_hz",
        "render_ms",
        "chunk_age_p50_ms",
        "chunk_age_p95_ms",
        "chunk_age_max_ms",
        "arrival_latency_p50_ms",
        "arrival_latency_max_ms",
        "chunks_received",
        "chunks_executed",
        "same_stamp",
        "executed_steps",
        "hold_steps",
        "limited_steps",
        "losses",
        "resumes",
        "out_of_order",
        "expired",
        "bad_names",
        "bad_shape",
        "non_finite",
        "bad_times",
        "overruns",
        "camera_skipped",
    ):
        report["sim"][key] = nan
    _checks(args, report)
    text = format_report(report)
    assert not report["ok"] and "FAILED" in text and "no_error" in text
    assert "n/a" in text and "boom" in text
    assert "chunk switches   : n/a" in text


def test_report_shows_the_chunk_switch_figures():
    nan = float("nan")
    assert switch_line(
        {"switches": 12.0, "switches_after_hold": 1.0, "switch_jump_median": 0.0123, "switch_jump_max": 0.25}
    ) == (
        "12 measured, switch discontinuity median 0.0123, max 0.2500 (largest joint difference, "
        "joint units); 1 after a hold (not measured)"
    )
    # no switch yet: the sim reports '' (NaN here), never a zero that looks like a measurement
    line = switch_line({"switches": 0.0, "switches_after_hold": 0.0, "switch_jump_median": nan, "switch_jump_max": nan})
    assert line == "no measured chunk switches; 0 after a hold (not measured)"


@pytest.mark.ros
def test_a_misspelled_oxygen_parameter_stops_the_loop_before_it_starts(tmp_path):
    with domain_id() as dom:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "oxygen_ros.sim.closed_loop.run",
                "--domain-id",
                str(dom),
                "--model",
                "pi05-tiny",
                "--log-dir",
                str(tmp_path / "logs"),
                "--oxygen-param",
                "engine.tokens_per_fram:=2",
            ],
            cwd=REPO,
            env=ros_env(dom),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unknown parameter engine.tokens_per_fram (did you mean engine.tokens_per_frame?)" in proc.stderr
    assert "started aloha_sim" not in proc.stdout  # nothing was started


EPISODE_KEYS = {
    "seed",
    "policy",
    "latency_ms",
    "success",
    "time_to_success_s",
    "episode_s",
    "path_length_rad",
    "gripper_path_length",
    "max_switch_jump",
    "lift_max_m",
    "max_reward",
}


@pytest.mark.ros
@pytest.mark.slow
def test_scripted_oracle_episode_succeeds(tmp_path):
    """The oracle through the chunk path: success, reported by the sim and in report['episode']."""
    report, output, rc = _run_loop(
        tmp_path, "--policy", "scripted", "--episode-s", "12", "--seed", "0", "--ask", "", timeout=120
    )
    print(output)
    assert rc == 0, output
    ep = report["episode"]
    assert EPISODE_KEYS <= set(ep)
    assert ep["success"] is True and ep["ended_by"] == "success"
    assert ep["seed"] == 0 and ep["policy"] == "scripted" and ep["latency_ms"] == 0
    assert 5.5 < ep["time_to_success_s"] < 8.5 and ep["time_to_success_s"] <= ep["episode_s"] < 12
    assert ep["lift_max_m"] >= 0.1 and ep["max_reward"] >= 2
    assert 3.0 < ep["path_length_rad"] < 8.0 and ep["gripper_path_length"] > 1.0
    assert ep["max_switch_jump"] is not None and ep["max_switch_jump"] < 0.05  # one script
    assert report["target_real_time_factor"] == 1.0 and report["sim"]["chunks_executed"] > 50
    assert report["exit_codes"] == {"sim": [0], "scripted_policy": [0]}
    assert "episode          : SUCCESS (ended by success)" in output
    assert "task success" in (tmp_path / "logs" / "sim.log").read_text()


@pytest.mark.ros
@pytest.mark.slow
def test_an_added_latency_is_held_by_the_sim_and_the_oracle_still_succeeds(tmp_path):
    """--latency-ms 300 reaches the sim (command_delay_s): every chunk is offered to the executor
    at least 300 ms of sim time after its observation, its first points are skipped as past due,
    and the oracle (whose 1 s chunks cover the delay) still succeeds."""
    report, output, rc = _run_loop(
        tmp_path, "--policy", "scripted", "--episode-s", "12", "--seed", "0", "--latency-ms", "300", timeout=120
    )
    print(output)
    assert rc == 0, output
    ep, sim = report["episode"], report["sim"]
    assert ep["success"] is True and ep["latency_ms"] == 300
    assert sim["command_delay_s"] == pytest.approx(0.3)
    # offered at the first step >= arrival + 0.3 s; a chunk can arrive in its image's own step, so
    # the latency can be 300 ms exactly, up to the float rounding of the sim clock
    assert sim["arrival_latency_p50_ms"] >= 300 - 1e-3 and sim["late_points"] > 0


@pytest.mark.ros
@pytest.mark.slow
def test_scripted_oracle_with_a_latency_beyond_the_horizon_fails_honestly(tmp_path):
    """2 s latency > the 1 s horizon: every chunk arrives expired, the sim never executes one,
    the robot stays at the start pose and the run ends episode_s sim seconds after the first chunk."""
    report, output, rc = _run_loop(
        tmp_path, "--policy", "scripted", "--episode-s", "4", "--latency-ms", "2000", timeout=120
    )
    print(output)
    assert rc == 1, output
    ep, sim = report["episode"], report["sim"]
    assert ep["success"] is False and ep["time_to_success_s"] is None
    assert ep["ended_by"] == "time, no chunk executed" and ep["episode_started"] is False
    assert ep["latency_ms"] == 2000 and ep["lift_max_m"] == 0.0 and ep["path_length_rad"] == 0.0
    assert sim["chunks_executed"] == 0 and sim["expired"] >= 10
    failed = {k for k, v in report["checks"].items() if not v}
    assert "episode_success" in failed and "no_dropped_or_rejected_chunks" in failed
    assert report["exit_codes"] == {"sim": [0], "scripted_policy": [0]}


@pytest.mark.ros
@pytest.mark.slow
def test_an_episode_without_success_ends_after_episode_s(tmp_path):
    """An unreachable criterion (0.5 m lift): the run ends episode_s sim seconds into the episode,
    with the values of that moment."""
    report, output, rc = _run_loop(
        tmp_path, "--policy", "scripted", "--episode-s", "3", "--lift-height-m", "0.5", "--seed", "1", timeout=120
    )
    print(output)
    assert rc == 1, output
    ep = report["episode"]
    assert ep["success"] is False and ep["time_to_success_s"] is None and ep["ended_by"] == "time"
    assert 3.0 <= ep["episode_s"] < 3.6 and ep["seed"] == 1
    assert ep["path_length_rad"] > 0.5 and ep["lift_max_m"] < 0.01  # reaching, not lifted yet
    assert [k for k, v in report["checks"].items() if not v] == ["episode_success"]


@pytest.mark.ros
@pytest.mark.slow
def test_a_sim_parameter_reaches_the_sim_process(tmp_path):
    """``--sim-param`` goes to the aloha_sim process after the loop's own ``-p``: the oracle lifts
    the cube (it succeeds with the defaults, test above) but not the 0.5 m this run asks for."""
    report, output, rc = _run_loop(
        tmp_path, "--policy", "scripted", "--episode-s", "9", "--seed", "0", "--sim-param", "lift_height_m:=0.5"
    )
    print(output)
    assert rc == 1, output
    ep = report["episode"]
    assert ep["success"] is False and ep["ended_by"] == "time" and ep["lift_max_m"] >= 0.05


def test_policy_defaults_and_the_episode_line():
    from oxygen_ros.sim.closed_loop.episode import EPISODE_KEYS as keys
    from oxygen_ros.sim.closed_loop.episode import resolve_defaults
    from oxygen_ros.sim.closed_loop.report import episode_line

    assert set(keys) == EPISODE_KEYS
    a = resolve_defaults(build_parser().parse_args(["--policy", "scripted", "--episode-s", "12"]))
    assert a.rtf == 1.0 and a.ask == "" and a.latency_ms == 0.0
    assert a.lift_height_m == 0.05 and a.lift_hold_s == 1.0
    m = resolve_defaults(build_parser().parse_args([]))
    assert m.rtf == 0.25 and m.ask == "What do you see?" and m.policy == "model" and m.episode_s == 0
    assert resolve_defaults(build_parser().parse_args(["--episode-s", "5"])).ask == ""
    line = episode_line(
        {
            "success": False,
            "ended_by": "time",
            "policy": "model",
            "seed": 3,
            "latency_ms": 0.0,
            "time_to_success_s": None,
            "episode_s": 12.1,
            "lift_max_m": 0.01,
            "max_reward": 1,
            "path_length_rad": 2.5,
            "gripper_path_length": 0.3,
            "max_switch_jump": None,
        }
    )
    assert line.startswith("  episode          : no success (ended by time)") and "n/a" in line


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--policy", "scripted", "--latency-ms", "-5"], "must be >= 0"),
        (["--policy", "scripted", "--episode-s", "-1"], "must be >= 0"),
        (["--policy", "scripted", "--lift-height-m", "0"], "--lift-height-m must be > 0"),
        (["--ask-count", "3"], "needs episode mode (--episode-s) and --ask 'Where is the cube?'"),
        (["--episode-s", "5", "--ask", "What do you see?", "--ask-count", "2"], "needs episode mode"),
        (["--episode-s", "5", "--ask", "Where is the cube?", "--ask-count", "0"], "--ask-count and"),
        (["--episode-s", "5", "--ask", "Where is the cube?", "--ask-before-s", "0"], "--ask-before-s > 0"),
        (["--policy", "scripted", "--episode-s", "5", "--ask-count", "2"], "scripted policy answers no ask"),
        (["--video", "episode.gif"], "--video must name an .mp4 file"),
        (["--sim-param", "render_shadow:=true"], "--sim-param 'render_shadow:=true': not NAME:=VALUE"),
        (["--sim-param", "render_shadows=true"], "not NAME:=VALUE with an aloha_sim parameter"),
    ],
)
def test_episode_arguments_that_cannot_run_exit_2_before_any_process(argv, says, capsys):
    """Bad ranges and combinations are refused before any process starts."""
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_an_added_latency_is_the_sims_for_either_policy():
    """--latency-ms becomes the sim's command_delay_s for the model and the oracle alike; none is
    the default, and the oracle node itself publishes at once."""
    from oxygen_ros.sim.closed_loop.episode import scripted_cmd, sim_task_params
    from oxygen_ros.sim.closed_loop.run import build_parser

    for policy in ("model", "scripted"):
        args = build_parser().parse_args(["--policy", policy, "--episode-s", "5", "--latency-ms", "250"])
        assert "command_delay_s:=0.25" in sim_task_params(args)
        assert not any("command_delay_s" in a for a in sim_task_params(build_parser().parse_args(["--policy", policy])))
    args = build_parser().parse_args(["--policy", "scripted", "--latency-ms", "250"])
    assert not any("latency" in a for a in scripted_cmd(args, "python", REPO / "config" / "sim.yaml", True))


def test_a_success_after_the_episode_limit_is_not_counted():
    """The sim does not know the episode length and its status comes every 0.2 s: a success
    reached after --episode-s ends the episode by time, not as a success."""
    from oxygen_ros.sim.closed_loop.episode import EpisodeWatch, episode_report, success_within

    late = {
        "success": "True",
        "success_time_s": "12.15",
        "episode_started": "True",
        "episode_time_s": "12.2",
        "sim_time": "20.0",
    }
    on_time = {**late, "success_time_s": "11.9"}
    assert not success_within(late, 12.0) and success_within(on_time, 12.0)

    class Monitor:
        def __init__(self, d):
            self.d = d

        def last_diag(self, _name):
            return self.d

        def n_chunks(self):
            return 5

    watch = EpisodeWatch(12.0)
    assert watch.done(Monitor(late)) and watch.ended_by == "time"
    args = build_parser().parse_args(["--policy", "scripted", "--episode-s", "12"])
    rep = episode_report(args, late, watch.ended_by)
    assert rep["success"] is False and rep["time_to_success_s"] is None
    watch = EpisodeWatch(12.0)
    assert watch.done(Monitor(on_time)) and watch.ended_by == "success"
    assert episode_report(args, on_time, "success")["time_to_success_s"] == pytest.approx(11.9)


@pytest.mark.ros
@pytest.mark.slow
def test_episode_asks_are_scored_and_filmed(tmp_path):
    """Episode mode with pi05-tiny: 'Where is the cube?' asked 3 times a few chunks apart while
    the cube rests, every answer scored against the seed's initial region (random weights: wrong,
    but answered), and the top camera written to an MP4 with overlays."""
    cv2 = pytest.importorskip("cv2")
    from oxygen_ros.sim.task.answers import seed_cube_region

    video = tmp_path / "episode.mp4"
    report, output, rc = _run_loop(
        tmp_path,
        *("--episode-s", "3", "--seed", "2", "--ask", "Where is the cube?", "--ask-count", "3"),
        *("--video", str(video)),
    )
    print(output)
    assert rc == 1, output  # no success with random weights; every other check passes
    assert [k for k, v in report["checks"].items() if not v] == ["episode_success"]
    a = report["answers"]
    assert a["truth"] == seed_cube_region(2) and a["requested"] == a["asked"] == 3
    frames = [s["at_frame"] for s in a["sent"]]
    assert all(b - f >= 3 for f, b in zip(frames, frames[1:], strict=False))
    assert all(s["episode_time_s"] is None or s["episode_time_s"] < 3.0 for s in a["sent"])
    assert a["answered"] == 3 and len(a["items"]) == 3 and a["unmatched"] == 0
    assert a["accuracy"] == a["correct"] / 3 and all(it["truth"] == a["truth"] for it in a["items"])
    assert "  answers          : " in output
    v = report["video"]
    assert v["path"] == str(video) and v["frames"] >= 20 and v["error"] == ""
    cap = cv2.VideoCapture(str(video))
    n = 0
    while cap.read()[0]:
        n += 1
    cap.release()
    assert n == v["frames"]


@pytest.mark.ros
@pytest.mark.slow
def test_sigterm_stops_the_loop_and_its_nodes(tmp_path):
    """``kill`` (SIGTERM) of a running closed_loop ends it as Ctrl-C does: it stops the sim and the
    policy node (SIGINT, exit 0) and writes its report, instead of dying and leaving them running."""
    with domain_id() as dom:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oxygen_ros.sim.closed_loop.run",
                "--domain-id",
                str(dom),
                "--policy",
                "scripted",
                "--episode-s",
                "60",
                "--json",
                str(tmp_path / "report.json"),
                "--log-dir",
                str(tmp_path / "logs"),
                "--timeout",
                "120",
            ],
            cwd=REPO,
            env=ros_env(dom),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            lines = []
            for line in proc.stdout:  # the loop says when the first chunk came: both nodes run
                lines.append(line)
                if line.startswith("first chunk after"):
                    break
            nodes = child_pids(proc.pid)
            assert len(nodes) == 2, "".join(lines)
            proc.send_signal(signal.SIGTERM)
            out = "".join(lines) + proc.stdout.read()
            rc = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
        time.sleep(0.5)
        assert not [p for p in nodes if alive(p)], out
    print(out)
    report = json.loads((tmp_path / "report.json").read_text())
    assert rc == 1 and report["error"] == "interrupted"
    assert report["exit_codes"] == {"sim": [0], "scripted_policy": [0]}
