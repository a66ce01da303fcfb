"""Language targets of the transfer-cube task, derived from the sim's true state (ROS-free).

Two checkable answers, used as training targets (``record_demos``) and as the ground truth that
``evaluate`` scores the node's streamed answers against:

- **Where is the cube?** (:data:`CUBE_QUESTION`): a coarse region of the table. gym-aloha places
  the cube uniformly in ``x ∈ [0, 0.2] m`` (toward the right arm) and ``y ∈ [0.4, 0.6] m`` (away
  from the camera's bottom edge); the region splits that square at its centre: ``"back left"``,
  ``"back right"``, ``"front left"``, ``"front right"`` (left/right as the top camera sees it, back
  = larger ``y``). Once the cube is off the table (centre more than :data:`LIFTED_M` above its rest
  height) the answer is ``"in the gripper"``.
- **Phase narration** (the memory task): ``"reaching"`` until the script starts closing the right
  gripper, ``"grasping"`` while it closes and until the cube has left the table, ``"lifting"``
  until the script's lift ends, then ``"holding"`` while the cube is up (``"grasping"`` again if it
  fell back).
"""

from __future__ import annotations

import numpy as np

from oxygen_ros.sim.scene import CUBE_REST_Z

__all__ = [
    "CUBE_QUESTION",
    "CUBE_REGIONS",
    "LIFTED_M",
    "PHASES",
    "cube_region",
    "phase",
]

CUBE_QUESTION = "Where is the cube?"
CUBE_REGIONS: tuple[str, ...] = ("back left", "back right", "front left", "front right", "in the gripper")
PHASES: tuple[str, ...] = ("reaching", "grasping", "lifting", "holding")
LIFTED_M = 0.02
"""Cube centre this far (metres) above its rest height: off the table."""

_X_SPLIT_M = 0.1  # centre of gym-aloha's cube placement square (x in [0, 0.2], y in [0.4, 0.6])
_Y_SPLIT_M = 0.5
_GRASP_START_S = 4.5  # ScriptedPickLift's timeline: right gripper starts closing ...
_LIFT_END_S = 7.0  # ... and the lift ends


def cube_region(cube_position: np.ndarray, landed: bool = True) -> str:
    """The answer to :data:`CUBE_QUESTION` for the cube centre ``[3]`` (metres, world frame).

    ``landed``: whether the cube has touched down since the reset (a reset drops it from 5 cm;
    until it lands its height says nothing about a grasp).

    Raises:
        ValueError: not three finite numbers.
    """
    try:
        p = np.asarray(cube_position, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"cube position must be 3 finite numbers, got {cube_position!r}") from None
    if p.shape != (3,) or not np.isfinite(p).all():
        raise ValueError(f"cube position must be 3 finite numbers, got {cube_position!r}")
    if landed and p[2] > CUBE_REST_Z + LIFTED_M:
        return "in the gripper"
    depth = "back" if p[1] >= _Y_SPLIT_M else "front"
    side = "right" if p[0] >= _X_SPLIT_M else "left"
    return f"{depth} {side}"


def phase(script_time_s: float, cube_position: np.ndarray) -> str:
    """The phase narration at ``script_time_s`` seconds into the scripted pick-and-lift, given the
    cube centre ``[3]`` (metres) at that time (see the module doc)."""
    lifted = float(np.asarray(cube_position, dtype=np.float64).reshape(-1)[2]) > CUBE_REST_Z + LIFTED_M
    if script_time_s < _GRASP_START_S:
        return "reaching"
    if not lifted:
        return "grasping"
    return "lifting" if script_time_s < _LIFT_END_S else "holding"
