"""The transfer-cube task's language targets: the cube's region and the phase narration."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.sim.scene import CUBE_REST_Z
from oxygen_ros.sim.task.language import CUBE_REGIONS, LIFTED_M, PHASES, cube_region, phase

REST = CUBE_REST_Z


@pytest.mark.parametrize(
    "xy,answer",
    [
        ((0.05, 0.45), "front left"),
        ((0.15, 0.45), "front right"),
        ((0.05, 0.55), "back left"),
        ((0.15, 0.55), "back right"),
        ((0.1, 0.5), "back right"),  # the split belongs to the upper half on both axes
        ((0.0999, 0.4999), "front left"),
    ],
)
def test_region_on_the_table(xy, answer):
    assert cube_region(np.array([*xy, REST])) == answer
    assert answer in CUBE_REGIONS


def test_lifted_cube_is_in_the_gripper_only_after_it_landed():
    up = np.array([0.05, 0.45, REST + LIFTED_M + 0.01])
    assert cube_region(up) == "in the gripper"
    # right after a reset the cube falls from 5 cm: its height says nothing about a grasp
    assert cube_region(up, landed=False) == "front left"
    assert cube_region(np.array([0.05, 0.45, REST + LIFTED_M - 0.001])) == "front left"


@pytest.mark.parametrize("bad", [[0.1, 0.5], [0.1, np.nan, REST], "here", [0.1, 0.5, np.inf]])
def test_region_rejects_bad_positions(bad):
    with pytest.raises(ValueError, match="cube position"):
        cube_region(bad)


def test_phase_follows_the_script_and_the_cube():
    table, up = np.array([0.1, 0.5, REST]), np.array([0.1, 0.5, REST + 0.1])
    assert phase(0.0, table) == "reaching" and phase(4.49, table) == "reaching"
    assert phase(4.5, table) == "grasping" and phase(6.0, table) == "grasping"  # not lifted yet
    assert phase(6.0, up) == "lifting" and phase(7.0, up) == "holding"
    assert phase(9.0, table) == "grasping"  # dropped: no "holding" without the cube up
    assert set(PHASES) == {"reaching", "grasping", "lifting", "holding"}
