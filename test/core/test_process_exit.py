"""A finished command ends with its own status and output even when the interpreter's teardown
would crash (as rclpy/DDS native threads can, with SIGSEGV) or hang."""

import os
import subprocess
import sys

import pytest

# ``main`` prints its result (block-buffered: stdout is a pipe) and returns 3; the teardown that
# would follow it dies with SIGSEGV or hangs, as the middleware's can after a finished command.
_MAIN = """
import atexit, os, signal, sys, time
from oxygen_ros.core.process_exit import run_then_exit
def main():
    print("played 25 messages")
    sys.stderr.write("one warning\\n")
    atexit.register({teardown})
    return 3
{ending}
"""
_CRASH = "lambda: os.kill(os.getpid(), signal.SIGSEGV)"
_HANG = "lambda: time.sleep(60)"


def _run(teardown: str, ending: str) -> subprocess.CompletedProcess:
    code = _MAIN.format(teardown=teardown, ending=ending)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout a buffered pipe
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env)


@pytest.mark.parametrize("teardown", [_CRASH, _HANG], ids=["crash", "hang"])
def test_run_then_exit_keeps_the_status_and_output_of_main_past_a_bad_teardown(teardown):
    r = _run(teardown, "run_then_exit(main)")
    assert (r.returncode, r.stdout, r.stderr) == (3, "played 25 messages\n", "one warning\n"), r


def test_without_it_the_same_crash_loses_the_status_and_the_output():
    """The control: what ``sys.exit(main())`` gives with the same teardown (as bag_player once did)."""
    r = _run(_CRASH, "sys.exit(main())")
    assert r.returncode == -11 and r.stdout == "", r


def test_an_error_before_any_work_propagates_as_usual():
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from oxygen_ros.core.process_exit import run_then_exit\n"
            "def main():\n    raise SystemExit(2)\nrun_then_exit(main)",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2, r
