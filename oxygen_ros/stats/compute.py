"""Normalisation statistics from recorded robot data (numpy; no ROS).

Follows openpi ``scripts/compute_norm_stats.py`` in *what* is measured: the state and the action
chunks the model is trained on, in model space — after the robot → model conversions of the
action space (sign flips, gripper conversions) and, for delta spaces, relative to the state at
the chunk's observation time (openpi ``DeltaActions`` over ``action_horizon`` steps, LeRobot's
relative-action stats over ``chunk_size``). Statistics are exact numpy ones (``np.quantile``,
linear interpolation) where openpi's ``RunningStats`` approximates quantiles with histograms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from oxygen_ros.core.action_space import ActionSpace
from oxygen_ros.core.types import NormStats


def norm_stats(rows: np.ndarray) -> NormStats:
    """mean, std, q01, q99 per column of ``rows`` ``[N, D]`` (float64 maths, float32 result).

    Raises:
        ValueError: fewer than 2 rows, or a non-finite value.
    """
    a = np.asarray(rows, np.float64)
    if a.ndim != 2 or a.shape[0] < 2:
        raise ValueError(f"need at least 2 rows of [N, D] values, got shape {list(a.shape)}")
    if not np.isfinite(a).all():
        raise ValueError("statistics input holds non-finite values")
    return NormStats(
        mean=a.mean(0).astype(np.float32),
        std=a.std(0).astype(np.float32),
        q01=np.quantile(a, 0.01, axis=0).astype(np.float32),
        q99=np.quantile(a, 0.99, axis=0).astype(np.float32),
    )


@dataclass
class Episode:
    """One recording: states and commands with their times (seconds, increasing).

    Attributes:
        state_t: ``[Ns]``; state: ``[Ns, n]`` robot states in robot units.
        action_t: ``[Na]``; actions: ``[Na, n]`` recorded commands in robot units (positions,
            velocities or ee commands, as the action space's kind says).
    """

    state_t: np.ndarray
    state: np.ndarray
    action_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    actions: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))


def model_rows(ep: Episode, space: ActionSpace, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """The model-space state rows and action rows of one episode.

    State rows: every state, through :meth:`ActionSpace.state_to_model`. Action rows: each command
    paired with the newest state at or before it (the observation it was acting on; commands
    before the first state are skipped) and converted with :meth:`ActionSpace.to_model`; for a
    ``delta`` space every command ``i`` opens a chunk of the next ``horizon`` commands (cut at the
    episode's end), all relative to the state paired with command ``i`` — the rows a delta
    checkpoint was trained on.

    Returns:
        (``[Ns, n]``, ``[Na', n]``) float64.
    """
    states = np.stack([space.state_to_model(s, np.float64) for s in ep.state])
    if len(ep.action_t) == 0:
        return states, np.zeros((0, states.shape[1]))
    idx = np.searchsorted(ep.state_t, ep.action_t, side="right") - 1
    keep = idx >= 0
    acts, anchor = np.asarray(ep.actions, np.float64)[keep], ep.state[idx[keep]]
    if space.kind != "delta":
        return states, space.to_model(acts, anchor)
    rows = [
        space.to_model(acts[i : i + horizon], np.repeat(anchor[i : i + 1], len(acts[i : i + horizon]), 0))
        for i in range(len(acts))
    ]
    return states, (np.concatenate(rows) if rows else np.zeros((0, states.shape[1])))


def episode_stats(episodes: list[Episode], space: ActionSpace, horizon: int) -> dict[str, NormStats]:
    """``{"state", "actions"}`` stats over several episodes (see :func:`model_rows`).

    Raises:
        ValueError: fewer than 2 state rows or 2 action rows in total (the message says which).
    """
    s_rows, a_rows = zip(*(model_rows(ep, space, horizon) for ep in episodes)) if episodes else ((), ())
    states = np.concatenate(s_rows) if s_rows else np.zeros((0, 0))
    actions = np.concatenate(a_rows) if a_rows else np.zeros((0, 0))
    if len(states) < 2:
        raise ValueError(f"need at least 2 joint states for statistics, got {len(states)}")
    if len(actions) < 2:
        raise ValueError(f"need at least 2 recorded commands (paired with a state) for statistics, got {len(actions)}")
    return {"state": norm_stats(states), "actions": norm_stats(actions)}


__all__ = ["Episode", "norm_stats", "model_rows", "episode_stats"]
