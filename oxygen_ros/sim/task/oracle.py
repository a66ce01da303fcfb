"""The scripted oracle policy without ROS: observation time -> action chunk of the scripted
pick-and-lift.

An oracle: it knows the cube placement from the sim's seed (it builds its own camera-less
:class:`~oxygen_ros.sim.scene.SimScene`, resets it with the seed and solves the script's key
poses from it). Script time 0 is the first observation's stamp; the chunk for the observation
stamped ``t`` holds the script's commands at the times its points are due, like the oxygen node's
chunks: point ``i`` (0-based) at ``t + (i + 1) * period_s``.
"""

from __future__ import annotations

import numpy as np

from oxygen_ros.sim.scene import SimScene
from oxygen_ros.sim.task.script import ScriptedPickLift

__all__ = ["OracleScript", "script_chunk"]


def script_chunk(
    script: ScriptedPickLift, t_obs: float, t0: float, horizon: int = 50, period_s: float = 0.02
) -> np.ndarray:
    """``[horizon, 14]`` float64: ``script(t_obs + (i + 1) * period_s - t0)`` for each point ``i``."""
    return np.stack([script(t_obs + (i + 1) * period_s - t0) for i in range(int(horizon))])


class OracleScript:
    """The script for the episodes of one sim run: seed ``seed`` first, ``seed + n`` after the
    ``n``-th reset (like the sim node).

    Args:
        seed: the sim's ``seed`` parameter.
        horizon / period_s: points per chunk and their spacing (the oxygen node's action horizon
            and ``control_period_s``).
    """

    def __init__(self, seed: int = 0, horizon: int = 50, period_s: float = 0.02) -> None:
        self._scene = SimScene(cameras=(), control_rate_hz=1.0 / period_s)
        self.seed0, self.horizon, self.period_s = int(seed), int(horizon), float(period_s)
        self.resets = -1
        self.new_episode(0)

    def new_episode(self, resets: int) -> None:
        """Plan the episode after the sim's ``resets``-th reset (0 = the first episode)."""
        if resets == self.resets:
            return
        self.resets = int(resets)
        self.seed = self.seed0 + self.resets
        self._scene.reset(self.seed)
        self.script = ScriptedPickLift(self._scene)
        self.t0: float | None = None

    def chunk(self, t_obs: float) -> np.ndarray:
        """The chunk for the observation stamped ``t_obs`` (the episode's first one sets script
        time 0)."""
        if self.t0 is None:
            self.t0 = float(t_obs)
        return script_chunk(self.script, t_obs, self.t0, self.horizon, self.period_s)

    def close(self) -> None:
        self._scene.close()
