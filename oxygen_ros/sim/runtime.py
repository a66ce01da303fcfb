"""ROS-free runtime pieces of the ``aloha_sim`` node: the real-time pacer, rolling rate
statistics and the camera render thread (see :mod:`oxygen_ros.sim.node`)."""

from __future__ import annotations

import collections
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Pacer", "Rates", "Renderer"]


class Pacer:
    """Paces simulation steps against a wall clock (ROS-free).

    Args:
        step_s: simulated seconds per step (> 0).
        rtf: target real-time factor (simulated / wall seconds); 0 = unpaced.
        max_lag_s: wall seconds behind the target beyond which catching up stops: with
            ``rtf == 1`` the simulated clock jumps ahead by the lag (so it keeps following the
            wall clock), otherwise the pacing restarts from the current step.
        wall: monotonic wall clock (seconds), injectable for tests.
    """

    def __init__(self, step_s: float, rtf: float, max_lag_s: float, wall: Callable[[], float] = time.monotonic) -> None:
        self.step_s, self.rtf, self.max_lag_s, self._wall = step_s, rtf, max_lag_s, wall
        self.elapsed = 0.0  # simulated seconds since start
        self.overruns = 0
        self._w0, self._s0 = wall(), 0.0

    def delay(self) -> float:
        """Wall seconds to wait before the next step (0 when due); handles falling behind."""
        if self.rtf <= 0:
            return 0.0
        now = self._wall()
        target = self._w0 + (self.elapsed - self._s0) / self.rtf
        if now - target > self.max_lag_s:
            self.overruns += 1
            if self.rtf == 1.0:
                self.elapsed += now - target  # real time: the sim clock keeps up with the wall
            self._w0, self._s0 = now, self.elapsed
            return 0.0
        return max(0.0, target - now)

    def advance(self) -> None:
        """Account one simulated step."""
        self.elapsed += self.step_s

    def restart(self) -> None:
        """Pace from now on (after a pause such as a reset)."""
        self._w0, self._s0 = self._wall(), self.elapsed


class Rates:
    """Sliding-window rates over wall time (thread-safe)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._steps: collections.deque[tuple[float, float]] = collections.deque()
        self._frames: collections.deque[tuple[float, float]] = collections.deque()

    def _trim(self, q: collections.deque[tuple[float, float]], now: float) -> None:
        while len(q) > 2 and now - q[0][0] > self.window_s:
            q.popleft()

    def step(self, wall: float, sim: float) -> None:
        with self._lock:
            self._steps.append((wall, sim))
            self._trim(self._steps, wall)

    def frame(self, wall: float, render_s: float) -> None:
        with self._lock:
            self._frames.append((wall, render_s))
            self._trim(self._frames, wall)

    def summary(self, now: float) -> dict[str, float]:
        with self._lock:
            self._trim(self._steps, now)
            self._trim(self._frames, now)
            steps, frames = list(self._steps), list(self._frames)
        out = {"sim_step_hz": 0.0, "real_time_factor": 0.0, "camera_hz": 0.0, "render_ms": 0.0}
        if len(steps) > 1 and steps[-1][0] > steps[0][0]:
            span = steps[-1][0] - steps[0][0]
            out["sim_step_hz"] = (len(steps) - 1) / span
            out["real_time_factor"] = (steps[-1][1] - steps[0][1]) / span
        if len(frames) > 1 and frames[-1][0] > frames[0][0]:
            out["camera_hz"] = (len(frames) - 1) / (frames[-1][0] - frames[0][0])
        if frames:
            out["render_ms"] = float(np.median([f[1] for f in frames])) * 1e3
        return out


class Renderer:
    """Renders camera snapshots in its own thread with its own MuJoCo renderer and ``MjData``.

    ``submit`` hands over a kinematic snapshot (qpos, mocap) with its stamp; the thread renders
    the newest one. A snapshot still pending when the next arrives is replaced (``skipped``).
    """

    def __init__(
        self,
        model: Any,
        cameras: tuple[str, ...],
        size: tuple[int, int],
        shadows: bool,
        publish: Callable[[float, dict[str, np.ndarray], float], None],
        on_error: Callable[[str], None],
    ) -> None:
        self._model, self._cameras, self._size, self._shadows = model, cameras, size, shadows
        self._publish, self._on_error = publish, on_error
        self._cond = threading.Condition()
        self._pending: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._stop = False
        self.skipped = 0
        self.frames = 0
        self.ready = threading.Event()
        self.error = ""
        self._thread = threading.Thread(target=self._run, name="aloha-sim-render", daemon=True)

    def start(self, timeout: float = 60.0) -> None:
        """Start the thread and wait until the GL context exists.

        Raises:
            RuntimeError: the renderer could not be created (message from MuJoCo).
        """
        self._thread.start()
        if not self.ready.wait(timeout) or self.error:
            raise RuntimeError(f"camera renderer failed to start: {self.error or 'timeout'}")

    def submit(self, stamp: float, qpos: np.ndarray, mocap_pos: np.ndarray, mocap_quat: np.ndarray) -> None:
        with self._cond:
            if self._pending is not None:
                self.skipped += 1
            self._pending = (stamp, qpos, mocap_pos, mocap_quat)
            self._cond.notify()

    def clear(self) -> None:
        """Drop a pending snapshot (reset)."""
        with self._cond:
            self._pending = None

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        import mujoco

        renderer = None
        try:
            h, w = self._size
            renderer = mujoco.Renderer(self._model, h, w)
            data = mujoco.MjData(self._model)
        except Exception as exc:  # GL / EGL problems: reported by start()
            self.error = f"{type(exc).__name__}: {exc}"
            self.ready.set()
            return
        self.ready.set()
        flags = mujoco.mjtRndFlag
        try:
            while True:
                with self._cond:
                    while self._pending is None and not self._stop:
                        self._cond.wait()
                    if self._stop:
                        return
                    assert self._pending is not None  # the wait above ends with a frame or with stop
                    stamp, qpos, mocap_pos, mocap_quat = self._pending
                    self._pending = None
                t0 = time.perf_counter()
                data.qpos[:] = qpos
                if mocap_pos.size:
                    data.mocap_pos[:] = mocap_pos
                    data.mocap_quat[:] = mocap_quat
                mujoco.mj_forward(self._model, data)
                images = {}
                for cam in self._cameras:
                    renderer.update_scene(data, camera=cam)
                    renderer.scene.flags[flags.mjRND_SHADOW] = int(self._shadows)
                    renderer.scene.flags[flags.mjRND_REFLECTION] = int(self._shadows)
                    images[cam] = renderer.render()
                self.frames += 1
                self._publish(stamp, images, time.perf_counter() - t0)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self._on_error(f"camera rendering stopped: {self.error}\n{traceback.format_exc()}")
        finally:
            renderer.close()
