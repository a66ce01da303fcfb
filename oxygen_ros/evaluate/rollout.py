"""Is it the policy or the stack? A policy stepping the transfer-cube sim in this process, without ROS.

``evaluate closed-loop`` judges a policy through everything that runs on the robot: the node, DDS,
the sim's executor, real-time chunking, the real clock. When it fails, :func:`rollout` takes all of
that away: the same checkpoint (``Pi05Policy.sample_actions``), the same scene rendered as the
demonstrations were (``SimScene``, 160x120 cameras every ``camera_every`` control steps: 10 Hz by
default, the demonstrations' rate) and the same success criterion (:class:`LiftSuccess`: the cube
5 cm up for 1 s), with a new chunk from the current frame every ``replan_steps`` control steps, its
point ``i`` applied ``i + 1`` steps after the frame (the chunk's time base) and no latency. The
applied command keeps the sim node's speed limit (``max_joint_speed``, 3 rad/s in
``config/sim.yaml``), so a wild chunk moves the arm no faster than it would through the node. A policy
that fails here fails on its own; one that succeeds here and not in the closed loop points at the
stack.

Each episode also says *where* the grasp went wrong, from the right gripper's grasp point (between
its finger pads, :func:`~oxygen_ros.sim.task.script.grasp_point`) against the grasp target, the
point 2.5 cm above the cube's centre where the script closes the gripper
(``GRASP_ABOVE_CUBE_M``): the closest the grasp point came to it after the first second, split into
horizontal and vertical (above the target: positive), and the smallest opening the policy commanded
to the right gripper after the first second (1 open, 0 closed) with the grasp point's height above
the target then. The scripted oracle comes within about 0.2 cm and closes to 0 there.
``policy="scripted"`` runs the oracle itself through the same loop (its chunks are the script's next
``horizon`` commands), the reference those numbers are read against.

Needs the simulator (``requirements-sim.txt``); no ROS, no Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["RolloutEpisode", "rollout", "rollout_summary"]

SCRIPTED = "scripted"
"""``policy`` value that runs the scripted oracle."""


@dataclass(frozen=True)
class RolloutEpisode:
    """One in-process episode of :func:`rollout` (lengths in cm, times in simulated seconds)."""

    seed: int
    success: bool
    time_to_success_s: float | None
    lift_max_cm: float
    grasp_miss_cm: float
    """Smallest distance from the right grasp point to the grasp target after 1 s."""
    grasp_miss_horizontal_cm: float
    grasp_miss_height_cm: float
    """The grasp point's offset from the target at that moment: horizontal, and height (above: > 0)."""
    grasp_miss_t_s: float
    min_gripper_command: float
    """Smallest right-gripper command after 1 s (1 open .. 0 closed)."""
    min_gripper_height_cm: float
    """Height of the right grasp point above the grasp target when that command was applied."""

    def line(self) -> str:
        """One terminal line."""
        done = f"success at {self.time_to_success_s:.2f} s" if self.success else "no success"
        return (
            f"seed {self.seed:4d}: {done:19} lift {self.lift_max_cm:5.1f} cm | grasp target missed by "
            f"{self.grasp_miss_cm:4.1f} cm ({self.grasp_miss_horizontal_cm:4.1f} across, "
            f"{self.grasp_miss_height_cm:5.1f} up) at {self.grasp_miss_t_s:5.2f} s | right gripper command min "
            f"{self.min_gripper_command:4.2f}, then {self.min_gripper_height_cm:+5.1f} cm above the target"
        )


