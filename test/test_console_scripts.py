"""Every console script of setup.py answers ``--help`` and a mistyped flag from its argument parser,
before the heavy imports: ``replay --bad-flag`` took 7-10 s because torch, transformers and rclpy
were imported before argparse ran.

Each script runs in a subprocess the way its console script runs it (``sys.argv`` set, ``main()``
called, ``SystemExit`` caught); the subprocess then reports its exit status and which heavy
modules are in ``sys.modules`` — deterministic, no timing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "rclpy")
#: norm_stats: its own argument handling and test (test/stats).
OTHERS = ("norm_stats",)
#: ROS node processes: their module defines the rclpy node class, so rclpy (and the model for
#: oxygen_node) is imported with it; they check their command line before rclpy starts.
NODES = ("oxygen_node", "aloha_sim", "scripted_policy")

_RUN = """
import importlib, json, sys
name, target = sys.argv[1], sys.argv[2]
module, func = target.split(':')
sys.argv = [name, *sys.argv[3:]]
try:
    code = getattr(importlib.import_module(module), func)()
except SystemExit as exc:
    code = exc.code
print('RESULT ' + json.dumps({'code': code, 'heavy': [m for m in HEAVY if m in sys.modules]}), file=sys.stderr)
""".replace("HEAVY", repr(HEAVY))


def console_scripts() -> dict[str, str]:
    """name -> ``module:function`` of every console script in setup.py."""
    text = (REPO / "setup.py").read_text()
    return dict(re.findall(r'"(\w+) = ([\w.]+:\w+)"', text))


SCRIPTS = {n: t for n, t in console_scripts().items() if n not in OTHERS}


def run_script(name: str, *args: str) -> tuple[int, list[str], str, str]:
    """(exit status, heavy modules imported, stdout, stderr) of ``name ARGS``."""
    env = {**os.environ, "ROS_AUTOMATIC_DISCOVERY_RANGE": "OFF"}  # a node started by mistake meets no one
    r = subprocess.run(
        [sys.executable, "-c", _RUN, name, SCRIPTS[name], *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = [x for x in r.stderr.splitlines() if x.startswith("RESULT ")]
    assert lines, f"{name} {args}: no result (exit {r.returncode})\n{r.stderr[-2000:]}"
    got = json.loads(lines[-1][len("RESULT ") :])
    return got["code"], got["heavy"], r.stdout, r.stderr


def test_every_console_script_is_covered() -> None:
    assert {"replay", "bench", "evaluate", "oxygen", "oxygen_node"} <= set(SCRIPTS), SCRIPTS
    assert set(NODES) <= set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_and_a_bad_flag_answer_from_the_parser_before_heavy_imports(name: str) -> None:
    code, heavy, out, err = run_script(name, "--help")
    assert code in (0, None) and out.startswith(f"usage: {name}"), (code, out[:300], err[-1000:])
    exempt = name in NODES
    assert exempt or heavy == [], f"{name} --help imported {heavy}"
    code, heavy, out, err = run_script(name, "--no-such-flag")
    assert code == 2 and f"{name}: error: " in err, (code, err[-1000:])
    assert exempt or heavy == [], f"{name} --no-such-flag imported {heavy}"


def test_bench_schedules_parses_before_torch() -> None:
    code, heavy, out, _ = run_script("bench", "schedules", "--help")
    assert (code, heavy) in ((0, []), (None, [])) and out.startswith("usage: bench schedules"), (code, heavy, out[:200])
    code, heavy, _, err = run_script("bench", "schedules", "--no-such-flag")
    assert (code, heavy) == (2, []) and "bench schedules: error: " in err, (code, heavy, err[-500:])
