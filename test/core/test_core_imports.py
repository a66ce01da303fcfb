"""``oxygen_ros.core`` is ROS-free (docs/architecture.md, 'The package'), and the engine's bookkeeping is torch-free.

Each check runs in a fresh interpreter where the forbidden packages are made unimportable by a
meta-path finder (they ARE installed in the dev venv, so a stray import would be caught).
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import oxygen_ros.core

ROS_PACKAGES = (
    "rclpy",
    "std_msgs",
    "sensor_msgs",
    "trajectory_msgs",
    "diagnostic_msgs",
    "builtin_interfaces",
    "rosbags",
)
#: installed by ``make setup`` but not on a bare PyTorch stack (the GPU machine's: torch, transformers
#: and its own needs, safetensors, tokenizers, numpy, pytest); the core imports without them
NOT_ON_A_BARE_STACK = ("cv2", "psutil", "matplotlib")
CORE_DIR = Path(oxygen_ros.core.__file__).parent
REPO = CORE_DIR.parents[1]

_BLOCKER = """
import importlib.abc, json, sys
BLOCKED = {blocked!r}

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked in this test")
        return None

for mod in [m for m in sys.modules if m.split(".")[0] in BLOCKED]:
    del sys.modules[mod]
sys.meta_path.insert(0, Blocker())
for name in BLOCKED:  # the blocker itself works
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"blocker failed for {{name}}")
for name in {absent!r}:  # as if not installed: import fails, importlib.util.find_spec gives None
    sys.modules[name] = None
"""


def run_blocked(blocked: tuple[str, ...], body: str, absent: tuple[str, ...] = ()) -> dict:
    """Run ``body`` (which must print one JSON line last) with ``blocked`` unimportable (any
    attempt raises) and ``absent`` looking not installed (libraries may probe for it)."""
    code = _BLOCKER.format(blocked=list(blocked), absent=list(absent)) + body
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def modules_on_disk() -> set[str]:
    """Every ``.py`` module under ``oxygen_ros/core`` as a dotted name."""
    out = set()
    for f in CORE_DIR.rglob("*.py"):
        parts = f.relative_to(CORE_DIR.parent.parent).with_suffix("").parts
        out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_core_and_every_submodule_import_without_ros():
    """``oxygen_ros.core`` and every submodule (pkgutil walk, plus any module on disk the walk
    misses) import with rclpy and all msgs packages unimportable — and OpenCV, psutil and
    matplotlib too (a bare PyTorch stack) — and none of them gets loaded."""
    body = """
import pkgutil, importlib, os
import oxygen_ros.core as core
walked = [m.name for m in pkgutil.walk_packages(core.__path__, "oxygen_ros.core.")]
root = os.path.dirname(os.path.dirname(core.__path__[0]))
disk = []
for d, _, files in os.walk(core.__path__[0]):
    for f in files:
        if f.endswith(".py"):
            rel = os.path.relpath(os.path.join(d, f), root)[:-3].replace(os.sep, ".")
            disk.append(rel[: -len(".__init__")] if rel.endswith(".__init__") else rel)
for name in sorted(set(walked) | set(disk)):
    importlib.import_module(name)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED + ABSENT and sys.modules[m] is not None)
print(json.dumps({"walked": walked, "imported": sorted(set(walked) | set(disk)), "leaked": leaked}))
""".replace("ABSENT", repr(list(NOT_ON_A_BARE_STACK)))
    res = run_blocked(ROS_PACKAGES, body, absent=NOT_ON_A_BARE_STACK)
    assert res["leaked"] == []
    must = {
        "oxygen_ros.core.policy",
        "oxygen_ros.core.model.pi05",
        "oxygen_ros.core.model.weights",
        "oxygen_ros.core.engine.engine",
        "oxygen_ros.core.cache.kv_pool",
        "oxygen_ros.core.processing",
    }
    assert must <= set(res["imported"])
    assert set(res["imported"]) == modules_on_disk()
    assert "oxygen_ros.core.model.pi05" in res["walked"]


def test_every_core_module_is_in_a_regular_package():
    """Every folder of ``oxygen_ros`` holding modules has an ``__init__.py``: otherwise pkgutil does
    not walk it and setup.py's ``find_packages()`` leaves it out of the installed package
    (ament_python / pip install), so ``import oxygen_ros.core.engine`` fails on the robot."""
    walked = {m.name for m in pkgutil.walk_packages(oxygen_ros.core.__path__, "oxygen_ros.core.")}
    walked.add("oxygen_ros.core")
    missing_init = sorted(
        str(d.relative_to(REPO))
        for d in {f.parent for f in (REPO / "oxygen_ros").rglob("*.py")}
        if not (d / "__init__.py").is_file()
    )
    assert missing_init == [], f"folders without __init__.py: {missing_init}"
    assert modules_on_disk() <= walked, sorted(modules_on_disk() - walked)


def test_block_pool_and_scheduler_import_without_torch():
    """The engine's pure-Python bookkeeping (block pool, scheduler) imports with torch (and ROS)
    unimportable, so it stays unit-testable and cheap; torch is never loaded on the way."""
    body = """
import importlib
for name in ("oxygen_ros.core.cache.block_pool", "oxygen_ros.core.engine.scheduler"):
    importlib.import_module(name)
from oxygen_ros.core.cache.block_pool import BlockPool
pool = BlockPool(4, 16)
print(json.dumps({"torch_loaded": "torch" in sys.modules, "free": pool.num_blocks,
                  "leaked": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)}))
"""
    res = run_blocked(("torch", "transformers", *ROS_PACKAGES), body)
    assert res == {"torch_loaded": False, "free": 4, "leaked": []}


def test_an_older_torch_is_refused_with_what_to_install():
    import pytest

    from oxygen_ros.core.model import MIN_TORCH, check_torch_version

    check_torch_version("2.13.0+cpu")
    check_torch_version(".".join(map(str, MIN_TORCH)) + ".0")
    for old in ("2.5.1+cu124", "1.13.1", "garbage"):
        with pytest.raises(ImportError, match=r"oxygen_ros needs torch >= 2.6, this environment has torch "):
            check_torch_version(old)


def test_importing_the_model_under_an_older_torch_fails_at_once_naming_it():
    """The check runs on import of ``oxygen_ros.core.model`` (what the node, replay and norm_stats
    import first), with the installed torch's own version string."""
    code = (
        "import torch; torch.__version__ = '2.5.1+cu124'\n"
        "try:\n    import oxygen_ros.core.model.ckpt_files\n"
        "except ImportError as e:\n    print(e)\nelse:\n    print('imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("oxygen_ros needs torch >= 2.6, this environment has torch 2.5.1+cu124: "), out.stdout
    assert "docs/jetson.md" in out.stdout
