"""launch/oxygen.launch.py and launch/sim.launch.py, checked statically (``launch``/``launch_ros``
are not published as PyPI wheels, so the test environment has neither): they are evaluated against
small stand-ins of the launch API that record what they build. They must name an installed
executable and an existing parameter file, and stop at once, naming the path, when a given
parameter file does not exist. Plus a ``colcon build`` of the package when colcon is available.
"""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch" / "oxygen.launch.py"
SIM_LAUNCH = REPO / "launch" / "sim.launch.py"


# ------------------------------------------------------------------ launch API stand-ins
class _Context:
    def __init__(self, configs: dict[str, str], share: dict[str, str]):
        self.launch_configurations, self.share = configs, share


class _Recorded:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class LaunchConfiguration(_Recorded):
    def perform(self, ctx: _Context) -> str:
        return ctx.launch_configurations[self.args[0]]


class FindPackageShare(_Recorded):
    def perform(self, ctx: _Context) -> str:
        return ctx.share[self.args[0]]


class PathJoinSubstitution(_Recorded):
    def perform(self, ctx: _Context) -> str:
        return os.path.join(*[p if isinstance(p, str) else p.perform(ctx) for p in self.args[0]])


class LaunchDescription(_Recorded):
    pass


class DeclareLaunchArgument(_Recorded):
    pass


class OpaqueFunction(_Recorded):
    pass


class LifecycleNode(_Recorded):
    pass


class Node(_Recorded):
    pass


def _stub_modules(monkeypatch) -> None:
    mods = {
        "launch": {"LaunchDescription": LaunchDescription},
        "launch.actions": {"DeclareLaunchArgument": DeclareLaunchArgument, "OpaqueFunction": OpaqueFunction},
        "launch.substitutions": {
            "LaunchConfiguration": LaunchConfiguration,
            "PathJoinSubstitution": PathJoinSubstitution,
        },
        "launch_ros": {},
        "launch_ros.actions": {"LifecycleNode": LifecycleNode, "Node": Node},
        "launch_ros.substitutions": {"FindPackageShare": FindPackageShare},
    }
    for name, attrs in mods.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)


