"""Task success of one transfer-cube episode: the cube lifted and held (ROS-free).

Criterion: the cube centre at least ``lift_height_m`` above its rest height (``CUBE_REST_Z``, the
4 cm cube on the table) continuously for ``lift_hold_s`` simulated seconds. It is gym-aloha's
reward stage 2 ("lifted": the cube touches the right gripper and not the table) made robust in
time: a cube bounced or flicked up for a moment is not a success. gym-aloha's staged reward
(``SimScene.reward``, 0..4) is recorded too, as its maximum over the episode.

Episode time runs from the episode start: the first step whose command came from a policy
(``update(..., started=True)``; in the sim node: the first step the executor executed a chunk).
Nothing before it counts. The cube is dropped from 5 cm at a reset: the lift is measured only once
it has landed (its centre within ``LANDED_TOL_M`` of the rest height once).

Per episode (:meth:`LiftSuccess.summary`): ``episode_time_s``, ``success``, ``success_time_s``
(episode seconds to the step that completes the hold; None before), ``lift_max_m``,
``max_reward``, ``path_length_rad`` (sum of the L2 norms of the step changes of the 12 measured
arm joints, radians) and ``gripper_path_length`` (sum of the absolute step changes of the two
grippers, normalised opening). Both path lengths stop at success (the path *to* success), and
run over the whole episode otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oxygen_ros.sim.scene import CUBE_REST_Z

__all__ = ["ARM_INDICES", "GRIPPER_INDICES", "LANDED_TOL_M", "LiftSuccess"]

ARM_INDICES = np.array([0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12])
GRIPPER_INDICES = np.array([6, 13])
LANDED_TOL_M = 0.005
_EPS = 1e-9


class LiftSuccess:
    """Success detector of one episode at a time (see module doc).

    Args:
        lift_height_m: lift of the cube centre above its rest height that counts, metres (> 0).
        lift_hold_s: how long the lift must last without a break, simulated seconds (>= 0).
        rest_z: the cube centre's rest height, metres.

    Raises:
        ValueError: non-positive lift height or negative hold.
    """

    def __init__(self, lift_height_m: float = 0.05, lift_hold_s: float = 1.0, rest_z: float = CUBE_REST_Z) -> None:
        if not lift_height_m > 0 or not lift_hold_s >= 0:
            raise ValueError(f"lift_height_m must be > 0 and lift_hold_s >= 0, got {lift_height_m}, {lift_hold_s}")
        self.lift_height_m, self.lift_hold_s, self.rest_z = float(lift_height_m), float(lift_hold_s), rest_z
        self.reset()

    def reset(self) -> None:
        """Start a new episode (after a scene reset)."""
        self.start: float | None = None  # sim time of the episode start
        self.now = 0.0
        self.success = False
        self.success_time: float | None = None  # episode seconds
        self.lift_max = 0.0
        self.max_reward = 0.0
        self.path_length = 0.0
        self.gripper_path_length = 0.0
        self._landed = False
        self._above_since: float | None = None
        self._q: np.ndarray | None = None

    def update(self, t: float, cube_z: float, q: np.ndarray, reward: float = 0.0, started: bool = True) -> bool:
        """One control step, after it: ``t`` sim seconds (any origin, increasing), cube centre
        height ``cube_z`` (m), measured joints ``q`` ``[14]``, gym-aloha reward of the step,
        ``started`` whether a policy commanded this step (the first such step starts the episode).

        Returns:
            True on the step that completes the hold (success), else False.
        """
        if self.start is None:
            if not started:
                return False
            self.start = float(t)
        self.now = float(t)
        z = float(cube_z)
        if not self._landed:
            self._landed = z <= self.rest_z + LANDED_TOL_M
        q = np.asarray(q, dtype=np.float64)
        if self._q is not None and not self.success:
            d = q - self._q
            self.path_length += float(np.linalg.norm(d[ARM_INDICES]))
            self.gripper_path_length += float(np.sum(np.abs(d[GRIPPER_INDICES])))
        self._q = q
        self.max_reward = max(self.max_reward, float(reward))
        if not self._landed:
            return False
        lift = z - self.rest_z
        self.lift_max = max(self.lift_max, lift)
        if lift < self.lift_height_m:
            self._above_since = None
            return False
        if self._above_since is None:  # the hold counts from the first step seen lifted
            self._above_since = self.now
        if self.success or self.now - self._above_since < self.lift_hold_s - _EPS:
            return False
        self.success, self.success_time = True, self.now - self.start
        return True

    @property
    def episode_time(self) -> float:
        """Simulated seconds since the episode start (0 before it)."""
        return 0.0 if self.start is None else self.now - self.start

    def summary(self) -> dict[str, Any]:
        """The episode values (module doc), rounded for a status message (safe to call from
        another thread than :meth:`update`'s)."""
        start, success_time = self.start, self.success_time  # read once: another thread may reset
        return {
            "episode_started": start is not None,
            "episode_time_s": 0.0 if start is None else round(self.now - start, 3),
            "success": self.success,
            "success_time_s": None if success_time is None else round(success_time, 3),
            "lift_max_m": round(self.lift_max, 4),
            "max_reward": int(self.max_reward),
            "path_length_rad": round(self.path_length, 4),
            "gripper_path_length": round(self.gripper_path_length, 4),
            "lift_height_m": self.lift_height_m,
            "lift_hold_s": self.lift_hold_s,
        }
