"""The install paths that this x86_64 machine can check for the Jetson recipes (docs/jetson.md).

- Jetson AGX Thor / JetPack 7 runs Python 3.12: a 3.12 venv resolves and imports every pin except
  torch (NVIDIA's JetPack wheel replaces it there), with the PyPI ROS wheels and the sim stack.
- ``make setup ROS_FROM_APT=1 TORCH_PREINSTALLED=1`` over a Python that already has rclpy and torch
  (as apt's ROS 2 and NVIDIA's torch are on a Jetson): the venv is created with
  ``--system-site-packages``, installs neither torch nor the ROS wheels again, and imports both
  from the "system". The system is emulated with a user site-packages folder (``PYTHONUSERBASE``,
  which a ``--system-site-packages`` venv sees) and ``LD_LIBRARY_PATH`` set as ROS 2's
  ``setup.bash`` sets it.

Not checkable here: aarch64, CUDA on a Jetson, apt's ROS 2 itself (docs/jetson.md says so).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

IMPORTS = (
    "transformers",
    "safetensors",
    "tokenizers",
    "numpy",
    "yaml",
    "cv2",
    "rosbags",
    "rosbags.image",
    "matplotlib",
    "tqdm",
    "psutil",
    "pytest",
    "sentencepiece",
    "google.protobuf",
    "mujoco",
    "gym_aloha",
    "rclpy",
    "std_msgs.msg",
    "sensor_msgs.msg",
    "trajectory_msgs.msg",
    "diagnostic_msgs.msg",
    "lifecycle_msgs.msg",
    "rosgraph_msgs.msg",
    "builtin_interfaces.msg",
    "std_srvs.srv",
)


def _python(version: str) -> str | None:
    """An interpreter of ``version`` (PATH, then pyenv), or None."""
    found = shutil.which(f"python{version}")
    if found and subprocess.run([found, "-c", "pass"], capture_output=True).returncode == 0:
        return found
    pyenv = Path.home() / ".pyenv" / "versions"
    for d in sorted(pyenv.glob(f"{version}.*"), reverse=True):
        if (d / "bin" / f"python{version}").exists():
            return str(d / "bin" / f"python{version}")
    return None


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _pins_without_torch(tmp: Path) -> Path:
    req = tmp / "requirements-no-torch.txt"
    lines = (REPO / "requirements.txt").read_text().splitlines()
    assert any(line.startswith("torch==") for line in lines)
    req.write_text("\n".join(line for line in lines if not line.startswith("torch==")) + "\n")
    return req


def test_python312_venv_resolves_and_imports_every_pin_but_torch(tmp_path: Path) -> None:
    py = _python("3.12")
    if py is None:
        pytest.skip("no Python 3.12 interpreter on this machine")
    venv = tmp_path / "venv312"
    _run([py, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run(
        [
            *pip,
            "-r",
            str(_pins_without_torch(tmp_path)),
            "-r",
            str(REPO / "requirements-ros.txt"),
            "-r",
            str(REPO / "requirements-sim.txt"),
            "-r",
            str(REPO / "requirements-dev.txt"),
        ]
    )
    code = (
        "import importlib, sys; assert sys.version_info[:2] == (3, 12), sys.version\n"
        f"for m in {IMPORTS!r}: importlib.import_module(m)\n"
        'import rclpy; rclpy.init(); n = rclpy.create_node("pins312"); n.destroy_node(); rclpy.shutdown()\n'
        'print("ok")'
    )
    out = _run([str(venv / "bin" / "python"), "-c", code]).stdout
    assert out.strip().endswith("ok")


def test_make_setup_over_preinstalled_rclpy_and_torch(tmp_path: Path) -> None:
    base = tmp_path / "system"  # stands in for /usr/lib/python3/dist-packages + /opt/ros/<distro>
    env = {**os.environ, "PYTHONUSERBASE": str(base), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for name in ("VIRTUAL_ENV", "ROS_DISTRO", "MAKEFLAGS", "MAKELEVEL", "MFLAGS"):  # not the outer make's
        env.pop(name, None)
    system_python = _python(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert system_python is not None
    _run(
        [
            system_python,
            "-m",
            "pip",
            "install",
            "-q",
            "--user",
            "--no-warn-script-location",
            "-r",
            str(REPO / "requirements-ros.txt"),
            *[line for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("torch==")],
        ],
        env=env,
    )
    site = next(base.glob("lib/python3.*/site-packages"))
    libs = [str(p) for p in site.glob("ros_*.libs")] + [str(base / "lib")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)  # what `source /opt/ros/<distro>/setup.bash` sets
    env["_ROS_WHEELS_BOOTSTRAP_COMPLETE"] = "1"  # the PyPI wheels' own re-exec is not apt's way

    venv = tmp_path / "venv"
    _run(
        [
            "make",
            "setup",
            f"VENV={venv}",
            "ROS_FROM_APT=1",
            "TORCH_PREINSTALLED=1",
            "WITH_SIM=0",
            f"PYTHON={system_python}",
        ],
        cwd=REPO,
        env=env,
    )
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    own = next(venv.glob("lib/python3.*/site-packages"))
    torch_again = [p for p in own.glob("torch*") if p.name == "torch" or p.name.startswith("torch-")]
    assert not torch_again, "torch was installed into the venv again"  # torchao (its own wheel) may be
    assert not list(own.glob("rclpy*")) and not list(own.glob("ros_rclpy*")), "the ROS wheels were installed"
    code = (
        "import torch, rclpy, transformers\n"
        "from oxygen_ros.ros.node import main\n"
        "from oxygen_ros.core.policy import Pi05Policy\n"
        "print(torch.__file__); print(rclpy.__file__)"
    )
    out = _run([str(venv / "bin" / "python"), "-c", code], env=env, cwd=tmp_path).stdout.splitlines()
    assert all(line.startswith(str(site)) for line in out[-2:]), out
