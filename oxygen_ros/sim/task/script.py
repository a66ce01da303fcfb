"""The transfer-cube task's scripted pick-and-lift: IK key poses + minimum-jerk joint interpolation.

``ScriptedPickLift(scene)`` (built right after ``SimScene.reset``) maps seconds since the reset to
``[14]`` joint commands; ``record_sim_bag`` records it and the oracle policy
(:mod:`oxygen_ros.sim.task.policy_node`) publishes it as action chunks.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from oxygen_ros.sim.scene import _ARM_JOINTS, CUBE_REST_Z, GRIPPER_CLOSED, GRIPPER_OPEN, SimScene

__all__ = ["GRASP_ABOVE_CUBE_M", "ScriptedPickLift", "grasp_point"]

GRASP_ABOVE_CUBE_M = 0.025
"""Height above the cube's centre at which the script's IK puts the grasp point to close the gripper."""


class _ArmIK:
    """Damped-least-squares IK of one arm over waist, shoulder, elbow, wrist_angle.

    forearm_roll and wrist_rotate stay 0, so the gripper's fingers stay in the arm's vertical plane.
    The controlled point is between the finger pads (``GRASP_OFFSET`` along the gripper link's x).
    """

    GRASP_OFFSET = 0.11  # metres from the gripper link origin along its x axis (finger pads)
    IK_JOINTS = (0, 1, 2, 4)  # indices into _ARM_JOINTS

    def __init__(self, model: Any, side: str) -> None:
        import mujoco

        self._mj = mujoco
        self._model = model
        self._data = mujoco.MjData(model)
        self._body = model.body(f"vx300s_{side}/gripper_link").id
        joints = [model.joint(f"vx300s_{side}/{name}") for name in _ARM_JOINTS]
        self._qadr = np.array([int(j.qposadr[0]) for j in joints])
        self._dadr = np.array([int(j.dofadr[0]) for j in joints])
        self._lo = np.array([j.range[0] for j in joints])
        self._hi = np.array([j.range[1] for j in joints])

    def solve(self, target: np.ndarray, q_init: np.ndarray) -> np.ndarray:
        """Arm joints ``[6]`` (radians) putting the grasp point at ``target`` ``[3]`` (metres), gripper
        pointing straight down, starting from ``q_init`` ``[6]``.

        Best effort: the closest reachable solution after a fixed number of iterations is returned.
        """
        mj, m, d = self._mj, self._model, self._data
        q = np.array(q_init, dtype=np.float64)
        q[[3, 5]] = 0.0
        cols = self._dadr[list(self.IK_JOINTS)]
        jacp, jacr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
        for _ in range(300):
            d.qpos[self._qadr] = q
            mj.mj_kinematics(m, d)
            mj.mj_comPos(m, d)
            rot = d.xmat[self._body].reshape(3, 3)
            point = d.xpos[self._body] + self.GRASP_OFFSET * rot[:, 0]
            mj.mj_jac(m, d, jacp, jacr, point, self._body)
            # position error, and the approach axis (gripper x) turned toward -z (weighted m/rad)
            e = np.concatenate([target - point, 0.3 * np.cross(rot[:, 0], [0.0, 0.0, -1.0])])
            j = np.vstack([jacp[:, cols], 0.3 * jacr[:, cols]])
            if np.linalg.norm(e) < 1e-5:
                break
            dq = j.T @ np.linalg.solve(j @ j.T + 1e-4 * np.eye(j.shape[0]), e)
            q[list(self.IK_JOINTS)] += np.clip(dq, -0.2, 0.2)
            q = np.clip(q, self._lo, self._hi)
        return q


def grasp_point(scene: SimScene, side: str = "right") -> np.ndarray:
    """``[3]`` world position in metres of the point between one gripper's finger pads: the point the
    script's IK puts ``GRASP_ABOVE_CUBE_M`` above the cube's centre to grasp it (``_ArmIK.GRASP_OFFSET``
    along the gripper link's x axis).

    Raises:
        KeyError: ``side`` is not ``left`` or ``right``.
    """
    data = scene.physics.named.data
    body = f"vx300s_{side}/gripper_link"
    axis = np.asarray(data.xmat[body]).reshape(3, 3)[:, 0]
    point: np.ndarray = np.asarray(data.xpos[body]) + _ArmIK.GRASP_OFFSET * axis
    return point


def _smoothstep(x: float) -> float:
    """Minimum-jerk blend 0 -> 1 on x in [0, 1]."""
    x = min(max(x, 0.0), 1.0)
    return x * x * x * (10.0 + x * (6.0 * x - 15.0))


class ScriptedPickLift:
    """Joint-space script: both arms reach toward the cube, the right arm grasps and lifts it.

    Key poses are solved by IK once, from the arm pose and cube position at construction;
    commands between them follow minimum-jerk joint interpolation. Timeline (seconds): 0-3 both
    arms reach (right above the cube, left hovering beside it; grippers point down with fingers
    square to the cube), 3-4.5 right descends, 4.5-5.3 right gripper closes, 5.3-7 lift, 7-8.8
    carry toward the table centre while the left arm comes to meet it, 8.8-9.6 left gripper closes,
    then hold (``duration`` = 10 s). Lifts the cube for every seed tried (0-39).

    Args:
        scene: a scene right after ``reset`` (arms at the start pose; the script starts there).
    """

    def __init__(self, scene: SimScene) -> None:
        q0 = scene.joint_positions()
        cube = scene.cube_position
        cube[2] = CUBE_REST_Z  # reset drops the cube from z = 0.05 m; it settles within 0.5 s
        model = scene.physics.model.ptr
        left, right = _ArmIK(model, "left"), _ArmIK(model, "right")
        ql0, qr0 = q0[0:6], q0[7:13]
        up = np.array([0.0, 0.0, 1.0])
        meet = np.array([-0.02, 0.5, 0.22])
        r_above = right.solve(cube + 0.15 * up, qr0)
        r_grasp = right.solve(cube + GRASP_ABOVE_CUBE_M * up, r_above)
        r_lift = right.solve(cube + 0.2 * up, r_grasp)
        r_meet = right.solve(meet + np.array([0.04, 0.0, 0.0]), r_lift)
        l_hover = left.solve(cube + np.array([-0.12, 0.0, 0.18]), ql0)
        l_meet = left.solve(meet + np.array([-0.06, 0.0, 0.0]), l_hover)
        # Pointing down, wrist_rotate = waist turns the fingers back parallel to the table axes, i.e.
        # square to the faces of the (unrotated) cube.
        for q in (r_above, r_grasp, r_lift, r_meet, l_hover, l_meet):
            q[5] = q[0]
        o, c = GRIPPER_OPEN, GRIPPER_CLOSED
        # (time s, left arm [6], left gripper, right arm [6], right gripper)
        self._keys: list[tuple[float, np.ndarray]] = [
            (0.0, self._cmd(ql0, q0[6], qr0, q0[13])),
            (3.0, self._cmd(l_hover, o, r_above, o)),
            (4.5, self._cmd(l_hover, o, r_grasp, o)),
            (5.3, self._cmd(l_hover, o, r_grasp, c)),
            (7.0, self._cmd(l_hover, o, r_lift, c)),
            (8.8, self._cmd(l_meet, o, r_meet, c)),
            (9.6, self._cmd(l_meet, c, r_meet, c)),
            (10.0, self._cmd(l_meet, c, r_meet, c)),
        ]
        self.duration: float = self._keys[-1][0]

    @staticmethod
    def _cmd(ql: np.ndarray, gl: float, qr: np.ndarray, gr: float) -> np.ndarray:
        return np.concatenate([ql, [gl], qr, [gr]]).astype(np.float64)

    def __call__(self, t: float) -> np.ndarray:
        """``[14]`` joint command at time ``t`` seconds after reset (held after ``duration``)."""
        keys = self._keys
        cmd: np.ndarray
        if t <= keys[0][0]:
            cmd = keys[0][1].copy()
            return cmd
        for (t0, a), (t1, b) in itertools.pairwise(keys):
            if t < t1:
                cmd = a + (b - a) * _smoothstep((t - t0) / (t1 - t0))
                return cmd
        cmd = keys[-1][1].copy()
        return cmd