def _run_launch_file(monkeypatch, path: Path, **given: str) -> tuple[dict, list, _Context]:
    """(declared arguments, the node actions built, the context) of launch file ``path`` with the
    launch arguments ``given`` (others: their defaults)."""
    _stub_modules(monkeypatch)
    spec = importlib.util.spec_from_file_location(path.name.replace(".", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ld = module.generate_launch_description()
    declared = {a.args[0]: a for a in ld.args[0] if isinstance(a, DeclareLaunchArgument)}
    ctx = _Context({}, {"oxygen_ros": str(REPO)})  # the source tree has the share/ layout
    for name, arg in declared.items():
        default = arg.kwargs["default_value"]
        ctx.launch_configurations[name] = default if isinstance(default, str) else default.perform(ctx)
    ctx.launch_configurations.update(given)
    opaque = [a for a in ld.args[0] if isinstance(a, OpaqueFunction)]
    return declared, [n for o in opaque for n in o.kwargs["function"](ctx)], ctx


def _evaluate(monkeypatch, **given: str) -> tuple[dict, LifecycleNode, _Context]:
    declared, nodes, ctx = _run_launch_file(monkeypatch, LAUNCH, **given)
    assert len(nodes) == 1 and isinstance(nodes[0], LifecycleNode)
    return declared, nodes[0], ctx


def _console_scripts() -> dict[str, str]:
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "console_scripts":
                    entries = [e.value for e in v.elts]
                    return dict(tuple(p.strip() for p in e.split("=")) for e in entries)
    return {}


def test_launch_file_names_installed_executable_and_existing_params(monkeypatch):
    declared, node, ctx = _evaluate(monkeypatch)
    assert {"params_file", "namespace", "model", "device"} <= set(declared)
    kw = node.kwargs
    assert kw["package"] == "oxygen_ros" and kw["name"] == "oxygen"
    target = _console_scripts()[kw["executable"]]  # KeyError: not a console script
    module, func = target.split(":")
    assert callable(getattr(importlib.import_module(module), func))
    params_file = Path(kw["parameters"][0].perform(ctx))
    assert params_file == REPO / "config" / "oxygen.yaml" and params_file.is_file()
    data = yaml.safe_load(params_file.read_text())
    assert any(key.split("/")[-1] == kw["name"] for key in data)  # '/**/oxygen' matches the node
    overrides = kw["parameters"][1]
    assert "model" not in overrides and "device" not in overrides  # keep the file's values
    assert kw["namespace"].perform(ctx) == ""


def test_launch_arguments_override_model_device_and_namespace(monkeypatch):
    _, node, ctx = _evaluate(monkeypatch, model="/models/pi05", device="cuda", namespace="robot1", use_sim_time="true")
    overrides = node.kwargs["parameters"][1]
    assert overrides == {"model": "/models/pi05", "device": "cuda", "use_sim_time": True}
    assert node.kwargs["namespace"].perform(ctx) == "robot1"


@pytest.mark.parametrize(
    "launch_file, argument",
    [(LAUNCH, "params_file"), (SIM_LAUNCH, "sim_params_file"), (SIM_LAUNCH, "oxygen_params_file")],
)
def test_a_parameter_file_that_does_not_exist_stops_the_launch_naming_it(monkeypatch, tmp_path, launch_file, argument):
    """Before: launch_ros only warned ('Parameter file path is not a file'), started the node, and
    the node failed configure with 'joint_names is not set'. Now no node is built: the opaque
    function raises, which ``ros2 launch`` prints as one ERROR line and exits with status 1."""
    missing = tmp_path / "robot.ymal"
    with pytest.raises(FileNotFoundError) as err:
        _run_launch_file(monkeypatch, launch_file, **{argument: str(missing)})
    message = str(err.value)
    assert message.startswith(f"{argument}:={missing}: does not exist;"), message
    assert f"the package's own are in {REPO / 'config'}: aloha.yaml, aloha_lerobot.yaml, droid.yaml" in message, message
    with pytest.raises(
        FileNotFoundError,
        match=f"{argument}:=config/nope.yaml: does not exist "
        r"\(relative to .*\)",
    ):
        _run_launch_file(monkeypatch, launch_file, **{argument: "config/nope.yaml"})
    with pytest.raises(FileNotFoundError, match=f"{argument}:={tmp_path}: is a folder, not a parameter file"):
        _run_launch_file(monkeypatch, launch_file, **{argument: str(tmp_path)})
    shipped = str(REPO / "config" / "aloha.yaml")  # an existing file still launches
    _, nodes, _ = _run_launch_file(monkeypatch, launch_file, **{argument: shipped})
    assert [type(n).__name__ for n in nodes] == (
        ["LifecycleNode"] if launch_file == LAUNCH else ["Node", "LifecycleNode"]
    )


def test_every_shipped_parameter_file_is_installed():
    setup = (REPO / "setup.py").read_text()
    assert 'glob("config/*.yaml")' in setup and 'glob("launch/*.launch.py")' in setup
    assert {p.name for p in (REPO / "config").glob("*.yaml")} >= {
        "aloha.yaml",
        "droid.yaml",
        "libero.yaml",
        "oxygen.yaml",
    }


def _colcon() -> str | None:
    found = os.environ.get("OXYGEN_COLCON") or shutil.which("colcon")
    local = Path(sys.executable).parent / "colcon"
    return found or (str(local) if local.exists() else None)


PACKAGE_FILES = ("package.xml", "setup.py", "setup.cfg", "resource", "oxygen_ros", "config", "launch")


@pytest.mark.slow
@pytest.mark.skipif(
    _colcon() is None,
    reason="colcon is not installed (pip install "
    "colcon-common-extensions ros-ament-package catkin-pkg; or set OXYGEN_COLCON)",
)
def test_colcon_build(tmp_path):
    colcon = _colcon()
    src = tmp_path / "src" / "oxygen_ros"
    src.mkdir(parents=True)
    for name in PACKAGE_FILES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    prefix = Path(colcon).resolve().parent.parent  # the colcon venv: ament_package lives there
    env = dict(os.environ, AMENT_PREFIX_PATH=os.environ.get("AMENT_PREFIX_PATH", str(prefix)))
    proc = subprocess.run(
        [colcon, "build", "--base-paths", "src", "--build-base", "build", "--install-base", "install"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    install = tmp_path / "install" / "oxygen_ros"
    exe = install / "lib" / "oxygen_ros" / "oxygen_node"
    assert exe.is_file() and os.access(exe, os.X_OK)
    assert "'oxygen_node'" in exe.read_text()
    entry_points = list(install.glob("lib/python3*/site-packages/oxygen_ros*/entry_points.txt"))
    assert entry_points and "oxygen_node = oxygen_ros.ros.node:main" in entry_points[0].read_text()
    share = install / "share" / "oxygen_ros"
    for rel in ("launch/oxygen.launch.py", "config/oxygen.yaml", "config/droid.yaml", "package.xml"):
        assert (share / rel).is_file(), rel
    assert (install / "share" / "ament_index" / "resource_index" / "packages" / "oxygen_ros").is_file()


@pytest.mark.slow
@pytest.mark.ros
@pytest.mark.skipif(
    not os.environ.get("OXYGEN_COLCON"), reason="the colcon venv of `make test` (OXYGEN_COLCON) is not set"
)
def test_make_colcon_build_gives_launchers_that_run_the_project_venv(tmp_path):
    """``make colcon-build``: the installed ``oxygen_node`` launcher's interpreter is this venv's (which
    has rclpy — the colcon venv has not), and run as ``ros2 launch`` runs it (the install space's
    site-packages on PYTHONPATH, as ``setup.bash`` puts it) it starts the node: it joins the graph
    and stops cleanly on SIGINT. A colcon the venv's python imports itself (apt's) is used as it is,
    with the same launchers."""
    import signal

    from domain_coordinator import domain_id
    from ros_helpers import RosPeer, ros_env

    venv = Path(sys.prefix)
    colcon_venv = Path(os.environ["OXYGEN_COLCON"]).resolve().parent.parent
    proc = subprocess.run(
        [
            "make",
            "colcon-build",
            f"VENV={venv}",
            f"COLCON_VENV={colcon_venv}",
            f"COLCON_OUT={tmp_path}",
            "-o",
            f"{venv}/.stamp",
            "-o",
            f"{colcon_venv}/.stamp",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"(colcon from {colcon_venv}), launchers running {sys.executable}" in proc.stdout, proc.stdout[-3000:]
    exe = tmp_path / "install" / "oxygen_ros" / "lib" / "oxygen_ros" / "oxygen_node"
    assert exe.read_text().splitlines()[0] == f"#!{sys.executable}", exe.read_text().splitlines()[0]
    # A colcon the venv's python can import itself (apt's python3-colcon-* seen through
    # --system-site-packages; here: the colcon venv's packages on PYTHONPATH) is used as it is.
    purelib = subprocess.run(
        [str(colcon_venv / "bin" / "python"), "-c", 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
        capture_output=True,
        text=True,
    ).stdout.strip()
    own = subprocess.run(
        [
            "make",
            "colcon-build",
            f"VENV={venv}",
            f"COLCON_VENV={colcon_venv}",
            f"COLCON_OUT={tmp_path / 'own'}",
            "-o",
            f"{venv}/.stamp",
            "-o",
            f"{colcon_venv}/.stamp",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=purelib),
    )
    assert own.returncode == 0, own.stdout[-3000:] + own.stderr[-3000:]
    assert "(the environment's colcon)" in own.stdout, own.stdout[-3000:]
    own_exe = tmp_path / "own" / "install" / "oxygen_ros" / "lib" / "oxygen_ros" / "oxygen_node"
    assert own_exe.read_text().splitlines()[0] == f"#!{sys.executable}"
    site = next((tmp_path / "install" / "oxygen_ros" / "lib").glob("python3*/site-packages"))
    with domain_id() as dom:
        env = ros_env(dom)
        env["PYTHONPATH"] = str(site)  # what `source install/setup.bash` adds; no checkout on the path
        peer = RosPeer(dom, "launcher_check")
        node = subprocess.Popen(
            [str(exe), "--ros-args", "-p", "autostart:=false"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            seen = peer.wait_for(lambda: ("oxygen", "/") in peer.node.get_node_names_and_namespaces(), 90)
        finally:
            node.send_signal(signal.SIGINT)
            out = node.communicate(timeout=30)[0]
            peer.close()
    assert seen, f"the installed launcher never joined the graph:\n{out}"
    assert node.returncode == 0 and "ModuleNotFoundError" not in out, out
