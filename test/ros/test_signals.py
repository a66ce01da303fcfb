"""SIGINT / SIGTERM end the package's ROS processes cleanly while messages flow
(``oxygen_ros.ros.signals``): the oracle policy (``scripted_policy``) and ``fake_robot`` with
config/aloha.yaml feed each other over Fast DDS — joint states and images one way, action chunks
the other — and each is stopped by a signal mid-traffic, several times over: exit status 0, no
traceback, no native crash. (The Jazzy lane once saw the oracle policy die with SIGSEGV inside
``Node.destroy_node`` while rclpy's own signal handlers shut its context down.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

ROUNDS = 3


def test_a_signal_only_sets_the_stop_event_and_rclpy_installs_no_handler_of_its_own() -> None:
    """In a child interpreter (signal handlers are per process): after
    ``init_without_signal_handlers`` rclpy reports no handlers of its own, and SIGINT then SIGTERM
    set the event instead of raising ``KeyboardInterrupt`` or ending the process."""
    code = (
        "import os, signal, rclpy\n"
        "from rclpy.signals import SignalHandlerOptions, get_current_signal_handlers_options\n"
        "from oxygen_ros.ros.signals import init_without_signal_handlers\n"
        "stop = init_without_signal_handlers([])\n"
        "assert get_current_signal_handlers_options() == SignalHandlerOptions.NO\n"
        "for sig in (signal.SIGINT, signal.SIGTERM):\n"
        "    stop.clear(); os.kill(os.getpid(), sig)\n"
        "    assert stop.wait(5), sig\n"
        "assert rclpy.ok()\n"
        "rclpy.try_shutdown()\n"
        "print('ok')\n"
    )
    from ros_helpers import REPO, ros_env

    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=ros_env(0), capture_output=True, text=True, timeout=60
    )
    assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr


@pytest.mark.ros
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_oracle_policy_and_the_fake_robot_end_cleanly_on_a_signal_mid_traffic(tmp_path, sig) -> None:
    from domain_coordinator import domain_id
    from ros_helpers import REPO, ros_env

    aloha = REPO / "config" / "aloha.yaml"
    with domain_id() as dom:
        for i in range(ROUNDS):
            logs = {name: tmp_path / f"{name}_{i}.log" for name in ("policy", "robot")}
            with open(logs["policy"], "wb") as plog, open(logs["robot"], "wb") as rlog:
                policy = subprocess.Popen(
                    [sys.executable, "-m", "oxygen_ros.sim.task.policy_node", "--ros-args", "-p", f"seed:={i}"],
                    cwd=REPO,
                    env=ros_env(dom),
                    stdout=plog,
                    stderr=subprocess.STDOUT,
                )
                robot = subprocess.Popen(
                    [sys.executable, "-m", "oxygen_ros.sim.fake_robot.run", "--params-file", str(aloha)],
                    cwd=REPO,
                    env=ros_env(dom),
                    stdout=rlog,
                    stderr=subprocess.STDOUT,
                )
                try:
                    # both up and trading messages: the policy answers every image with a chunk
                    time.sleep(6.0)
                    assert policy.poll() is None and robot.poll() is None, "a process died before the signal"
                    # the policy is stopped while images still arrive, the robot while chunks did
                    stopped = {}
                    for name, proc in (("policy", policy), ("robot", robot)):
                        proc.send_signal(sig)
                        stopped[name] = proc.wait(30)
                finally:
                    for proc in (policy, robot):
                        if proc.poll() is None:
                            proc.kill()
                            proc.wait(10)
            texts = {name: path.read_text(errors="replace") for name, path in logs.items()}
            said = "".join(f"\n--- {name} log:\n{text}" for name, text in texts.items())
            assert stopped == {"policy": 0, "robot": 0}, f"round {i}: exit status {stopped}{said}"
            for name, text in texts.items():
                assert "Traceback" not in text and "Fatal Python error" not in text, f"round {i}: {name}{said}"
            # the fake robot's controller line: the oracle's chunks arrived and every one was valid
            line = [ln for ln in texts["robot"].splitlines() if ln.startswith("action_topic (action_chunk): ")]
            assert line and " 0 rejected" in line[0] and " 0 accepted" not in line[0], f"round {i}{said}"


def test_init_without_signal_handlers_refuses_a_thread_other_than_main() -> None:
    """Python installs signal handlers only from the main thread: from another thread the helper
    raises ``ValueError`` (before rclpy is touched, so nothing is left initialised)."""
    import rclpy

    from oxygen_ros.ros.signals import init_without_signal_handlers

    was_ok = rclpy.ok()
    errors: list[BaseException] = []

    def call() -> None:
        try:
            init_without_signal_handlers([])
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    t = threading.Thread(target=call)
    t.start()
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], ValueError), errors
    assert rclpy.ok() == was_ok
