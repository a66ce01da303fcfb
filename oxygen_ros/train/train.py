"""Train a π0.5-architecture policy on demonstrations (``record_demos``): the ``train`` command.

The flow-matching action loss plus cross-entropy on the language targets through the same prefix
(:mod:`oxygen_ros.train.objective`), AdamW with a linear warm-up and cosine decay, gradient
clipping at 1, seeded (weights, batches, noise, flow times). Normalisation stats (q01/q99, mean,
std) come from the dataset: the state from the recorded joint states, the actions from the
recorded commands. The checkpoint folder (openpi layout: ``model.safetensors``, config, norm stats,
tokenizer) loads by path in the node (``model_path``), ``replay`` and ``evaluate``; beside it
``train_log.json`` (every logged step), ``loss.png`` and a model card ``README.md``
(:mod:`oxygen_ros.train.card`: the run's figures and the command that repeats it).

Held-out episodes (``--held-out``, the last ones) are never trained on: at the end their open-loop
action error is measured against the "hold the current state" baseline. Then the placement check
(:mod:`oxygen_ros.train.placement`) asks whether the first chunk and the answer follow the cube
across 20 unseen placements — what open-loop error on recorded episodes cannot show.

``--start-frames`` adds rendered first frames of many more placements (only the cube differs
between them) to every batch; ``--vision-first-steps`` then trains the vision tower alone to name
the cube's region on them, and ``--answer-first-steps`` the answer to "Where is the cube?" through
the VLM, before the co-training starts — what π0.5 inherits from its pretrained VLM and a policy
trained from random weights has to learn first.

``--init`` starts from a checkpoint instead of random weights (a warm start: its weights, model config,
norm stats and tokenizer; a fresh optimizer and learning-rate schedule), so training time adds up
across runs and a run can go on with new demonstrations.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch and the model are imported when training starts (``train --help`` stays fast)
    from oxygen_ros.core.types import NormStats
    from oxygen_ros.train.dataset import DemoData

__all__ = ["PLACEMENT_SEEDS", "TrainConfig", "TrainResult", "check_config", "main", "train"]

PLACEMENT_SEEDS = 20
"""The placement check at the end of a run uses seeds 0 .. 19 (``evaluate closed-loop``'s)."""


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run (defaults: the shipped ``pi05-sim`` checkpoint)."""

    preset: str = "pi05-sim"
    steps: int = 6000
    batch_size: int = 32
    lr: float = 5e-4
    weight_decay: float = 1e-4
    warmup_steps: int = 200
    text_weight: float = 1.0
    seed: int = 0
    held_out: int = 10
    max_episodes: int = 0
    threads: int = 0
    log_every: int = 25
    time_limit_s: float = 0.0
    start_frames: int = 0
    """Placements rendered as start frames (:mod:`oxygen_ros.train.start_frames`); 0: none."""
    start_frame_share: float = 0.25
    """Share of every batch drawn from the start frames (when there are any)."""
    start_frame_jitter: float = 0.0
    """Start-pose jitter of the start frames, radians (0: all from the nominal pose)."""
    vision_first_steps: int = 0
    """Steps of a stage before everything else that trains the vision tower alone to name the cube's
    region from the base camera (:mod:`oxygen_ros.train.vision_stage`; needs ``start_frames``)."""
    answer_first_steps: int = 0
    """Optimizer steps at the start that train the answer to the cube question alone, on the start
    frames at the reset only (the VLM learns to find the cube in the image before the action expert
    trains; needs ``start_frames``)."""
    init: str = ""
    """Checkpoint folder to start from (warm start): its weights, model config, norm stats and
    tokenizer replace the preset's random weights and the dataset's stats ("": random weights)."""


@dataclass
class TrainResult:
    """What a run produced (also written to ``train_log.json``)."""

    folder: Path
    steps: int
    wall_s: float
    log: list[dict[str, float]] = field(default_factory=list)
    held_out: dict[str, float] = field(default_factory=dict)
    placement: dict[str, float] = field(default_factory=dict)
    """:func:`~oxygen_ros.train.placement.placement_check` summary on seeds 0 .. PLACEMENT_SEEDS-1
    (empty without the simulator)."""


def dataset_norm_stats(data: DemoData) -> dict[str, NormStats]:
    """``{"state", "actions"}`` stats of the frames' joint states and of every recorded command."""
    from oxygen_ros.stats.compute import norm_stats

    return {"state": norm_stats(data.state), "actions": norm_stats(data.commands.reshape(-1, data.commands.shape[-1]))}


class _Batcher:
    """Builds :class:`~oxygen_ros.train.objective.Batch` values from frame indices."""

    def __init__(self, data: DemoData, policy: Any) -> None:
        import torch

        from oxygen_ros.core.config import DEFAULT_TASKS
        from oxygen_ros.core.prompt import format_template
        from oxygen_ros.sim.task.language import CUBE_QUESTION, CUBE_REGIONS, PHASES

        self.data, self.policy, self.torch = data, policy, torch
        cfg = policy.cfg
        self.horizon, self.action_dim = cfg.action_horizon, cfg.action_dim
        tok = policy.prompt
        ids, masks = [], []
        for i in range(len(data)):
            norm = policy.normalizer.normalize_state(data.state[i])
            t, m = tok.tokenize_prompt(data.instructions[int(data.episode[i])], norm)
            ids.append(t)
            masks.append(m)
        self.tokens, self.token_masks = np.stack(ids), np.stack(masks)
        templates = {t.name: t.template for t in DEFAULT_TASKS}
        eos = policy.eos_id
        instruction = data.instructions[0]
        conv = format_template(templates["conversation"], text=CUBE_QUESTION, instruction=instruction)
        memo = format_template(templates["memory"], text="", instruction=instruction)
        # per task: one (ids, target mask) per answer
        self.texts: list[list[tuple[list[int], list[bool]]]] = []
        for template, answers in ((conv, CUBE_REGIONS), (memo, PHASES)):
            head = tok.tokenize_continuation(template)
            self.texts.append(
                [
                    (
                        head + tok.tokenize_continuation(a) + [eos],
                        [False] * len(head) + [True] * (len(tok.tokenize_continuation(a)) + 1),
                    )
                    for a in answers
                ]
            )
        self.text_len = max(len(ids) for task in self.texts for ids, _ in task)

    def batch(self, rows: np.ndarray, rng: np.random.Generator, cube_question_only: bool = False) -> Any:
        """The batch of frames ``rows``; each row's language target is the answer to the cube question
        or the phase narration, drawn at random (``cube_question_only``: always the cube question)."""
        from oxygen_ros.train.objective import Batch

        torch, d = self.torch, self.data
        pixels = torch.from_numpy(d.images[rows]).float() * (2.0 / 255.0) - 1.0
        chunks = d.chunks(rows, self.horizon)
        norm = np.stack([self.policy.normalizer.normalize_actions(c) for c in chunks])
        actions = np.zeros((len(rows), self.horizon, self.action_dim), dtype=np.float32)
        actions[..., : norm.shape[-1]] = norm
        text = np.zeros((len(rows), self.text_len), dtype=np.int64)
        valid = np.zeros((len(rows), self.text_len), dtype=bool)
        target = np.zeros((len(rows), self.text_len), dtype=bool)
        task = np.zeros(len(rows), dtype=np.int64) if cube_question_only else rng.integers(0, 2, size=len(rows))
        for j, (row, which) in enumerate(zip(rows, task, strict=True)):
            answer = int(d.region[row]) if which == 0 else int(d.phase[row])
            ids, tgt = self.texts[which][answer]
            text[j, : len(ids)], valid[j, : len(ids)], target[j, : len(ids)] = ids, True, tgt
        return Batch(
            pixels=pixels,
            image_masks=torch.from_numpy(d.image_masks[rows]),
            tokens=torch.from_numpy(self.tokens[rows]),
            token_masks=torch.from_numpy(self.token_masks[rows]),
            actions=torch.from_numpy(actions),
            action_dims=norm.shape[-1],
            text=torch.from_numpy(text),
            text_valid=torch.from_numpy(valid),
            text_target=torch.from_numpy(target),
        )


def _lr_at(step: int, cfg: TrainConfig, elapsed_s: float = 0.0) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to 10 % of ``lr`` at the end of the
    run: the last step, or ``time_limit_s`` when that comes first (progress is the larger of the
    two fractions, so a run cut by its time limit still ends annealed)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    if cfg.time_limit_s > 0:
        progress = max(progress, elapsed_s / cfg.time_limit_s)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def demo_camera_rate(demos: str | Path) -> float | None:
    """The demonstrations' camera rate (frames per sim second) from their ``demos.json``; None
    where the index is missing or does not say (a closed-loop judge should then be told by hand)."""
    from oxygen_ros.sim.demos import INDEX

    try:
        return float(json.loads((Path(demos) / INDEX).read_text())["camera_rate_hz"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def held_out_error(policy: Any, data: DemoData, rows: np.ndarray, seed: int = 0) -> dict[str, float]:
    """Open-loop error of ``policy`` on frames ``rows``: mean absolute error (radians / gripper
    units, robot's 14 dims, whole chunk) of the sampled chunk and of "hold the frame's state"
    against the recorded commands."""
    import torch

    from oxygen_ros.core.types import Observation
    from oxygen_ros.sim.scene import CAMERA_SLOTS

    horizon = policy.cfg.action_horizon
    slots = [s for s in policy.cfg.image_slots if s in CAMERA_SLOTS]
    model_err, hold_err = [], []
    gen = torch.Generator().manual_seed(seed)
    for row in rows:
        imgs: dict[str, np.ndarray | None] = {
            s: np.ascontiguousarray(data.images[row, i].transpose(1, 2, 0))
            for i, s in enumerate(policy.cfg.image_slots)
            if s in slots and data.image_masks[row, i]
        }
        obs = Observation(images=imgs, state=data.state[row], instruction=data.instructions[int(data.episode[row])])
        noise = torch.randn(1, horizon, policy.cfg.action_dim, generator=gen)
        chunk = policy.sample_actions(obs, noise=noise)
        truth = data.chunks(np.array([row]), horizon)[0]
        model_err.append(float(np.abs(chunk - truth).mean()))
        hold_err.append(float(np.abs(data.state[row][None] - truth).mean()))
    return {"model_mae": float(np.mean(model_err)), "hold_mae": float(np.mean(hold_err)), "frames": float(len(rows))}


def _plot(log: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [e["step"] for e in log]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [e["flow"] for e in log], label="flow-matching loss (actions)")
    ax.plot(steps, [e["text"] for e in log], label="cross-entropy (answers)")
    first = [e["step"] for e in log if e.get("answer_first")]
    if first:
        ax.axvline(max(first), color="grey", linestyle="--", label="end of the answer-first stage")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def check_config(cfg: TrainConfig) -> None:
    """Refuse start-frame settings that cannot work.

    Raises:
        ValueError: ``start_frames`` < 0, ``start_frame_share`` outside [0, 1),
            ``vision_first_steps`` or ``answer_first_steps`` < 0 or without start frames to train on.
    """
    if cfg.start_frames < 0 or not 0.0 <= cfg.start_frame_share < 1.0:
        raise ValueError("--start-frames must be >= 0 and --start-frame-share in [0, 1)")
    for flag, n in (("--vision-first-steps", cfg.vision_first_steps), ("--answer-first-steps", cfg.answer_first_steps)):
        if n < 0 or (n and not cfg.start_frames):
            raise ValueError(f"{flag} must be >= 0, and trains on --start-frames (give some)")


def train(demos: str | Path, out: str | Path, cfg: TrainConfig, progress: bool = True) -> TrainResult:
    """Train ``cfg.preset`` on the ``record_demos`` folder ``demos``; write the checkpoint ``out``.

    With ``cfg.init`` the run starts from that checkpoint (its config, not ``cfg.preset``; its norm
    stats, so the weights keep reading the inputs as they were trained to).

    Raises:
        DemoError: unusable demonstrations (too few episodes for the held-out split included).
        ConfigError: unknown preset.
        CheckpointError: ``cfg.init`` missing or not a loadable checkpoint with norm stats.
        ValueError: start-frame settings out of range (:func:`check_config`).
    """
    check_config(cfg)
    import torch
    from tqdm import tqdm

    from oxygen_ros.core.config import get_preset
    from oxygen_ros.core.model.weights import load_pretrained, random_pretrained, save_pretrained
    from oxygen_ros.core.policy import Pi05Policy
    from oxygen_ros.core.tokenizer import build_tokenizer, load_tokenizer
    from oxygen_ros.train.card import model_card
    from oxygen_ros.train.dataset import DemoError, load_demos
    from oxygen_ros.train.objective import co_training_loss, sample_flow_time
    from oxygen_ros.train.placement import placement_check

    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    init_stats: dict[str, NormStats] = {}
    if cfg.init:  # before the data is read: a bad checkpoint fails fast
        from oxygen_ros.core.model.ckpt_files import require_norm_stats

        model, model_cfg, init_stats, meta = load_pretrained(cfg.init, device="cpu", dtype=torch.float32)
        require_norm_stats(init_stats, meta.folder, meta.layout, meta.norm_info, meta.asset_id)
        tokenizer = load_tokenizer(cfg.init, vocab_size=model_cfg.vocab_size)
        cfg = replace(cfg, preset=model_cfg.name)  # the log and the model card name what was trained
    else:
        model_cfg = get_preset(cfg.preset)
    data = load_demos(demos, model_cfg, progress=progress, max_episodes=cfg.max_episodes)
    episodes = int(data.episode.max()) + 1
    if episodes <= cfg.held_out:
        raise DemoError(f"{episodes} episodes: need more than the {cfg.held_out} held out")
    train_rows, test_rows = data.split(range(episodes - cfg.held_out, episodes))
    stats = init_stats or dataset_norm_stats(data)
    start_rows = np.empty(0, dtype=np.int64)
    if cfg.start_frames > 0:
        from oxygen_ros.train.start_frames import render_start_frames

        first = len(data)
        extra = render_start_frames(
            demos, model_cfg, cfg.start_frames, start_jitter=cfg.start_frame_jitter, progress=progress
        )
        data = data.concat(extra)
        start_rows = np.arange(first, len(data))
    n_start = round(cfg.start_frame_share * cfg.batch_size) if len(start_rows) else 0
    # both first stages (vision, answer): start frames at the reset only, where every placement has the same
    # state; from later frames the state (the arm already moving to the cube) tells the answer
    reset_rows = start_rows[data.step[start_rows] == 0]
    if (cfg.vision_first_steps or cfg.answer_first_steps) and not len(reset_rows):
        raise ValueError("none of the start frames is at the reset, where the first stages train; render more")
    torch.manual_seed(cfg.seed)
    if not cfg.init:
        model = random_pretrained(model_cfg, seed=cfg.seed)
        tokenizer = build_tokenizer(model_cfg.vocab_size)
    policy = Pi05Policy(model, tokenizer, stats)
    model.train()
    batcher = _Batcher(data, policy)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}], lr=cfg.lr
    )
    vision_stage: dict[str, float] = {}
    if cfg.vision_first_steps:
        from oxygen_ros.train.vision_stage import train_vision_stage

        t0 = time.perf_counter()
        done = train_vision_stage(
            model, data.images, data.region, reset_rows, cfg.vision_first_steps, cfg.batch_size, cfg.lr, rng
        )
        vision_stage = {"steps": float(done.steps), "accuracy": done.accuracy, "wall_s": time.perf_counter() - t0}
        if not progress:
            print(f"vision stage: {done.steps} steps, region accuracy {done.accuracy:.2f} (trained frames)", flush=True)
    log: list[dict[str, float]] = []
    acc = {"loss": 0.0, "flow": 0.0, "text": 0.0, "text_accuracy": 0.0}
    n_acc = 0
    t_train = time.perf_counter()  # the time limit counts optimisation only, not reading the data
    bar = tqdm(range(cfg.steps), desc=f"training {cfg.preset}", unit="step", disable=not progress)
    step = 0
    for step in bar:
        lr = _lr_at(step, cfg, time.perf_counter() - t_train)
        for g in opt.param_groups:
            g["lr"] = lr
        answer_first = step < cfg.answer_first_steps
        if answer_first:  # first stage: the cube question alone, on frames where only the cube differs
            rows = rng.choice(reset_rows, size=cfg.batch_size)
        else:
            rows = rng.choice(train_rows, size=cfg.batch_size - n_start)
            if n_start:
                rows = np.concatenate([rows, rng.choice(start_rows, size=n_start)])
        batch = batcher.batch(rows, rng, cube_question_only=answer_first)
        noise = torch.randn(cfg.batch_size, model_cfg.action_horizon, model_cfg.action_dim, generator=gen)
        t = sample_flow_time(cfg.batch_size, gen)
        parts = co_training_loss(model, batch, noise, t, cfg.text_weight, flow_weight=0.0 if answer_first else 1.0)
        opt.zero_grad(set_to_none=True)
        parts.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for k in acc:
            acc[k] += float(getattr(parts, k).detach())
        n_acc += 1
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            entry = {"step": float(step + 1), "wall_s": time.perf_counter() - t_start, "lr": lr}
            entry["answer_first"] = float(answer_first)
            entry.update({k: v / n_acc for k, v in acc.items()})
            log.append(entry)
            bar.set_postfix(flow=f"{entry['flow']:.4f}", text=f"{entry['text']:.3f}")
            if not progress:  # a line per log entry where no bar is drawn (a pipe, a log file)
                print(
                    f"step {step + 1}/{cfg.steps} flow {entry['flow']:.4f} text {entry['text']:.3f} "
                    f"acc {entry['text_accuracy']:.2f} ({entry['wall_s']:.0f} s)",
                    flush=True,
                )
            acc = dict.fromkeys(acc, 0.0)
            n_acc = 0
        if cfg.time_limit_s > 0 and time.perf_counter() - t_train > cfg.time_limit_s:
            break
    steps_done = step + 1
    model.eval()
    wall = time.perf_counter() - t_start
    out = Path(out)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(model, tmp, stats, layout="openpi", tokenizer=tokenizer)
    trained = Pi05Policy.from_pretrained(tmp, device="cpu")
    held = held_out_error(trained, data, test_rows[::5], seed=cfg.seed)
    placement: dict[str, float] = {}
    try:
        placement = placement_check(trained, range(PLACEMENT_SEEDS), noise_seed=cfg.seed).summary
    except ImportError as exc:  # the demonstrations may have been recorded on another machine
        print(f"train: no placement check ({exc}); install requirements-sim.txt", file=sys.stderr)
    result = TrainResult(out, steps_done, wall, log, held, placement)
    record = {
        "config": cfg.__dict__,
        "demos": str(demos),
        "camera_rate_hz": demo_camera_rate(demos),
        "episodes": episodes,
        "train_frames": int(len(train_rows)),
        "start_frames": int(len(start_rows)),
        "vision_stage": vision_stage,
        "steps": steps_done,
        "wall_s": wall,
        "held_out": held,
        "placement": placement,
        "log": log,
    }
    (tmp / "train_log.json").write_text(json.dumps(record, indent=1))
    parameters = sum(p.numel() for p in model.parameters())
    size = (tmp / "model.safetensors").stat().st_size
    (tmp / "README.md").write_text(model_card(record, str(out), parameters, size, TrainConfig().__dict__))
    if log:
        _plot(log, tmp / "loss.png")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return result


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of ``train``."""
    d = TrainConfig()
    p = argparse.ArgumentParser(prog="train", description=__doc__.split("\n\n")[0])
    p.add_argument("--demos", type=Path, required=True, help="record_demos folder")
    p.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    p.add_argument("--preset", default=None, help=f"model preset (default: {d.preset})")
    p.add_argument(
        "--init",
        default="",
        metavar="CHECKPOINT",
        help="start from this checkpoint folder instead of random weights (warm start: its weights, config, "
        "norm stats and tokenizer; excludes --preset)",
    )
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="frames per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (default: %(default)s)")
    p.add_argument("--text-weight", type=float, default=d.text_weight, help="weight of the answer loss")
    p.add_argument("--seed", type=int, default=d.seed, help="seed (default: %(default)s)")
    p.add_argument("--held-out", type=int, default=d.held_out, help="last episodes kept out of training")
    p.add_argument("--max-episodes", type=int, default=0, help="use only the first N episodes (0: all)")
    p.add_argument(
        "--start-frames",
        type=int,
        default=d.start_frames,
        help="also train on the first frames of this many rendered cube placements (needs the sim; 0: none)",
    )
    p.add_argument(
        "--start-frame-share",
        type=float,
        default=d.start_frame_share,
        help="share of each batch drawn from the start frames (default: %(default)s)",
    )
    p.add_argument(
        "--start-frame-jitter",
        type=float,
        default=d.start_frame_jitter,
        metavar="RAD",
        help="start-pose jitter of the start frames (default: %(default)s, the nominal pose: only the cube differs)",
    )
    p.add_argument(
        "--vision-first-steps",
        type=int,
        default=d.vision_first_steps,
        metavar="N",
        help="before all else, N steps train the vision tower alone to name the cube's region from the base "
        "camera on the start frames at the reset (needs --start-frames; default: %(default)s)",
    )
    p.add_argument(
        "--answer-first-steps",
        type=int,
        default=d.answer_first_steps,
        metavar="N",
        help="first N steps train only the answer to 'Where is the cube?' on the start frames at the reset "
        "(needs --start-frames; default: %(default)s)",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument(
        "--time-limit", type=float, default=0.0, help="stop optimising after this many seconds, annealed (0: none)"
    )
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` of parsed ``train`` flags (:func:`build_parser`)."""
    return TrainConfig(
        preset=args.preset or TrainConfig.preset,
        init=args.init,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        text_weight=args.text_weight,
        seed=args.seed,
        held_out=args.held_out,
        max_episodes=args.max_episodes,
        threads=args.threads,
        time_limit_s=args.time_limit,
        start_frames=args.start_frames,
        start_frame_share=args.start_frame_share,
        start_frame_jitter=args.start_frame_jitter,
        vision_first_steps=args.vision_first_steps,
        answer_first_steps=args.answer_first_steps,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns 0, or 2 for bad arguments / unusable demonstrations."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.init and args.preset:
        parser.error("--init takes the model config from the checkpoint; leave out --preset")
    from oxygen_ros.train.dataset import DemoError
    from oxygen_ros.train.placement import placement_line

    cfg = config_from_args(args)
    try:
        result = train(args.demos, args.out, cfg, progress=sys.stderr.isatty())
    except (DemoError, ValueError) as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # --start-frames renders in the simulator
        print(f"train: error: {exc}; install requirements-sim.txt", file=sys.stderr)
        return 2
    h = result.held_out
    print(
        f"wrote {result.folder}: {result.steps} steps in {result.wall_s / 60:.1f} min; held-out open-loop MAE "
        f"{h['model_mae']:.4f} (hold the state: {h['hold_mae']:.4f}) over {int(h['frames'])} frames"
    )
    if result.placement:
        print(placement_line(result.placement))
    return 0


if __name__ == "__main__":
    sys.exit(main())
