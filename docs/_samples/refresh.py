"""Regenerate the sample outputs shown in the guides from real runs, so they cannot drift.

    .venv/bin/python docs/_samples/refresh.py            # every sample
    .venv/bin/python docs/_samples/refresh.py demo       # one

A sample is a ```text block right after a ``<!-- sample: NAME -->`` line in README.md or docs/*.md;
NAME is one of :data:`SAMPLES`. Each is produced by running the documented command from the
repository root and keeping what the guide shows (paths made relative to the repository, the home
folder written ``~``). ``test/test_docs.py`` checks every marked block against a fresh, cheaper run
of the same code (the report's structure and labels, numbers masked), so a change of the output
fails the tests until this script is run again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MARK = re.compile(r"<!-- sample: (\w+) -->\n```text\n(.*?)```", re.S)


def _clean(text: str) -> str:
    return text.replace(str(REPO) + "/", "").replace(str(Path.home()), "~")


def demo_sample() -> str:
    """``make demo``'s terminal output: the first streamed lines and the answers to "Where is the
    cube?", then the whole report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [str(BIN / "oxygen_demo"), "--out", str(Path(tmp) / "demo")],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    lines = _clean(out).splitlines()
    streamed = [line for line in lines if line.startswith("[")]
    # the first lines, and every answer to the question that has a right answer (the sim's truth)
    streamed = [line for i, line in enumerate(streamed) if i < 5 or "Q: Where is the cube?]" in line]
    start = next(i for i, line in enumerate(lines) if line.startswith("replay of "))
    end = next(i for i, line in enumerate(lines) if line.startswith("  output bag"))
    return "\n".join(streamed + ["…"] + lines[start : end + 1]) + "\n"


def norm_stats_sample() -> str:
    """``norm_stats`` on the bundled bag, as checkpoint.md shows it (the first joint, then the rest cut)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "norm_stats",
            "data/aloha_sim_sample",
            "--params-file",
            "config/oxygen.yaml",
            "--out",
            "/tmp/stats",
            "--progress",
            "off",
        ]
        run = subprocess.run(
            [str(BIN / cmd[0]), *cmd[1:-4], "--out", tmp, "--progress", "off"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        out = run.stdout.replace(tmp, "/tmp/stats")
    lines = out.splitlines()
    return "\n".join(["$ " + " ".join(cmd), lines[0], lines[1], "…", lines[-1]]) + "\n"


SAMPLES = {"demo": demo_sample, "norm_stats": norm_stats_sample}


def refresh(names: list[str]) -> None:
    """Run each named sample once and rewrite every block marked with it."""
    got = {name: SAMPLES[name]() for name in names}
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text()
        new = MARK.sub(lambda m: f"<!-- sample: {m[1]} -->\n```text\n{got[m[1]]}```" if m[1] in got else m[0], text)
        if new != text:
            page.write_text(new)
            print(f"refreshed {page.relative_to(REPO)}")


if __name__ == "__main__":
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    refresh(sys.argv[1:] or list(SAMPLES))
