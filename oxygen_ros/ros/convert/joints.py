"""JointState -> numpy joint vectors, picked by name."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from sensor_msgs.msg import JointState

__all__ = ["JointStateError", "joint_state_to_vector"]


class JointStateError(ValueError):
    """A JointState message does not provide finite positions for the configured joints."""


def joint_state_to_vector(msg: JointState, joint_names: Sequence[str]) -> np.ndarray:
    """Pick the positions of ``joint_names`` out of a JointState, by name.

    The message may list joints in any order and carry extra joints; if a name appears twice the
    first occurrence wins.

    Returns:
        float64 ``[len(joint_names)]`` positions in ``joint_names`` order (robot units).

    Raises:
        JointStateError: ``msg.position`` shorter than ``msg.name``, configured joints missing
            (all listed), or a non-finite position for a configured joint (named).
    """
    names = list(msg.name)
    positions = np.asarray(msg.position, dtype=np.float64)
    if positions.shape[0] < len(names):
        raise JointStateError(f"JointState has {len(names)} names but only {positions.shape[0]} positions")
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        index.setdefault(name, i)
    missing = [name for name in joint_names if name not in index]
    if missing:
        raise JointStateError(f"JointState lacks configured joints: {', '.join(missing)}")
    out = positions[[index[name] for name in joint_names]]
    bad = [name for name, value in zip(joint_names, out, strict=True) if not math.isfinite(value)]
    if bad:
        raise JointStateError(f"JointState has non-finite positions for joints: {', '.join(bad)}")
    return out
