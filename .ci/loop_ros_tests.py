#!/usr/bin/env python3
"""Run each ROS-process test file N times in a row and print pass/fail counts (flake hunting).

A test that fails sometimes is a failing test: before a change to threads, timing, the node or
the ROS-process tests lands, run its files in a loop here.

    .venv/bin/python .ci/loop_ros_tests.py -n 10                         # every file with `ros` tests
    .venv/bin/python .ci/loop_ros_tests.py -n 30 test/ros/test_node_e2e.py

Each run is a fresh ``python -m pytest -q -m "slow or not slow" FILE`` (its own processes, DDS
domains and temporary folders); the log of every failed run is kept under ``--logs``. Exit status
1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ros_test_files(marker: str) -> list[str]:
    """Test files with at least one test carrying ``marker`` (from pytest's own collection)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marker, "test"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return sorted({line.split("::")[0] for line in out.splitlines() if "::" in line})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="test files (default: every file with a test marked --marker)")
    ap.add_argument("-n", "--runs", type=int, default=10, help="runs per file (default 10)")
    ap.add_argument("--marker", default="ros", help="marker that selects the files (default ros)")
    ap.add_argument("--logs", default="loop_logs", help="folder for the logs of failed runs")
    a = ap.parse_args(argv)
    files = a.files or ros_test_files(a.marker)
    if not files:
        print(f"no test files with tests marked {a.marker!r}", file=sys.stderr)
        return 2
    env = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    logs = Path(a.logs)
    results: dict[str, Counter] = {f: Counter() for f in files}
    t_all = time.monotonic()
    for f in files:
        for i in range(1, a.runs + 1):
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow", f],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            ok = proc.returncode == 0
            results[f]["passed" if ok else "failed"] += 1
            tail = (proc.stdout.strip().splitlines() or [""])[-1]
            print(
                f"{f} run {i}/{a.runs}: {'pass' if ok else 'FAIL'} ({time.monotonic() - t0:.0f} s) {tail}", flush=True
            )
            if not ok:
                logs.mkdir(parents=True, exist_ok=True)
                (logs / f"{Path(f).stem}.run{i}.log").write_text(proc.stdout + proc.stderr)
    print(f"\n{'file':<45} {'passed':>6} {'failed':>6}")
    for f, c in results.items():
        print(f"{f:<45} {c['passed']:>6} {c['failed']:>6}")
    failed = sum(c["failed"] for c in results.values())
    total = sum(sum(c.values()) for c in results.values())
    print(f"{total - failed} passed, {failed} failed ({time.monotonic() - t_all:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
