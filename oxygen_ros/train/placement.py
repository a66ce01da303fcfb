"""Does the policy see the cube? Its first chunk and answer across cube placements, at the start pose.

Every episode of the transfer-cube task starts with the arms at the same pose; only the cube's
placement differs. So the first action chunk of an episode can depend on the placement only through
the cameras: a policy that imitates its demonstrations from the arm's own motion (which, in
demonstrations that all leave from one pose, tells where the script is heading) gives nearly the
same first chunk for every placement, and then reaches for the average placement in the closed loop.
Open-loop error on recorded episodes cannot show this — there the arm's motion carries the answer.

:func:`placement_check` renders frame 0 of each seed (``SimScene``, as ``record_demos`` renders),
samples the policy's chunk and its answer to "Where is the cube?", and compares them with the
scripted oracle's commands over the chunk's horizon (steps 1 .. H after the frame: the chunk's time
base, as the training labels) and the sim's true region:

- ``chunk_mae``: mean |policy chunk - oracle chunk| (radians / gripper units, 14 joints, 50 points;
  it includes a bias common to all placements: a still arm does not tell how long it has been
  still, and demonstrations 0.1-0.5 s in look the same as frame 0 but move faster);
- ``placement_mae``: the same for the part that varies with the placement (each chunk minus the
  mean chunk over the seeds, the policy's and the oracle's), against ``oracle_variation`` (the mean
  |oracle chunk - mean oracle chunk|);
- ``skill`` = 1 - placement_mae / oracle_variation: 0 for a policy that ignores the cube, 1 for one
  that follows it as the oracle does (negative: it varies, but not with the cube);
- ``spread_ratio``: spread over seeds (standard deviation, mean over joints) of the chunk's last
  point, policy / oracle: about 0 when the chunk does not move with the cube;
- ``answer_accuracy``: answers equal to the true region.

Used by ``train`` at the end of a run (seeds 0-19, the placements ``evaluate closed-loop`` scores,
never trained on) and by ``evaluate placement``. Needs the simulator (``requirements-sim.txt``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["PlacementCheck", "placement_check", "placement_line"]


@dataclass
class PlacementCheck:
    """Per-seed chunks and answers, and the summary of :func:`placement_check`."""

    seeds: list[int]
    policy_chunks: np.ndarray
    """``[N, H, 14]`` the policy's first chunks (robot units)."""
    oracle_chunks: np.ndarray
    """``[N, H, 14]`` the scripted oracle's commands over the same horizon: point i is its command
    i + 1 control steps after the frame, the chunk's time base."""
    answers: list[str]
    truths: list[str]
    summary: dict[str, float] = field(default_factory=dict)


def _summary(policy: np.ndarray, oracle: np.ndarray, answers: Sequence[str], truths: Sequence[str]) -> dict[str, float]:
    # what depends on the placement: each chunk minus the mean chunk over the placements
    dp, do = policy - policy.mean(axis=0, keepdims=True), oracle - oracle.mean(axis=0, keepdims=True)
    varying = float(np.abs(do).mean())
    spread_policy = float(policy[:, -1].std(axis=0).mean())
    spread_oracle = float(oracle[:, -1].std(axis=0).mean())
    right = sum(a.strip() == t for a, t in zip(answers, truths, strict=True))
    return {
        "placements": float(len(answers)),
        "chunk_mae": float(np.abs(policy - oracle).mean()),
        "placement_mae": float(np.abs(dp - do).mean()),
        "oracle_variation": varying,
        "skill": 1.0 - float(np.abs(dp - do).mean()) / varying if varying > 0 else 0.0,
        "spread_policy": spread_policy,
        "spread_oracle": spread_oracle,
        "spread_ratio": spread_policy / spread_oracle if spread_oracle > 0 else 0.0,
        "answers_right": float(right),
        "answer_accuracy": right / len(answers) if answers else 0.0,
    }


def placement_check(policy: Any, seeds: Sequence[int] = range(20), noise_seed: int = 0) -> PlacementCheck:
    """Compare ``policy``'s first chunk and cube answer with the oracle's over cube placements.

    Args:
        policy: a :class:`~oxygen_ros.core.policy.Pi05Policy` whose image slots take the sim's
            cameras (``CAMERA_SLOTS``) and whose action space is the sim's 14 joints.
        seeds: cube placement seeds (``SimScene.reset``); at least 2.
        noise_seed: seed of the flow-matching noise (the same noise for every placement, so the
            chunks differ only through the observation).

    Returns:
        :class:`PlacementCheck` (chunks ``[N, H, 14]``, answers, summary as in the module doc).

    Raises:
        ValueError: fewer than 2 seeds.
        ImportError: the simulator is not installed.
    """
    import torch

    from oxygen_ros.core.config import DEFAULT_TASKS
    from oxygen_ros.core.prompt import format_template
    from oxygen_ros.core.types import Observation
    from oxygen_ros.sim.record_bag import DEFAULT_INSTRUCTION
    from oxygen_ros.sim.scene import CAMERA_SLOTS, SimScene
    from oxygen_ros.sim.task.language import CUBE_QUESTION, cube_region
    from oxygen_ros.sim.task.script import ScriptedPickLift

    seeds = [int(s) for s in seeds]
    if len(seeds) < 2:
        raise ValueError(f"a placement check needs at least 2 seeds, got {seeds}")
    cfg = policy.cfg
    horizon = cfg.action_horizon
    slots = {slot: cam for slot, cam in CAMERA_SLOTS.items() if slot in cfg.image_slots}
    template = {t.name: t.template for t in DEFAULT_TASKS}["conversation"]
    prompt = format_template(template, text=CUBE_QUESTION, instruction=DEFAULT_INSTRUCTION)
    noise = torch.randn(1, horizon, cfg.action_dim, generator=torch.Generator().manual_seed(noise_seed))
    scene = SimScene(cameras=tuple(slots.values()), image_size=(120, 160))
    chunks, oracle, answers, truths = [], [], [], []
    try:
        for seed in seeds:
            state = scene.reset(seed)
            script = ScriptedPickLift(scene)
            frames = scene.render()
            obs = Observation(
                images={slot: frames[cam] for slot, cam in slots.items()},
                state=state.astype(np.float32),
                instruction=DEFAULT_INSTRUCTION,
            )
            chunks.append(np.asarray(policy.sample_actions(obs, noise=noise.clone()))[:, : len(state)])
            # point i of a chunk is the command i + 1 control steps after its frame (the node's time base,
            # and the training labels'): the script at steps 1 .. H
            oracle.append(np.stack([script(k / scene.control_rate_hz) for k in range(1, horizon + 1)]))
            answers.append(policy.generate_text(obs, prompt, max_new_tokens=8).text)
            truths.append(cube_region(scene.cube_position, landed=False))
    finally:
        scene.close()
    p, o = np.stack(chunks), np.stack(oracle)
    return PlacementCheck(seeds, p, o, answers, truths, _summary(p, o, answers, truths))


def placement_line(summary: dict[str, float]) -> str:
    """One line of a :attr:`PlacementCheck.summary` for a terminal or a log."""
    s = summary
    return (
        f"placement check over {int(s['placements'])} unseen placements: first chunk follows the cube "
        f"{s['spread_ratio']:.2f}x as much as the oracle's (skill {s['skill']:+.2f}: placement-dependent "
        f"error {s['placement_mae']:.4f} of the oracle's {s['oracle_variation']:.4f}), "
        f"answers {int(s['answers_right'])}/{int(s['placements'])} right"
    )
