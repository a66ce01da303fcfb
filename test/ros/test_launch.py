"""launch/oxygen.launch.py, checked statically (``launch``/``launch_ros`` cannot be installed on
these machines, DESIGN §7): it is evaluated against small stand-ins of the launch API that record
what it builds. It must name an installed executable and an existing parameter file. Plus a
``colcon build`` of the package when colcon is available.
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
LAUNCH = REPO / 'launch' / 'oxygen.launch.py'


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


def _stub_modules(monkeypatch) -> None:
    mods = {
        'launch': {'LaunchDescription': LaunchDescription},
        'launch.actions': {'DeclareLaunchArgument': DeclareLaunchArgument,
                           'OpaqueFunction': OpaqueFunction},
        'launch.substitutions': {'LaunchConfiguration': LaunchConfiguration,
                                 'PathJoinSubstitution': PathJoinSubstitution},
        'launch_ros': {}, 'launch_ros.actions': {'LifecycleNode': LifecycleNode},
        'launch_ros.substitutions': {'FindPackageShare': FindPackageShare},
    }
    for name, attrs in mods.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)


def _evaluate(monkeypatch, **given: str) -> tuple[dict, LifecycleNode, _Context]:
    _stub_modules(monkeypatch)
    spec = importlib.util.spec_from_file_location('oxygen_launch', LAUNCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ld = module.generate_launch_description()
    declared = {a.args[0]: a for a in ld.args[0] if isinstance(a, DeclareLaunchArgument)}
    ctx = _Context({}, {'oxygen_ros': str(REPO)})  # the source tree has the share/ layout
    for name, arg in declared.items():
        default = arg.kwargs['default_value']
        ctx.launch_configurations[name] = default if isinstance(default, str) else default.perform(ctx)
    ctx.launch_configurations.update(given)
    opaque = [a for a in ld.args[0] if isinstance(a, OpaqueFunction)]
    nodes = [n for o in opaque for n in o.kwargs['function'](ctx)]
    assert len(nodes) == 1 and isinstance(nodes[0], LifecycleNode)
    return declared, nodes[0], ctx


def _console_scripts() -> dict[str, str]:
    tree = ast.parse((REPO / 'setup.py').read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == 'console_scripts':
                    entries = [e.value for e in v.elts]
                    return dict(tuple(p.strip() for p in e.split('=')) for e in entries)
    return {}


def test_launch_file_names_installed_executable_and_existing_params(monkeypatch):
    declared, node, ctx = _evaluate(monkeypatch)
    assert {'params_file', 'namespace', 'model', 'device'} <= set(declared)
    kw = node.kwargs
    assert kw['package'] == 'oxygen_ros' and kw['name'] == 'oxygen'
    target = _console_scripts()[kw['executable']]  # KeyError: not a console script
    module, func = target.split(':')
    assert callable(getattr(importlib.import_module(module), func))
    params_file = Path(kw['parameters'][0].perform(ctx))
    assert params_file == REPO / 'config' / 'oxygen.yaml' and params_file.is_file()
    data = yaml.safe_load(params_file.read_text())
    assert any(key.split('/')[-1] == kw['name'] for key in data)  # '/**/oxygen' matches the node
    overrides = kw['parameters'][1]
    assert 'model' not in overrides and 'device' not in overrides  # keep the file's values
    assert kw['namespace'].perform(ctx) == ''


def test_launch_arguments_override_model_device_and_namespace(monkeypatch):
    _, node, ctx = _evaluate(monkeypatch, model='/models/pi05', device='cuda', namespace='robot1',
                             use_sim_time='true')
    overrides = node.kwargs['parameters'][1]
    assert overrides == {'model': '/models/pi05', 'device': 'cuda', 'use_sim_time': True}
    assert node.kwargs['namespace'].perform(ctx) == 'robot1'


def test_every_shipped_parameter_file_is_installed():
    setup = (REPO / 'setup.py').read_text()
    assert 'glob("config/*.yaml")' in setup and 'glob("launch/*.launch.py")' in setup
    assert {p.name for p in (REPO / 'config').glob('*.yaml')} >= {'aloha.yaml', 'droid.yaml', 'libero.yaml', 'oxygen.yaml'}


def _colcon() -> str | None:
    found = os.environ.get('OXYGEN_COLCON') or shutil.which('colcon')
    local = Path(sys.executable).parent / 'colcon'
    return found or (str(local) if local.exists() else None)


PACKAGE_FILES = ('package.xml', 'setup.py', 'setup.cfg', 'resource', 'oxygen_ros', 'config', 'launch')


@pytest.mark.slow
@pytest.mark.skipif(_colcon() is None, reason='colcon is not installed (pip install '
                    'colcon-common-extensions ros-ament-package catkin-pkg; or set OXYGEN_COLCON)')
def test_colcon_build(tmp_path):
    colcon = _colcon()
    src = tmp_path / 'src' / 'oxygen_ros'
    src.mkdir(parents=True)
    for name in PACKAGE_FILES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
        else:
            shutil.copy2(path, src / name)
    prefix = Path(colcon).resolve().parent.parent  # the colcon venv: ament_package lives there
    env = dict(os.environ, AMENT_PREFIX_PATH=os.environ.get('AMENT_PREFIX_PATH', str(prefix)))
    proc = subprocess.run([colcon, 'build', '--base-paths', 'src', '--build-base', 'build',
                           '--install-base', 'install'], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    install = tmp_path / 'install' / 'oxygen_ros'
    exe = install / 'lib' / 'oxygen_ros' / 'oxygen_node'
    assert exe.is_file() and os.access(exe, os.X_OK)
    assert "'oxygen_node'" in exe.read_text()
    entry_points = list(install.glob('lib/python3*/site-packages/oxygen_ros*/entry_points.txt'))
    assert entry_points and 'oxygen_node = oxygen_ros.ros.node:main' in entry_points[0].read_text()
    share = install / 'share' / 'oxygen_ros'
    for rel in ('launch/oxygen.launch.py', 'config/oxygen.yaml', 'config/droid.yaml', 'package.xml'):
        assert (share / rel).is_file(), rel
    assert (install / 'share' / 'ament_index' / 'resource_index' / 'packages' / 'oxygen_ros').is_file()
