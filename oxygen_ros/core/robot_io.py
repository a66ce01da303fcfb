"""Robot-space observations in, robot commands out, around the engine (shared by the node and the
offline replay, so both apply the checkpoint's action space the same way).

The engine sees model-space states (:meth:`ActionSpace.state_to_model`: flips, gripper
conversions) and hands out model-space action chunks; :class:`RobotFrames` keeps each submitted
observation's model-space state by its stamp — the anchor of delta actions is the state *at
observation time*, never a later reading — and turns the chunk computed from it into a
:class:`~oxygen_ros.core.action_space.RobotCommand`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict

import numpy as np

from .action_space import ActionSpace, RobotCommand
from .types import ActionChunk, Observation

__all__ = ["RobotFrames"]


class RobotFrames:
    """Converts observations and chunks between robot and model space.

    Args:
        space: the configured action space.
        keep: how many recent observation states to remember (chunks of older ones are refused).

    Thread-safety: :meth:`observation` and :meth:`command` may run in different threads.
    """

    def __init__(self, space: ActionSpace, keep: int = 64) -> None:
        self.space = space
        self._keep = keep
        self._states: OrderedDict[float, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def observation(self, obs: Observation) -> Observation:
        """A copy of ``obs`` with its state in model space; remembers that state by ``obs.stamp``.

        Raises:
            ValueError: the state does not have one value per joint.
        """
        ms = self.space.state_to_model(np.asarray(obs.state, np.float64))
        with self._lock:
            self._states[float(obs.stamp)] = ms
            self._states.move_to_end(float(obs.stamp))
            while len(self._states) > self._keep:
                self._states.popitem(last=False)
        return dataclasses.replace(obs, state=ms)

    def command(self, chunk: ActionChunk) -> RobotCommand:
        """The robot command of a chunk computed from an observation given to :meth:`observation`.

        Raises:
            ValueError: the chunk's observation is unknown (not submitted through here, or too old),
                wrong shapes, or a non-finite command.
        """
        with self._lock:
            ms = self._states.get(float(chunk.stamp))
        if ms is None:
            raise ValueError(f"no observation state for the chunk of frame {chunk.frame_id} (stamp {chunk.stamp:.6f})")
        return self.space.to_robot(np.asarray(chunk.actions), ms)
