"""``evaluate``: episodes, rows of failed and timed-out episodes, the table, the aggregate, and a real
run on a local Ray instance (2 workers, 3 small bags, one broken; a rerun skips finished ones)."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oxygen_ros.evaluate.cli import main as evaluate_main
from oxygen_ros.evaluate.episodes import (
    CLOSED_LOOP,
    OPEN_LOOP,
    Episode,
    EvaluateError,
    closed_loop_episodes,
    find_bags,
    open_loop_episodes,
)
from oxygen_ros.evaluate.results import OutputFolder, aggregate, format_aggregate, wilson_interval
from oxygen_ros.evaluate.runner import row_from_outputs, run_episode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bag_edit import SAMPLE_BAG, window  # noqa: E402


def _broken_bag(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "metadata.yaml").write_text("not: [a, bag\n")
    return path


def test_find_bags_and_episode_ids(tmp_path):
    for name in ("b", "a"):
        (tmp_path / "bags" / name).mkdir(parents=True)
        (tmp_path / "bags" / name / "metadata.yaml").write_text("x")
    (tmp_path / "bags" / "notes.txt").write_text("not a bag")
    single = tmp_path / "one.mcap"
    single.write_bytes(b"")
    bags = find_bags([tmp_path / "bags", single, tmp_path / "bags" / "a"])
    assert [b.name for b in bags] == ["a", "b", "one.mcap", "a"]
    eps = open_loop_episodes(bags, ["--model", "pi05-tiny"])
    assert [e.id for e in eps] == ["a", "b", "one", "a-2"]  # unique, in order
    cmd = eps[0].command(tmp_path / "out")
    assert cmd[1:4] == ["-m", "oxygen_ros.evaluate.runner", "oxygen_ros.replay.replay"] and str(tmp_path / "out") in cmd
    assert cmd[-2:] == ["--model", "pi05-tiny"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(EvaluateError, match="neither a bag"):
        find_bags([tmp_path / "empty"])
    with pytest.raises(EvaluateError, match="does not exist"):
        find_bags([tmp_path / "nope"])


def test_closed_loop_episodes():
    eps = closed_loop_episodes(range(3, 5), "scripted", [0, 100], 12.0, 300.0, ["--rtf", "1"])
    assert [e.id for e in eps] == [
        "scripted-lat0ms-seed0003",
        "scripted-lat0ms-seed0004",
        "scripted-lat100ms-seed0003",
        "scripted-lat100ms-seed0004",
    ]
    assert eps[2].columns == {"model": "", "seed": 3, "policy": "scripted", "latency_ms": 100.0}
    args = eps[2].args
    assert args[args.index("--latency-ms") + 1] == "100" and args[args.index("--seed") + 1] == "3"
    assert args[args.index("--ask") + 1] == "" and args[-2:] == ("--rtf", "1")
    with pytest.raises(EvaluateError):
        closed_loop_episodes([], "model", [0], 12.0, 300.0)
    with pytest.raises(EvaluateError):
        closed_loop_episodes([0], "model", [-5], 12.0, 300.0)


def test_wilson_interval_known_values():
    low, high = wilson_interval(18, 20)
    assert low == pytest.approx(0.6990, abs=1e-3) and high == pytest.approx(0.9721, abs=1e-3)
    low, high = wilson_interval(0, 20)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.1611, abs=1e-3)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def _ep(kind: str = CLOSED_LOOP) -> Episode:
    return Episode("x", kind, {"seed": 1, "policy": "scripted", "latency_ms": 0.0}, "json.tool")


def test_closed_loop_rows(tmp_path):
    (tmp_path / "report.json").write_text(
        json.dumps(
            {
                "episode": {
                    "success": True,
                    "time_to_success_s": 7.1,
                    "episode_s": 7.1,
                    "path_length_rad": 3.2,
                    "gripper_path_length": 1.0,
                    "max_switch_jump": 0.01,
                    "lift_max_m": 0.2,
                    "max_reward": 4,
                    "seed": 1,
                },
                "checks": {"command_finite": True, "step_limit": False},
            }
        )
    )
    row = row_from_outputs(_ep(), tmp_path, 1, "", 12.0, False)
    assert row["status"] == "ok" and row["success"] is True and row["checks_failed"] == "step_limit"
    (tmp_path / "report.json").write_text(json.dumps({"error": "no action chunk within 60 s", "episode": {}}))
    row = row_from_outputs(_ep(), tmp_path, 1, "", 60.0, False)
    assert row["status"] == "failed" and "no action chunk" in row["error"]
    (tmp_path / "report.json").unlink()
    row = row_from_outputs(_ep(), tmp_path, -11, "Traceback\nSegmentation fault", 3.0, False)
    assert row["status"] == "failed" and "exit -11" in row["error"] and "Segmentation" in row["error"]
    row = row_from_outputs(_ep(), tmp_path, -2, "", 30.0, True)
    assert row["status"] == "timed_out" and row["error"].startswith("timed out after 30 s")


def _spawning_episode(tmp_path: Path, name: str) -> Path:
    """A module that starts a long-sleeping child, writes its pid to argv[1], then sleeps."""
    mod = tmp_path / "mods" / f"{name}.py"
    mod.parent.mkdir(exist_ok=True)
    mod.write_text(
        "import subprocess, sys, time\n"
        'child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])\n'
        'open(sys.argv[1], "w").write(str(child.pid))\n'
        "time.sleep(120)\n"
    )
    return mod


def _assert_gone(pid: int, after: str) -> None:
    """Fail unless process ``pid`` ends within 5 s."""
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"the episode's child process {pid} outlived {after}")


def test_run_episode_timeout_stops_the_whole_process_group(tmp_path):
    """A hung episode is stopped at its limit with everything it started, and is a timed-out row."""
    mod = _spawning_episode(tmp_path, "hang_episode")
    pid_file = tmp_path / "child.pid"
    ep = Episode("hang", OPEN_LOOP, {"bag": "x"}, "hang_episode", (str(pid_file),))
    t0 = time.monotonic()
    row = run_episode(ep, tmp_path / "ep", 3.0, env={"PYTHONPATH": str(mod.parent)})
    assert row["status"] == "timed_out" and row["episode"] == "hang"
    assert time.monotonic() - t0 < 30.0  # SIGINT ends the leader; the group is then killed
    _assert_gone(int(pid_file.read_text()), "the timeout")
    assert (tmp_path / "ep" / "output.log").is_file()


def test_an_episode_starting_during_an_interrupt_stops_itself(tmp_path, monkeypatch):
    """evaluate writes its stop file, then signals the episodes whose pid files it finds: an
    episode that was not started yet does not start, and one whose process started in between
    (its pid file came too late to be found) stops its own process group."""
    import subprocess

    from oxygen_ros.evaluate.runner import STOP_FILE

    mod = _spawning_episode(tmp_path, "slow_episode")
    env = {"PYTHONPATH": str(mod.parent)}
    root = tmp_path / "episodes"
    root.mkdir()
    pid_file = tmp_path / "child.pid"
    ep = Episode("slow", OPEN_LOOP, {"bag": "x"}, "slow_episode", (str(pid_file),))
    (root / STOP_FILE).write_text("interrupted\n")
    row = run_episode(ep, root / "slow", 60.0, env=env)
    assert row["status"] == "failed" and "interrupted" in row["error"] and not pid_file.exists()
    (root / STOP_FILE).unlink()
    # the stop file appears in the instant after the episode's process started
    real_popen = subprocess.Popen

    def popen_then_interrupt(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        for _ in range(100):  # let the episode start its child before the interrupt
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.1)
        (root / STOP_FILE).write_text("interrupted\n")
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_interrupt)
    t0 = time.monotonic()
    row = run_episode(ep, root / "slow", 60.0, env=env)
    assert time.monotonic() - t0 < 30.0 and row["status"] == "failed"
    _assert_gone(int(pid_file.read_text()), "the interrupt")


def test_episode_process_starts_with_sigint_unblocked(tmp_path):
    """A Ray worker blocks SIGINT and its children inherit the mask: the runner clears it, so an
    episode (and the nodes it starts) can be stopped cleanly."""
    mod = tmp_path / "mods" / "mask_episode.py"
    mod.parent.mkdir()
    mod.write_text(
        "import sys\n"
        'line = [ln for ln in open("/proc/self/status") if ln.startswith("SigBlk")][0]\n'
        'open(sys.argv[1], "w").write(line)\n'
    )
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])  # as in a Ray worker
    try:
        row = run_episode(
            Episode("mask", OPEN_LOOP, {}, "mask_episode", (str(tmp_path / "mask"),)),
            tmp_path / "ep",
            30.0,
            env={"PYTHONPATH": str(mod.parent)},
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    assert row["exit_code"] == 0
    assert int((tmp_path / "mask").read_text().split()[1], 16) & (1 << (signal.SIGINT - 1)) == 0


def test_aggregate_closed_loop_groups_and_failures():
    rows = [
        {
            "episode": f"e{i}",
            "kind": CLOSED_LOOP,
            "policy": "scripted",
            "latency_ms": 0.0,
            "status": "ok",
            "success": i < 9,
            "time_to_success_s": 7.0 if i < 9 else None,
            "path_length_rad": 2.0,
            "max_switch_jump": 0.1 * i,
            "lift_max_m": 0.2,
            "max_reward": [4, 4, 4, 4, 4, 4, 4, 4, 4, 1][i] if i != 8 else None,  # one not reported
        }
        for i in range(10)
    ]
    rows.append(
        {
            "episode": "e10",
            "kind": CLOSED_LOOP,
            "policy": "scripted",
            "latency_ms": 0.0,
            "status": "timed_out",
            "error": "timed out after 900 s",
        }
    )
    agg = aggregate(rows, CLOSED_LOOP)
    (g,) = agg["groups"]
    assert (g["episodes"], g["completed"], g["failed"], g["successes"]) == (11, 10, 1, 9)
    assert g["success_rate"] == pytest.approx(0.9)
    assert (g["wilson95_low"], g["wilson95_high"]) == pytest.approx(wilson_interval(9, 10))
    assert g["max_switch_jump_max"] == pytest.approx(0.9)
    # partial progress: the right gripper touched the cube (reward >= 1); an unreported reward is no touch
    assert g["touched"] == 9 and g["touched_rate"] == pytest.approx(0.9)
    assert (g["touched_wilson95_low"], g["touched_wilson95_high"]) == pytest.approx(wilson_interval(9, 10))
    text = format_aggregate(agg)
    assert "9/10" in text and "TIMED_OUT e10: timed out after 900 s" in text
    assert text.splitlines()[1].split()[-1] == "touched" and "0.900      9/10  (1 failed" in text.splitlines()[2]


def test_output_folder_resume_rules(tmp_path):
    out = tmp_path / "ev"
    folder = OutputFolder(out, {"kind": OPEN_LOOP, "options": ["--model", "a"]})
    ep_ok, ep_bad = Episode("ok", OPEN_LOOP, {}, "m"), Episode("bad", OPEN_LOOP, {}, "m")
    folder.save_row({"episode": "ok", "status": "ok", "args": []})
    folder.save_row({"episode": "bad", "status": "failed", "error": "x", "args": []})
    again = OutputFolder(out, {"kind": OPEN_LOOP, "options": ["--model", "a"]})
    assert again.finished(ep_ok) == {"episode": "ok", "status": "ok", "args": []}
    assert again.finished(ep_bad) is None  # failed episodes run again
    with pytest.raises(EvaluateError, match="other settings"):
        OutputFolder(out, {"kind": OPEN_LOOP, "options": ["--model", "b"]})
    fresh = OutputFolder(out, {"kind": OPEN_LOOP, "options": ["--model", "b"]}, overwrite=True)
    assert fresh.finished(ep_ok) is None
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "f.txt").write_text("x")
    with pytest.raises(EvaluateError, match="not an evaluation folder"):
        OutputFolder(tmp_path / "other", {"kind": OPEN_LOOP, "options": []})


def test_bad_options_fail_before_any_episode(tmp_path, capsys):
    assert evaluate_main(["open-loop", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert evaluate_main(["open-loop", str(SAMPLE_BAG), "--out", str(tmp_path / "o"), "--workers", "0"]) == 2
    assert evaluate_main(["closed-loop", "--episodes", "0", "--out", str(tmp_path / "o")]) == 2


def _table(out: Path) -> list[dict[str, str]]:
    with open(out / "episodes.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_evaluate_open_loop_on_local_ray(tmp_path, capsys):
    """3 small bags, 2 workers on an embedded Ray instance: 3 rows, the broken bag a failed row with
    its error; a rerun skips the finished episodes; the same inputs give the same metrics."""
    bags = tmp_path / "bags"
    bags.mkdir()
    window(SAMPLE_BAG, bags / "first_2s", 2.0)
    window(SAMPLE_BAG, bags / "first_3s", 3.0)
    _broken_bag(bags / "zz_broken")
    out = tmp_path / "eval"
    argv = [
        "open-loop",
        str(bags),
        "--out",
        str(out),
        "--workers",
        "2",
        "--model",
        "pi05-tiny",
        "--max-frames",
        "4",
        "--no-plots",
        "--progress",
        "off",
    ]
    assert evaluate_main(argv) == 1  # one episode failed
    err = capsys.readouterr().err  # no bar (--progress off): a line per finished episode as it ends
    assert "evaluate: episode first_2s ok (" in err and "evaluate: episode first_3s ok (" in err, err
    assert "evaluate: episode zz_broken failed" in err, err
    rows = _table(out)
    assert [r["episode"] for r in rows] == ["first_2s", "first_3s", "zz_broken"]
    assert [r["status"] for r in rows] == ["ok", "ok", "failed"]
    assert "cannot open bag" in rows[2]["error"] and rows[2]["exit_code"] == "2"
    for r in rows[:2]:
        assert r["reference_available"] == "True" and float(r["mae"]) > 0 and float(r["hold_mae"]) > 0
    report = json.loads((out / "report.json").read_text())
    assert report["completed"] == 2 and report["failed"][0]["episode"] == "zz_broken"
    assert (out / "action_error.png").is_file()
    capsys.readouterr()
    stamps = {r["episode"]: (out / "episodes" / r["episode"] / "result.json").stat().st_mtime_ns for r in rows}

    assert evaluate_main(argv) == 1  # rerun: the broken bag runs again, the others are skipped
    assert "2 of 3 episodes already finished" in capsys.readouterr().err
    for eid in ("first_2s", "first_3s"):
        assert (out / "episodes" / eid / "result.json").stat().st_mtime_ns == stamps[eid]
    assert (out / "episodes" / "zz_broken" / "result.json").stat().st_mtime_ns != stamps["zz_broken"]
    assert len(_table(out)) == 3

    out2 = tmp_path / "eval2"
    assert evaluate_main([*argv[:3], str(out2), *argv[4:]]) == 1
    metrics = ("n_chunks", "n_points", "mae", "rmse", "mae_norm", "hold_mae", "hold_mae_norm")
    assert [[r[m] for m in metrics] for r in _table(out2)] == [[r[m] for m in metrics] for r in rows]


def test_a_latency_for_the_model_reaches_every_episode(tmp_path):
    """An added latency applies to the model as to the oracle (the sim holds the chunks): each
    latency is a set of episodes whose command carries it and whose row is labelled with it."""
    from oxygen_ros.evaluate.cli import _episodes, _forwarded, build_parser

    args = build_parser().parse_args(
        ["closed-loop", "--episodes", "2", "--latency-ms", "0", "300", "--model", "pi05-tiny", "--out", str(tmp_path)]
    )
    eps = _episodes(args, _forwarded(args))
    assert [(e.columns["policy"], e.columns["latency_ms"], e.columns["seed"]) for e in eps] == [
        ("model", 0.0, 0),
        ("model", 0.0, 1),
        ("model", 300.0, 0),
        ("model", 300.0, 1),
    ]
    for e in eps:
        assert e.args[e.args.index("--latency-ms") + 1] == f"{e.columns['latency_ms']:g}"


def test_review_rules_refused_before_any_episode(tmp_path, capsys):
    """Options whose rows would lie are refused: the model's default silently random, an option
    evaluate sets itself passed through --loop-arg."""
    out = str(tmp_path / "o")
    assert evaluate_main(["closed-loop", "--episodes", "1", "--out", out]) == 2
    assert "--policy model needs --model" in capsys.readouterr().err
    assert (
        evaluate_main(["closed-loop", "--episodes", "1", "--policy", "scripted", "--out", out, "--loop-arg=--seed=3"])
        == 2
    )
    assert "evaluate sets --seed itself" in capsys.readouterr().err
    eps = closed_loop_episodes([0], "scripted", [0, 0.0, 100], 12.0, 300.0, model="scripted")
    assert [e.id for e in eps] == ["scripted-lat0ms-seed0000", "scripted-lat100ms-seed0000"]
    assert eps[0].columns["model"] == "scripted"


def test_a_rerun_reuses_a_row_only_for_the_same_command(tmp_path):
    """An id alone is not the episode: another episode length (or bag path) runs again."""
    folder = OutputFolder(tmp_path / "ev", {"kind": CLOSED_LOOP, "options": []})
    ep12 = closed_loop_episodes([0], "scripted", [0], 12.0, 300.0)[0]
    ep3 = closed_loop_episodes([0], "scripted", [0], 3.0, 300.0)[0]
    assert ep12.id == ep3.id
    folder.save_row({"episode": ep12.id, "status": "ok", "args": list(ep12.args)})
    assert folder.finished(ep12) is not None and folder.finished(ep3) is None
    a, b = tmp_path / "A" / "run1", tmp_path / "B" / "run1"
    for bag in (a, b):
        bag.mkdir(parents=True)
        (bag / "metadata.yaml").write_text("x")
    (ea,), (eb,) = open_loop_episodes([a]), open_loop_episodes([b])
    folder.save_row({"episode": ea.id, "status": "ok", "args": list(ea.args)})
    assert ea.id == eb.id and folder.finished(ea) is not None and folder.finished(eb) is None


def test_closed_loop_episodes_get_their_own_domain_and_no_stale_report(tmp_path, monkeypatch):
    """With ROS_DOMAIN_ID exported, parallel loops would share one domain (and each other's
    chunks): the episode's process does not inherit it. A previous attempt's report is removed
    before the episode starts, so a crash is never read as the old result."""
    mod = tmp_path / "mods" / "env_episode.py"
    mod.parent.mkdir()
    mod.write_text(
        'import os, sys\nopen(sys.argv[1], "w").write(os.environ.get("ROS_DOMAIN_ID", "unset"))\nsys.exit(1)\n'
    )
    monkeypatch.setenv("ROS_DOMAIN_ID", "7")
    ep_dir = tmp_path / "ep"
    ep_dir.mkdir()
    (ep_dir / "report.json").write_text(json.dumps({"episode": {"success": True}, "checks": {}}))
    ep = Episode("x", CLOSED_LOOP, {"seed": 0}, "env_episode", (str(tmp_path / "dom"),))
    row = run_episode(ep, ep_dir, 30.0, env={"PYTHONPATH": str(mod.parent)})
    assert (tmp_path / "dom").read_text() == "unset"
    assert row["status"] == "failed" and "no readable report.json" in row["error"]


def test_open_loop_row_says_which_reference(tmp_path):
    """A bag compared with its joint states (no command topic) says so in its row."""
    (tmp_path / "report.json").write_text(
        json.dumps(
            {
                "summary": {"chunks": 3, "frame_time_p50_s": 0.1},
                "action_accuracy": {
                    "available": True,
                    "reference_kind": "joint_state",
                    "reference_topic": "/joint_states",
                    "message": "/commanded_action is not in the bag; compared with the joint states",
                    "mae": 0.1,
                    "mae_norm": 0.2,
                    "hold_baseline": {"mae": 0.05},
                },
            }
        )
    )
    row = row_from_outputs(Episode("b", OPEN_LOOP, {"bag": "b"}, "m"), tmp_path, 0, "", 1.0, False)
    assert row["status"] == "ok" and row["reference_kind"] == "joint_state"
    assert "compared with the joint states" in row["note"]


def test_resources_no_node_has_are_refused():
    from oxygen_ros.evaluate.scheduler import RayOptions, check_resources

    class FakeRay:
        @staticmethod
        def cluster_resources():
            return {"CPU": 2.0}

    check_resources(FakeRay, RayOptions(workers=2, cpus=1.0))
    with pytest.raises(ValueError, match="asks for 1 GPU but the Ray instance has 0"):
        check_resources(FakeRay, RayOptions(workers=1, cpus=1.0, gpus=1.0))
    with pytest.raises(ValueError, match="4 CPU"):
        check_resources(FakeRay, RayOptions(workers=1, cpus=4.0))


def test_without_ray_evaluate_says_what_to_install_before_writing_anything(tmp_path, capsys, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_ray(name, *args, **kw):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    out = tmp_path / "eval"
    assert evaluate_main(["open-loop", str(SAMPLE_BAG), "--out", str(out), "--model", "pi05-tiny"]) == 2
    err = capsys.readouterr().err
    assert "evaluate runs its episodes on Ray, which is not installed here" in err and "requirements-eval.txt" in err
    assert not out.exists()


_EMBEDDED = """
import os, sys
from oxygen_ros.evaluate.scheduler import RayOptions, _init_ray
ray = _init_ray(RayOptions(workers=1))
print('RAY_AUTH_MODE=' + os.environ.get('RAY_AUTH_MODE', '(unset)'), ray.get(ray.put(41)) + 1)
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "disabled"])
def test_the_embedded_ray_starts_without_its_token_auth_warning(mode):
    """The embedded instance as evaluate starts it, in a fresh process: Ray's token authentication
    chosen explicitly (Ray warned 'Token authentication is enabled for this Ray cluster' on every
    start when the mode was unset); a user's RAY_AUTH_MODE stays."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    if mode:
        env["RAY_AUTH_MODE"] = mode
    r = subprocess.run([sys.executable, "-c", _EMBEDDED], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-1] == f"RAY_AUTH_MODE={mode or 'token'} 42", r.stdout
    assert "Token authentication" not in r.stderr, r.stderr[-3000:]


def test_closed_loop_episodes_pass_the_asks_and_the_video():
    eps = closed_loop_episodes(range(2), "model", [0], 6.0, 300.0, [], "pi05-tiny", "Where is the cube?", 4, "first")
    a0, a1 = eps[0].args, eps[1].args
    assert a0[a0.index("--ask") + 1] == "Where is the cube?" and a0[a0.index("--ask-count") + 1] == "4"
    assert a0[a0.index("--video") + 1] == "{out}/episode.mp4" and "--video" not in a1  # the first only
    assert all("--video" in e.args for e in closed_loop_episodes(range(2), "model", [0], 6.0, 300.0, video="all"))
    plain = closed_loop_episodes([0], "model", [0], 6.0, 300.0)[0].args
    assert "--ask-count" not in plain and "--video" not in plain
    with pytest.raises(EvaluateError, match="--ask-count"):
        closed_loop_episodes([0], "model", [0], 6.0, 300.0, ask="Where is the cube?", ask_count=0)
    with pytest.raises(EvaluateError, match="--video"):
        closed_loop_episodes([0], "model", [0], 6.0, 300.0, video="some")


def _answers_report(correct: list[bool]) -> dict:
    return {
        "asked": len(correct),
        "answered": len(correct) - 1,
        "correct": sum(correct),
        "accuracy": sum(correct) / len(correct),
        "items": [{"answer": "back left" if c else "front", "truth": "back left", "correct": c} for c in correct],
    }


def test_closed_loop_row_keeps_the_answers_and_the_video(tmp_path):
    (tmp_path / "report.json").write_text(
        json.dumps(
            {
                "episode": {"success": False, "seed": 1},
                "checks": {},
                "answers": {**_answers_report([True, False, False]), "question": "Where is the cube?"},
                "video": {"path": str(tmp_path / "episode.mp4"), "frames": 10},
            }
        )
    )
    row = row_from_outputs(_ep(), tmp_path, 1, "", 12.0, False)
    assert row["status"] == "ok"
    assert (row["answers_asked"], row["answers_answered"], row["answers_correct"]) == (3, 2, 1)
    assert row["answer_accuracy"] == pytest.approx(1 / 3) and row["video"] == str(tmp_path / "episode.mp4")
    assert row["answers"][0] == {"answer": "back left", "truth": "back left", "correct": True}
    (tmp_path / "report.json").write_text(json.dumps({"episode": {"success": True}, "checks": {}}))
    row = row_from_outputs(_ep(), tmp_path, 0, "", 12.0, False)
    assert row["answers_asked"] is None and row["answer_accuracy"] is None and row["video"] is None


def test_aggregate_answer_accuracy_per_group_and_overall(tmp_path):
    def row(i: int, lat: float, correct: int | None, status: str = "ok") -> dict:
        r = {"episode": f"e{i}", "kind": CLOSED_LOOP, "policy": "model", "latency_ms": lat, "status": status}
        if status == "ok":
            r["success"] = i % 2 == 0
            asked = None if correct is None else 4
            r.update(answers_asked=asked, answers_answered=asked, answers_correct=correct)
        return r

    rows = [row(0, 0.0, 4), row(1, 0.0, 1), row(2, 0.0, None), row(3, 50.0, 0), row(4, 50.0, None, "failed")]
    agg = aggregate(rows, CLOSED_LOOP)
    g0, g50 = agg["groups"]
    assert (g0["answer_episodes"], g0["answers_asked"], g0["answers_correct"]) == (2, 8, 5)
    assert g0["answer_accuracy"] == pytest.approx(5 / 8) and g0["successes"] == 2
    assert (g50["answers_asked"], g50["answer_accuracy"]) == (4, 0.0)  # the failed episode is not counted
    assert agg["answers"]["answers_asked"] == 12 and agg["answers"]["answer_accuracy"] == pytest.approx(5 / 12)
    text = format_aggregate(agg)
    assert "answers" in text.splitlines()[1] and "5/8" in text and "0.62" in text
    assert "answers (all groups): 5/12 correct (accuracy 0.42)" in text
    mixed = format_aggregate(aggregate([row(0, 0.0, 4), {**row(5, 100.0, None), "policy": "scripted"}], CLOSED_LOOP))
    assert mixed.splitlines()[3].split()[-2:] == ["-", "-"]  # a group that asked nothing: no 0/0
    plain = format_aggregate(aggregate([row(0, 0.0, None)], CLOSED_LOOP))
    assert "answers" not in plain and aggregate([row(0, 0.0, None)], CLOSED_LOOP)["answers"]["answer_accuracy"] is None
    folder = OutputFolder(tmp_path / "ev", {"kind": CLOSED_LOOP, "options": []})
    rows[0]["answers"] = [{"answer": "back left", "truth": "back left", "correct": True}]
    folder.write_table(rows, CLOSED_LOOP)
    table = _table(tmp_path / "ev")
    assert table[0]["answers_correct"] == "4" and "answers" not in table[0]  # the list: JSON only
    assert json.loads((tmp_path / "ev" / "episodes.json").read_text())[0]["answers"][0]["correct"] is True


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--policy", "scripted", "--ask", "Where is the cube?"], "scripted policy answers no ask"),
        (["--model", "pi05-tiny", "--ask", "What do you see?", "--ask-count", "3"], "checkable question"),
        (["--model", "pi05-tiny", "--loop-arg=--video=x.mp4"], "evaluate sets --video itself"),
        (["--model", "pi05-tiny", "--loop-arg=--ask-count=2"], "evaluate sets --ask-count itself"),
    ],
)
def test_ask_and_video_options_refused_before_any_episode(tmp_path, capsys, extra, says):
    pytest.importorskip("ray")
    assert evaluate_main(["closed-loop", "--episodes", "1", "--out", str(tmp_path / "o"), *extra]) == 2
    assert says in capsys.readouterr().err


def _finished_run(root, kind, rows):
    root.mkdir(parents=True)
    (root / "evaluation.json").write_text(json.dumps({"kind": kind, "options": []}))
    (root / "episodes.json").write_text(json.dumps(rows))
    return root


def test_compare_puts_finished_runs_in_one_report_and_plot(tmp_path, capsys):
    """Runs of different policies or settings become groups under their labels: the learned
    policy's latency curve beside the oracle's in one table and one success_rate.png."""

    def row(policy, lat, seed, success, reward):
        return {
            "episode": f"{policy}-lat{lat:g}ms-seed{seed:04d}",
            "kind": CLOSED_LOOP,
            "policy": policy,
            "latency_ms": lat,
            "seed": seed,
            "status": "ok",
            "success": success,
            "max_reward": reward,
        }

    oracle = _finished_run(
        tmp_path / "eval_oracle",
        CLOSED_LOOP,
        [row("scripted", lat, s, lat < 1000, 4) for lat in (0, 1000) for s in (0, 1)],
    )
    learned = _finished_run(
        tmp_path / "learned",
        CLOSED_LOOP,
        [row("model", lat, s, False, int(s == 0)) for lat in (0, 1000) for s in (0, 1)],
    )
    out = tmp_path / "cmp"
    assert evaluate_main(["compare", str(oracle), f"trained pi05-sim={learned}", "--out", str(out)]) == 0
    text = (out / "report.txt").read_text()
    assert "eval_oracle           0ms    2/2" in text and "eval_oracle        1000ms    0/2" in text
    assert "trained pi05-sim      0ms    0/2" in text and "1/2" in text
    assert "answers" not in text  # no run asked: no answer columns
    assert (out / "success_rate.png").is_file()
    table = json.loads((out / "episodes.json").read_text())
    assert table[0]["episode"] == "eval_oracle/scripted-lat0ms-seed0000" and table[0]["run_policy"] == "scripted"
    capsys.readouterr()

    bad = [
        ["compare", f"a={oracle}", f"a={learned}"],  # one label twice
        ["compare", str(tmp_path / "missing")],
        ["compare", str(_finished_run(tmp_path / "ol", OPEN_LOOP, []))],
    ]
    for argv in bad:
        assert evaluate_main([*argv, "--out", str(tmp_path / "x")]) == 2
        assert "evaluate: error: compare:" in capsys.readouterr().err


@pytest.mark.ros
@pytest.mark.slow
def test_sigterm_stops_evaluate_and_every_episode_process(tmp_path):
    """``kill`` (SIGTERM) of evaluate ends it as Ctrl-C does (exit 130): the running episode is
    stopped with its nodes, nothing is left on its ROS domain. Before, the episode's process group
    (its own session, so no signal reached it) outlived evaluate."""
    from ros_helpers import alive, child_pids

    out = tmp_path / "ev"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "oxygen_ros.evaluate.cli",
            "closed-loop",
            "--policy",
            "scripted",
            "--episodes",
            "1",
            "--workers",
            "1",
            "--episode-s",
            "120",
            "--latency-ms",
            "2000",  # every chunk expires: the episode runs until it is stopped
            "--progress",
            "off",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pid_file = out / "episodes" / "scripted-lat2000ms-seed0000" / "episode.pid"
    try:
        deadline = time.monotonic() + 120
        nodes: list[int] = []
        while time.monotonic() < deadline and proc.poll() is None:
            if pid_file.is_file() and pid_file.read_text().strip():
                leader = int(pid_file.read_text().split()[0])
                nodes = child_pids(leader)
                if len(nodes) == 2:  # the episode's closed_loop has started the sim and the oracle
                    break
            time.sleep(0.2)
        assert len(nodes) == 2, proc.stdout.read() if proc.poll() is not None else "no episode nodes"
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = proc.stdout.read()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in [leader, *nodes]):
        time.sleep(0.2)
    assert rc == 130, text
    assert not [p for p in [leader, *nodes] if alive(p)], text
    assert "interrupted" in text
