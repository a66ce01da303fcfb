"""Terminal output of a replay: a tqdm progress bar and the language stream.

On a terminal (``progress='auto'`` and stderr is a sized TTY, or ``'on'``) there is one progress bar
over the bag's messages and, under it, one live line per language task showing the utterance
being decoded, token by token; each finished utterance, and each ask, is printed above the bars
and stays in the scroll-back. Without a terminal (pipes, CI logs) only the asks and finished
utterances are printed, one line each, so logs stay readable.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import TextIO

from tqdm import tqdm

from oxygen_ros.streams.text import Emit

__all__ = ["Console"]


def _terminal_columns() -> int:
    """Width of the terminal on stderr (0 when stderr is not a terminal or has no size)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns if sys.stderr.isatty() else 0
    except (OSError, ValueError, AttributeError):
        return 0


class Console:
    """Progress bar + language stream.

    Args:
        total: number of bag messages the replay will read (the bar's length).
        tasks: language task names (one live line each).
        progress: ``'auto'``, ``'on'`` or ``'off'``.
        show_text: print asks and utterances at all.
        out: where lines go (default stdout).
    """

    def __init__(
        self,
        total: int,
        tasks: Sequence[str],
        progress: str = "auto",
        show_text: bool = True,
        out: TextIO | None = None,
    ) -> None:
        if progress not in ("auto", "on", "off"):
            raise ValueError(f"progress must be 'auto', 'on' or 'off', got {progress!r}")
        self.out = out or sys.stdout
        self.live = progress == "on" or (progress == "auto" and _terminal_columns() >= 40)
        self.show_text = show_text
        self._bar = tqdm(
            total=total,
            desc="replay",
            unit="msg",
            disable=not self.live,
            dynamic_ncols=True,
            file=sys.stderr,
            position=0,
        )
        self._lines = {}
        self._current = {t: "" for t in tasks}
        if self.live and show_text:
            for i, t in enumerate(tasks):
                self._lines[t] = tqdm(total=0, bar_format="{desc}", position=i + 1, leave=False, file=sys.stderr)
                self._lines[t].set_description_str(f"  {t}: ")

    def advance(self, n: int = 1, **postfix: object) -> None:
        """Move the bar by ``n`` messages; ``postfix`` items are shown after it."""
        if self.live:
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(n)

    def line(self, text: str) -> None:
        """Print a whole line above the bars (or plainly without them)."""
        if self.live:
            tqdm.write(text, file=self.out)
        else:
            print(text, file=self.out, flush=True)

    def ask(self, bag_time: float, task: str, text: str) -> None:
        """An ask arrived at ``bag_time`` seconds for ``task``."""
        if self.show_text:
            self.line(f"[{bag_time:6.2f} s] ask ({task}): {text}")

    def emit(self, bag_time: float, task: str, emits: list[Emit]) -> None:
        """Show a task's serialised deltas/finished texts (see ``TaskTextStream``)."""
        if not self.show_text:
            return
        for e in emits:
            if e.kind == "delta":
                self._current[task] = self._current.get(task, "") + e.text
                self._show(task)
            else:
                self._current[task] = ""
                self._show(task)
                self.line(f"[{bag_time:6.2f} s] {task} #{e.request_id}: {e.text!r}")

    def _show(self, task: str) -> None:
        bar = self._lines.get(task)
        if bar is None:
            return
        width = max(20, shutil.get_terminal_size((100, 20)).columns - len(task) - 8)
        text = self._current[task].replace("\n", " ")
        bar.set_description_str(f"  {task}: {text[-width:]}", refresh=True)

    def close(self) -> None:
        """Remove the bars (idempotent)."""
        for bar in self._lines.values():
            bar.close()
        self._lines.clear()
        self._bar.close()
