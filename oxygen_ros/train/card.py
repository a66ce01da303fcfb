"""The model card ``README.md`` that ``train`` writes beside a checkpoint.

Rendered from the run's record (the dict written to ``train_log.json``) only, so the card never
says anything the log does not hold: what was trained (preset, parameters, warm start), on what
(demonstrations, episodes, held-out split, start frames), how (steps, time, learning rate, seed),
what came out (last losses, held-out open-loop error against "hold the state", the placement
check) and the exact ``train`` command that reproduces it, then the ``evaluate`` commands that
judge it in closed loop with the sim rendering as the demonstrations were recorded (shadows on, the
demonstrations' camera rate). The layout follows the Hugging Face model-card habit (a title, a
facts table, data, training, results, how to reproduce), in plain Markdown.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

FLAG_OF = {"time_limit_s": "--time-limit"}
"""``TrainConfig`` fields whose ``train`` flag is not ``--`` + the field name with dashes."""
NO_FLAG = frozenset({"weight_decay", "warmup_steps", "log_every"})
"""``TrainConfig`` fields ``train`` takes no flag for (fixed at their defaults on the command line)."""


def train_command(record: Mapping[str, Any], out: str, defaults: Mapping[str, Any]) -> str:
    """The ``train`` command line that repeats the run of ``record`` (a ``train_log.json`` dict).

    Args:
        record: the run's record; ``record["config"]`` is the ``TrainConfig`` as a dict and
            ``record["demos"]`` the demonstrations folder.
        out: the checkpoint folder the command writes.
        defaults: ``TrainConfig()`` as a dict; flags equal to their default are left out.

    Returns:
        One shell-quoted line (``--preset`` is left out of a warm start, which ``train`` refuses).
    """
    cfg = record["config"]
    parts = ["train", "--demos", str(record["demos"]), "--out", out]
    for name, value in cfg.items():
        if name in NO_FLAG or value == defaults.get(name) or (name == "preset" and cfg.get("init")):
            continue
        parts += [FLAG_OF.get(name, "--" + name.replace("_", "-")), str(value)]
    return shlex.join(parts)


def model_card(
    record: Mapping[str, Any], out: str, parameters: int, size_bytes: int, defaults: Mapping[str, Any]
) -> str:
    """Render the model card (Markdown) of the run ``record`` written to the folder ``out``.

    Args:
        record: the run's ``train_log.json`` dict (``config``, ``demos``, ``camera_rate_hz`` of the
            demonstrations' cameras — None where their index does not say —, ``episodes``,
            ``train_frames``, ``start_frames``, ``steps``, ``wall_s`` in seconds, ``held_out``,
            ``placement`` — empty without the simulator —, ``log``).
        out: the checkpoint folder, as the reader will pass it to ``--model``.
        parameters: the model's parameter count.
        size_bytes: size of ``model.safetensors`` in bytes.
        defaults: ``TrainConfig()`` as a dict (for :func:`train_command`).
    """
    cfg = record["config"]
    held, place = record["held_out"], record["placement"]
    start = f"warm start from `{cfg['init']}`" if cfg.get("init") else f"random weights, seed {cfg['seed']}"
    rows = [
        ("model", f"preset `{cfg['preset']}`, {parameters / 1e6:.2f} M parameters, {size_bytes / 1e6:.1f} MB float32"),
        ("started from", start),
        (
            "data",
            f"`{record['demos']}`: {record['episodes']} episodes, the last {cfg['held_out']} held out; "
            f"{record['train_frames']} training frames"
            + (f" + {record['start_frames']} start frames" if record["start_frames"] else ""),
        ),
        (
            "training",
            f"{record['steps']} steps of {cfg['batch_size']} frames in {record['wall_s'] / 60:.1f} min, peak "
            f"learning rate {cfg['lr']:g}, seed {cfg['seed']}",
        ),
    ]
    if record["log"]:
        last = record["log"][-1]
        rows.append(("last losses", f"flow matching {last['flow']:.4f}, answer cross-entropy {last['text']:.4f}"))
    rows.append(
        (
            "held-out open-loop MAE",
            f"{held['model_mae']:.4f} (hold the state: {held['hold_mae']:.4f}) over {int(held['frames'])} frames",
        )
    )
    if place:
        rows.append(
            (
                "placement check",
                f"first-chunk skill {place['skill']:+.2f} (1: the oracle, 0: blind to the cube); answers "
                f"{int(place['answers_right'])}/{int(place['placements'])} right on unseen placements",
            )
        )
    else:
        rows.append(("placement check", "not run (no simulator where it was trained)"))
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    rate = record.get("camera_rate_hz")
    render = "shadows and reflections on" + (f", cameras at {rate:g} Hz" if rate else "")
    camera_arg = f" --loop-arg=--camera-rate-hz={rate:g}" if rate else ""
    name = out.rstrip("/").rsplit("/", 1)[-1]
    return f"""# {name} — a π0.5-architecture policy trained by `train`

Written by `train` at the end of the run. Every logged step is in `train_log.json`, the loss curve in
`loss.png`. The folder loads by path: the `oxygen` node (`model:={out}`), `replay` and `evaluate`.

| | |
| --- | --- |
{table}

The held-out error is open-loop on recorded frames; the placement check samples the first chunk and
the answer on 20 placements no demonstration used. Neither is task success: judge that in closed loop.

## Reproduce

```bash
{train_command(record, out, defaults)}
```

## Judge it in closed loop

The sim renders as the demonstrations were recorded ({render}); with the sim node's defaults the
images differ from the ones it was trained on.

```bash
evaluate closed-loop --model {shlex.quote(out)} --episodes 20 --ask "Where is the cube?" --ask-count 3 \\
  --loop-arg=--sim-param=render_shadows:=true --loop-arg=--rtc{camera_arg}
evaluate rollout --model {shlex.quote(out)} --seeds 10
```
"""