def rollout(
    policy: Any,
    seeds: Sequence[int],
    episode_s: float = 12.0,
    replan_steps: int = 10,
    camera_every: int = 5,
    noise_seed: int = 0,
    max_joint_speed: float = 3.0,
    on_episode: Callable[[RolloutEpisode], None] | None = None,
) -> list[RolloutEpisode]:
    """Run ``policy`` in the transfer-cube sim for each seed, in this process.

    Args:
        policy: a :class:`~oxygen_ros.core.policy.Pi05Policy` whose image slots take the sim's
            cameras (``CAMERA_SLOTS``) and whose first 14 action dims are the sim's joints, or
            ``"scripted"`` for the scripted oracle.
        seeds: cube placement seeds (``SimScene.reset``).
        episode_s: simulated seconds per episode (600 control steps for 12 s at 50 Hz).
        replan_steps: control steps between chunks (1 .. the chunk horizon); each chunk is sampled
            from the latest camera frame and the current joint state.
        camera_every: control steps between renders (5: 10 Hz at the sim's 50 Hz).
        noise_seed: seed of the flow-matching noise (seed + placement seed per episode).
        max_joint_speed: largest change of the applied command per second and joint (radians, or
            gripper units), as the sim node's executor; 0 applies the chunk's points as they are.
        on_episode: called with each episode as it ends (a progress line).

    Returns:
        One :class:`RolloutEpisode` per seed, in order.

    Raises:
        ValueError: ``replan_steps`` outside 1 .. horizon, ``camera_every`` < 1, ``episode_s`` <= 0,
            an unknown policy string, or a policy whose image slots the sim has no camera for.
        ImportError: the simulator is not installed.
    """
    import torch

    from oxygen_ros.core.types import Observation
    from oxygen_ros.sim.record_bag import DEFAULT_INSTRUCTION
    from oxygen_ros.sim.scene import CAMERA_SLOTS, JOINT_NAMES, SimScene
    from oxygen_ros.sim.task.script import GRASP_ABOVE_CUBE_M, ScriptedPickLift, grasp_point
    from oxygen_ros.sim.task.success import LiftSuccess

    scripted = isinstance(policy, str)
    if scripted and policy != SCRIPTED:
        raise ValueError(f"policy must be a Pi05Policy or {SCRIPTED!r}, got {policy!r}")
    horizon = 50 if scripted else int(policy.cfg.action_horizon)
    wanted = () if scripted else tuple(policy.cfg.image_slots)
    missing = [slot for slot in wanted if slot not in CAMERA_SLOTS]
    if missing:
        raise ValueError(f"the sim has no camera for slot(s) {missing}")
    slots = {slot: CAMERA_SLOTS[slot] for slot in wanted}
    if not 1 <= replan_steps <= horizon or camera_every < 1 or not episode_s > 0 or not max_joint_speed >= 0:
        raise ValueError(
            f"need 1 <= replan_steps <= {horizon}, camera_every >= 1, episode_s > 0, max_joint_speed >= 0; "
            f"got {replan_steps}, {camera_every}, {episode_s}, {max_joint_speed}"
        )
    n_joints, right_gripper = len(JOINT_NAMES), JOINT_NAMES.index("right_gripper")
    scene = SimScene(cameras=tuple(dict.fromkeys(slots.values())) or ("top",), image_size=(120, 160))
    steps = round(episode_s * scene.control_rate_hz)
    bound = max_joint_speed / scene.control_rate_hz if max_joint_speed > 0 else np.inf
    episodes = []
    try:
        for seed in seeds:
            state = scene.reset(int(seed))
            script = ScriptedPickLift(scene) if scripted else None
            generator = torch.Generator().manual_seed(noise_seed + int(seed))
            success = LiftSuccess()
            frames: dict[str, np.ndarray] = {}
            chunk, k = np.empty((0, n_joints)), 0
            applied = state.copy()  # the arms rest at the reset pose until the first command
            closest = (np.inf, 0.0, 0.0, 0.0)  # (distance cm, horizontal cm, height cm, t)
            lowest = (np.inf, 0.0)  # (right gripper command, height cm)
            for step in range(steps):
                if not scripted and step % camera_every == 0:
                    frames = scene.render()
                if k >= min(replan_steps, len(chunk)):
                    if script is not None:
                        chunk = np.stack([script((step + i + 1) / scene.control_rate_hz) for i in range(horizon)])
                    else:
                        obs = Observation(
                            images={slot: frames[cam] for slot, cam in slots.items()},
                            state=state.astype(np.float32),
                            instruction=DEFAULT_INSTRUCTION,
                        )
                        noise = torch.randn(1, horizon, policy.cfg.action_dim, generator=generator)
                        chunk = np.asarray(policy.sample_actions(obs, noise=noise))[:, :n_joints]
                    k = 0
                command = applied = np.clip(chunk[k], applied - bound, applied + bound)
                k += 1
                state = scene.step(command)
                success.update(scene.time, scene.cube_position[2], state, scene.reward)
                if scene.time > 1.0:
                    target = scene.cube_position + np.array([0.0, 0.0, GRASP_ABOVE_CUBE_M])
                    rel = (grasp_point(scene, "right") - target) * 100.0
                    distance = float(np.linalg.norm(rel))
                    if distance < closest[0]:
                        closest = (distance, float(np.hypot(rel[0], rel[1])), float(rel[2]), scene.time)
                    if command[right_gripper] < lowest[0]:
                        lowest = (float(command[right_gripper]), float(rel[2]))
            episodes.append(
                RolloutEpisode(
                    seed=int(seed),
                    success=bool(success.success),
                    time_to_success_s=None if success.success_time is None else round(success.success_time, 2),
                    lift_max_cm=round(success.lift_max * 100.0, 2),
                    grasp_miss_cm=round(closest[0], 2),
                    grasp_miss_horizontal_cm=round(closest[1], 2),
                    grasp_miss_height_cm=round(closest[2], 2),
                    grasp_miss_t_s=round(closest[3], 2),
                    min_gripper_command=round(lowest[0], 3),
                    min_gripper_height_cm=round(lowest[1], 2),
                )
            )
            if on_episode is not None:
                on_episode(episodes[-1])
    finally:
        scene.close()
    return episodes


def rollout_summary(episodes: Sequence[RolloutEpisode]) -> dict[str, Any]:
    """Success count with its 95 % Wilson interval and the medians of the grasp measures.

    Raises:
        ValueError: no episodes.
    """
    from oxygen_ros.evaluate.results import wilson_interval

    if not episodes:
        raise ValueError("no episodes to summarise")
    n, ok = len(episodes), sum(e.success for e in episodes)
    lo, hi = wilson_interval(ok, n)
    return {
        "episodes": n,
        "successes": ok,
        "wilson_95": [round(lo, 3), round(hi, 3)],
        "median_grasp_miss_cm": float(np.median([e.grasp_miss_cm for e in episodes])),
        "gripper_closed": sum(e.min_gripper_command < 0.5 for e in episodes),
        "per_episode": [asdict(e) for e in episodes],
    }
