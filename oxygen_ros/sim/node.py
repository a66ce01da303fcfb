"""The ALOHA MuJoCo simulation as a ROS 2 robot (console script ``aloha_sim``, node ``aloha_sim``).

Wraps :class:`~oxygen_ros.sim.scene.SimScene` (gym-aloha's transfer-cube scene):

- publishes ``joint_states`` (``sensor_msgs/JointState``: the 14 ALOHA joints, position and
  velocity) every control step, and the three cameras ``top``, ``left_wrist``, ``right_wrist`` at
  ``camera_rate_hz`` (simulated time) as ``CompressedImage`` (``image_format`` jpeg/png) or raw
  ``Image`` (rgb8/bgr8), on ALOHA's topic names by default
  (``cam_high/image_raw/compressed`` ...), matching ``config/oxygen.yaml``;
- subscribes to ``action_chunk`` (``trajectory_msgs/JointTrajectory``) or, with
  ``command_source: stream``, to the per-step ``joint_command`` stream, and executes them with
  :class:`~oxygen_ros.sim.executor.ChunkExecutor` (time alignment by stamp, newer chunks
  replace older ones from their start, bad chunks rejected and counted, safe hold + loss report);
  with ``command_delay_s`` > 0 each one reaches the executor that long after it arrived (an added
  policy latency, :mod:`oxygen_ros.sim.command_inputs`);
- publishes what it applied on ``~/executed_command`` (``JointState``, reliable) and its status on
  ``/diagnostics`` (``aloha_sim: executor``: state, rates, real-time factor, counters, chunk ages);
  the status is also published at once on a loss, on resuming, on a reset and on task success;
- detects task success every step (:class:`~oxygen_ros.sim.task.success.LiftSuccess`: the cube
  lifted ``lift_height_m`` for ``lift_hold_s``) and reports the episode in the status:
  ``episode_started``, ``episode_time_s``, ``success``, ``success_time_s``, ``lift_max_m``,
  ``max_reward`` (gym-aloha's staged reward), ``path_length_rad``, ``gripper_path_length``,
  ``seed``; the episode starts at the first executed chunk step, a reset starts a new one;
- publishes ``/clock`` with ``publish_clock: true`` (use with ``use_sim_time`` elsewhere, needed
  when ``real_time_factor`` is not 1);
- resets the scene (arms to the start pose, cube to a new seeded pose) on the ``~/reset`` service
  (``std_srvs/Trigger``, when std_srvs is installed) or any message on the ``~/reset`` topic
  (``std_msgs/Empty``).

Timing: every message stamp is the *simulation clock*: ``clock_start`` (default: the wall clock at
start) plus the simulated time, which never goes backwards (not even on reset). The physics runs in
its own thread paced to ``real_time_factor`` simulated seconds per wall second (0 = as fast as it
can). In real-time mode (factor 1) the sim clock follows the wall clock; when the process falls
more than ``max_lag_s`` behind, the clock jumps ahead (counted as ``overruns``) instead of drifting.
Cameras render in another thread (:class:`~oxygen_ros.sim.runtime.Renderer`) from a snapshot of
the state at the step they are stamped with; a frame still pending when the next is due is skipped
and counted. ``MUJOCO_GL`` defaults to ``egl`` (CPU software rendering works headless).

Run: ``aloha_sim --ros-args --params-file config/sim.yaml`` (or ``python -m
oxygen_ros.sim.node ...``); together with the oxygen node: ``launch/sim.launch.py`` or the
``closed_loop`` script. Exit status 0 after SIGINT, 2 for invalid parameters, 1 for a sim failure.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Empty, Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.ros.params.files import check_node_arguments
from oxygen_ros.ros.params.specs import ParamError, declare, read_values
from oxygen_ros.ros.qos import qos_from_name, reliable_qos
from oxygen_ros.ros.signals import init_without_signal_handlers
from oxygen_ros.sim.command_inputs import CommandInputs
from oxygen_ros.sim.executor import ChunkExecutor, Command, ExecState
from oxygen_ros.sim.params import NODE_NAME, STATUS_NAME, sim_specs
from oxygen_ros.sim.publishers import SimPublishers
from oxygen_ros.sim.runtime import Pacer, Rates, Renderer
from oxygen_ros.sim.scene import JOINT_NAMES, SimScene
from oxygen_ros.sim.status import executor_status, sim_summary
from oxygen_ros.sim.task.success import LiftSuccess

try:  # std_srvs is optional: without it only the ~/reset topic exists
    from std_srvs.srv import Trigger
except ImportError:  # pragma: no cover - depends on the installation
    Trigger = None

__all__ = ["AlohaSimNode", "Pacer", "main", "sim_specs", "STATUS_NAME"]


class AlohaSimNode(Node):
    """The simulated ALOHA robot (see module doc). Call :meth:`start` after creation and
    :meth:`stop` before destroying it.

    Raises:
        ParamError: invalid parameters (every problem, by name).
        ImportError: mujoco / gym-aloha missing.
        RuntimeError: the renderer cannot be created.
    """

    def __init__(self, node_name: str = NODE_NAME, **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        specs = sim_specs()
        declare(self, specs)
        p = read_values(self, specs)
        cams, topics = tuple(p["cameras"]), tuple(p["camera_topics"])
        if len(cams) != len(topics):
            raise ParamError([f"camera_topics has {len(topics)} entries but cameras has {len(cams)}"])
        self.p = p
        self.step_s = 1.0 / p["control_rate_hz"]
        os.environ.setdefault("MUJOCO_GL", "egl")
        try:
            self.scene: SimScene | None = SimScene(
                cameras=cams, image_size=(p["image_height"], p["image_width"]), control_rate_hz=p["control_rate_hz"]
            )
        except ValueError as exc:  # unknown camera, image size or rate: parameter problems
            raise ParamError([f"cameras / image_width / image_height / control_rate_hz: {exc}"]) from exc
        self._seed = p["seed"]
        q0 = self.scene.reset(self._seed)
        self.clock_start = p["clock_start"] or time.time()
        self.pacer = Pacer(self.step_s, p["real_time_factor"], p["max_lag_s"])
        self.chunk_executor = ChunkExecutor(
            JOINT_NAMES,
            self.step_s,
            q0,
            loss_timeout_s=p["loss_timeout_s"],
            max_speed=p["max_joint_speed"],
            source=p["command_source"],
            stream_timeout_s=p["command_timeout_s"],
        )
        every = p["camera_rate_hz"] * self.step_s
        self.camera_every = max(1, math.floor(1.0 / every + 0.5)) if every > 0 and cams else 0
        self.rates = Rates()
        self.episode = LiftSuccess(p["lift_height_m"], p["lift_hold_s"])
        self.resets = 0
        self.failure = ""
        self._stop = threading.Event()
        self._reset_request = threading.Event()
        self._reset_done = threading.Condition()
        self._reset_serial = 0
        self._sim_now = self.clock_start
        self._step_count = 0
        self._thread = threading.Thread(target=self._run, name="aloha-sim", daemon=True)

        self.pub = SimPublishers(self, p, cams, topics)

        # inputs
        self.commands = CommandInputs(
            self.chunk_executor, self.get_logger(), lambda: self._sim_now, p["command_delay_s"]
        )
        inputs = MutuallyExclusiveCallbackGroup()
        if p["command_source"] == "trajectory":
            self.create_subscription(
                JointTrajectory,
                p["action_topic"],
                self.commands.on_trajectory,
                qos_from_name(p["action_qos"]),
                callback_group=inputs,
            )
        elif p["command_type"] == "joint_state":
            self.create_subscription(
                JointState,
                p["command_topic"],
                self.commands.on_command,
                qos_from_name(p["command_qos"]),
                callback_group=inputs,
            )
        else:
            self.create_subscription(
                Float64MultiArray,
                p["command_topic"],
                self.commands.on_command_array,
                qos_from_name(p["command_qos"]),
                callback_group=inputs,
            )
        self.create_subscription(
            Empty, "~/reset", lambda _msg: self._reset_request.set(), reliable_qos(), callback_group=inputs
        )
        self.reset_service = None
        if Trigger is not None:
            self.reset_service = self.create_service(
                Trigger, "~/reset", self._on_reset_service, callback_group=MutuallyExclusiveCallbackGroup()
            )
        self.create_timer(
            p["diagnostics_period_s"], self.publish_diagnostics, callback_group=MutuallyExclusiveCallbackGroup()
        )

        self.renderer = None
        if self.camera_every:
            self.renderer = Renderer(
                self.scene.physics.model.ptr,
                cams,
                (p["image_height"], p["image_width"]),
                p["render_shadows"],
                self._publish_images,
                self._fail,
            )
            self.renderer.start()
        self.get_logger().info(
            f"ALOHA sim ready: {p['control_rate_hz']:g} Hz control, real-time factor "
            f"{p['real_time_factor']:g}{' (+ /clock)' if self.pub.clock else ''}, cameras "
            f"{list(cams)} every {self.camera_every} steps at {p['image_width']}x"
            f"{p['image_height']} {p['image_format']}, source {p['command_source']}, reset "
            f"{'service + topic' if self.reset_service else 'topic'} ~/reset"
        )

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the simulation thread."""
        self.pacer.restart()
        self._thread.start()

    def stop(self) -> None:
        """Stop the simulation and camera threads, free MuJoCo (idempotent)."""
        self._stop.set()
        with self._reset_done:
            self._reset_done.notify_all()
        if self._thread.is_alive():
            self._thread.join(10)
        if self.renderer is not None:
            self.renderer.stop()
        if self.scene is not None:
            summary = self.summary()
            self.scene.close()
            self.scene = None
            line = "final: " + json.dumps(summary, sort_keys=True)
            if self.context.ok():
                self.get_logger().info(line)
            else:  # after rclpy shutdown (SIGINT) the logger's /rosout publisher is gone
                print(f"[INFO] [{self.get_name()}]: {line}", file=sys.stderr, flush=True)

    @property
    def sim_now(self) -> float:
        """Current simulation clock, seconds since the epoch."""
        return self._sim_now

    # ------------------------------------------------------------------ problems
    def _fail(self, message: str) -> None:
        """A fatal simulation / rendering error: log it and end the process (exit status 1)."""
        self.failure = message
        self.get_logger().error(message)
        self.context.try_shutdown()

    # ------------------------------------------------------------------ callbacks
    def _on_reset_service(self, request: Any, response: Any) -> Any:
        with self._reset_done:
            target = self._reset_serial + 1
            self._reset_request.set()
            ok = self._reset_done.wait_for(lambda: self._reset_serial >= target or self._stop.is_set(), timeout=10.0)
        response.success = bool(ok and self._reset_serial >= target)
        response.message = (
            f"reset #{self.resets}, cube seed {self._seed}"
            if response.success
            else "reset did not happen (simulation stopped or stalled)"
        )
        return response

    # ------------------------------------------------------------------ simulation thread
    def _run(self) -> None:
        try:
            self._publish_state(self.sim_now)
            while not self._stop.is_set():
                delay = self.pacer.delay()
                if delay > 0 and self._stop.wait(delay):
                    break
                if self._reset_request.is_set():
                    self._do_reset()
                self._step()
        except Exception as exc:
            if not self._stop.is_set() and self.context.ok():
                self._fail(f"simulation stopped: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")

    def _step(self) -> None:
        now = self.clock_start + self.pacer.elapsed
        self._sim_now = now
        assert self.scene is not None  # None only after stop(), which ends the simulation thread first
        self.commands.release(now)
        cmd = self.chunk_executor.step(now)
        q = self.scene.step(cmd.positions)
        succeeded = self.episode.update(
            self.scene.time, self.scene.cube_position[2], q, self.scene.reward, cmd.state == ExecState.EXECUTING
        )
        self.pacer.advance()
        after = self.clock_start + self.pacer.elapsed
        self._sim_now = after
        self.rates.step(time.monotonic(), self.pacer.elapsed)
        self.pub.executed_command(now, cmd)
        self._publish_state(after)
        self._step_count += 1
        if self.camera_every and self._step_count % self.camera_every == 0:
            assert self.renderer is not None  # created in __init__ whenever camera_every > 0
            data = self.scene.physics.data.ptr
            self.renderer.submit(after, data.qpos.copy(), data.mocap_pos.copy(), data.mocap_quat.copy())
        if cmd.event:
            self._on_event(cmd, now)
        if succeeded:
            self.get_logger().info(
                f"task success: cube lifted {self.p['lift_height_m']:g} m for "
                f"{self.p['lift_hold_s']:g} s, {self.episode.success_time:.2f} s "
                f"into the episode (seed {self._seed})"
            )
            self.publish_diagnostics()

    def _on_event(self, cmd: Command, now: float) -> None:
        if cmd.event == "loss":
            what = "action chunk" if self.p["command_source"] == "trajectory" else "fresh per-step command"
            self.get_logger().warning(
                f"command loss: no {what} covers sim time {now:.3f} (held "
                f"{cmd.held_s * 1e3:.0f} ms); holding the last command "
                f"{np.round(cmd.positions, 3).tolist()} until chunks arrive again"
            )
        else:
            self.get_logger().info(
                f"commands resumed at sim time {now:.3f} (loss #{self.chunk_executor.counts().get('losses', 0)})"
            )
        self.publish_diagnostics()

    def _do_reset(self) -> None:
        self._reset_request.clear()
        if self.renderer is not None:
            self.renderer.clear()
        self.resets += 1
        self._seed = self.p["seed"] + self.resets
        assert self.scene is not None  # None only after stop(), which ends the simulation thread first
        q = self.scene.reset(self._seed)
        now = self.clock_start + self.pacer.elapsed
        self.chunk_executor.reset(q, now)
        self.episode.reset()
        self.pacer.restart()  # the next step publishes the new state (stamps stay increasing)
        self.get_logger().info(
            f"reset #{self.resets}: arms at the start pose, cube seed {self._seed}, sim time {now:.3f}"
        )
        with self._reset_done:
            self._reset_serial += 1
            self._reset_done.notify_all()
        self.publish_diagnostics()  # the new episode (an oracle policy follows ``resets``)

    # ------------------------------------------------------------------ publishing
    def _publish_state(self, t: float) -> None:
        assert self.scene is not None  # None only after stop(), which ends the simulation thread first
        self.pub.state(t, self.scene.joint_positions(), self.scene.joint_velocities())

    def _publish_images(self, stamp: float, images: dict[str, np.ndarray], render_s: float) -> None:
        try:
            self.pub.images(stamp, images)
        except Exception:
            if self._stop.is_set() or not self.context.ok():
                return
            raise
        self.rates.frame(time.monotonic(), render_s)

    def summary(self) -> dict[str, Any]:
        """Status values: state, sim time, rates, counters and chunk ages (see module doc)."""
        return (
            sim_summary(
                self.chunk_executor, self.pacer, self.rates, self.renderer, self.resets, self.p["real_time_factor"]
            )
            | self.episode.summary()
            | {"seed": self._seed, "command_delay_s": self.commands.delay_s, "commands_held": self.commands.held}
        )

    def publish_diagnostics(self) -> None:
        """Publish the ``aloha_sim: executor`` status on /diagnostics (any thread)."""
        try:
            self.pub.status(executor_status(self.summary(), self.failure), self.sim_now)
        except Exception:
            if self.context.ok() and not self._stop.is_set():
                raise


def main(args: list[str] | None = None) -> int:
    """Console script ``aloha_sim``: run until SIGINT or SIGTERM; returns the exit status (see
    module doc). A signal ends the spin loop, then the node is torn down and the context shut down,
    in that order (:mod:`oxygen_ros.ros.signals`)."""
    check_node_arguments("aloha_sim", __doc__.split("\n\n")[0], args)  # --help; a non-ROS argument: exit 2
    stop = init_without_signal_handlers(args)
    try:
        node = AlohaSimNode()
    except ParamError as exc:
        rclpy.logging.get_logger(NODE_NAME).error(str(exc))
        rclpy.try_shutdown()
        return 2
    except (ImportError, RuntimeError) as exc:
        rclpy.logging.get_logger(NODE_NAME).error(f"cannot start the simulation: {type(exc).__name__}: {exc}")
        rclpy.try_shutdown()
        return 1
    # Physics and rendering run in their own threads; callbacks are short. rclpy's
    # MultiThreadedExecutor busy-spins over its task list and starves those threads of the GIL.
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    node.start()
    try:
        while rclpy.ok() and not stop.is_set():
            executor.spin_once(timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.stop()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 1 if node.failure else 0


if __name__ == "__main__":
    sys.exit(main())
