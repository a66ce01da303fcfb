"""Child processes of the closed loop: the two nodes, their logs, environment and ROS domain."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "REPO",
    "ChildProcess",
    "child_env",
    "config_dir",
    "control_period",
    "ros_domain",
    "sigterm_as_interrupt",
    "wait_for",
]

REPO = Path(__file__).resolve().parents[3]
_LOG_LINE = re.compile(r"^\[(WARN|ERROR|FATAL)\]")


def config_dir() -> Path:
    """The package's config folder: the source tree's, else the ament share folder."""
    if (REPO / "config" / "sim.yaml").is_file():
        return REPO / "config"
    try:
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory("oxygen_ros")) / "config"
    except Exception:  # not installed through ament: fall back to the source layout
        return REPO / "config"


def control_period(sim_yaml: Path) -> float:
    """1 / ``control_rate_hz`` of the sim section of ``sim_yaml`` (0.02 s when absent)."""
    import yaml

    try:
        doc = yaml.safe_load(sim_yaml.read_text()) or {}
        for key, section in doc.items():
            if str(key).split("/")[-1] == "aloha_sim":
                return 1.0 / float(section["ros__parameters"].get("control_rate_hz", 50.0))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError):
        pass
    return 0.02


def child_env(domain_id: int) -> dict[str, str]:
    """The environment of a child node: this one, on ``domain_id``, localhost DDS, unbuffered."""
    env = dict(os.environ)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env.update(ROS_DOMAIN_ID=str(domain_id), PYTHONUNBUFFERED="1", RCUTILS_LOGGING_BUFFERED_STREAM="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While in the block, SIGTERM (``kill``, systemd, ``docker stop``, a CI job's timeout) ends this
    script as Ctrl-C does: it raises KeyboardInterrupt in the main thread, so the script stops the
    processes it started instead of dying and leaving them running on their ROS domain. The
    previous handler is restored on exit; off the main thread (where Python cannot set a handler)
    it changes nothing."""

    def _interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _default_sigint() -> None:
    """Children get the default SIGINT handler (so ``stop`` ends them cleanly)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ChildProcess:
    """One child process (a ROS node) with its log file (stdout + stderr), started in the repo."""

    def __init__(self, name: str, cmd: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.cmd, self.log = name, cmd, log
        self._file = open(log, "wb")
        self.popen = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=self._file, stderr=subprocess.STDOUT, preexec_fn=_default_sigint
        )
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGINT, wait up to ``timeout`` s, then SIGKILL; returns the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._file.close()
        return self.popen.returncode

    def kill(self) -> int:
        """SIGKILL (a crash, for the loss test); returns the exit status."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        self._file.close()
        return self.popen.returncode

    def problems(self) -> list[str]:
        """WARN / ERROR / FATAL lines and Python tracebacks of the log."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [ln for ln in lines if _LOG_LINE.match(ln) or ln.startswith("Traceback")]


def wait_for(
    pred: Callable[[], Any], timeout: float, poll: float = 0.05, abort: Callable[[], str] | None = None
) -> Any:
    """Poll ``pred`` every ``poll`` s until truthy, ``timeout`` s pass or ``abort()`` says why."""
    end = time.monotonic() + timeout
    value = pred()
    while not value and time.monotonic() < end:
        if abort is not None and abort():
            return value
        time.sleep(poll)
        value = pred()
    return value


@contextlib.contextmanager
def ros_domain(domain_id: int | None) -> Iterator[int]:
    """The ROS domain id to use: the given one, ``ROS_DOMAIN_ID``, or one from domain_coordinator."""
    if domain_id is not None:
        yield domain_id
        return
    if "ROS_DOMAIN_ID" in os.environ:
        yield int(os.environ["ROS_DOMAIN_ID"])
        return
    try:
        from domain_coordinator import domain_id as coordinated
    except ImportError:
        yield 0
        return
    with coordinated() as dom:
        yield dom
