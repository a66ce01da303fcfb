"""The ``oxygen`` lifecycle node: cameras + joint states in, action chunks + streamed text out.

Lifecycle (rclpy.lifecycle):

- *configure*: read and validate every parameter (a bad one fails the transition with a message
  naming it), load the model, allocate the engine's KV pool, create subscriptions and publishers;
- *activate*: start the inference thread (and the per-step command timer if ``action_rate_hz``);
- *deactivate*: stop them, drop buffered input, end the language requests in flight (their
  utterances say ``node deactivated``); *cleanup*: free the model and the KV pool.

With ``autostart`` (default) :func:`main` takes the node to *active* right away.

Threads: one executor (rclpy's C++ EventsExecutor where available, see :func:`make_executor`) runs the (short)
callbacks (callback groups: sensors, language
inputs, command timer, diagnostics timer, lifecycle services) and one inference thread runs the engine
(:mod:`oxygen_ros.ros.inference`). /diagnostics is published in every state.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.context import Context
from rclpy.executors import Executor, ExternalShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.timer import Timer
from rclpy.utilities import get_default_context

from oxygen_ros.ros.convert.stamps import StampBook
from oxygen_ros.ros.diagnostics import ERROR, WARN, FrameStats, ProblemLog, log_at
from oxygen_ros.ros.distro import events_executor
from oxygen_ros.ros.inference import InferenceWorker
from oxygen_ros.ros.inputs import InputHandler, decode_image
from oxygen_ros.ros.model_setup import action_space, assembler_config, load_policy
from oxygen_ros.ros.node_status import inference_status
from oxygen_ros.ros.outputs import Outputs
from oxygen_ros.ros.params.files import check_node_arguments
from oxygen_ros.ros.params.live import live_update
from oxygen_ros.ros.params.node_config import NodeConfig, declare_node_params, read_node_config
from oxygen_ros.ros.params.specs import ParamError
from oxygen_ros.ros.qos import qos_from_name
from oxygen_ros.ros.shadow import ShadowMonitor
from oxygen_ros.ros.signals import init_without_signal_handlers
from oxygen_ros.streams.observation import ObservationAssembler
from oxygen_ros.streams.text import Emit, ignored_notice

if TYPE_CHECKING:
    from oxygen_ros.core.engine.engine import Engine
    from oxygen_ros.core.policy import Pi05Policy

__all__ = ["OxygenNode", "main", "make_executor"]

SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE


class OxygenNode(LifecycleNode):
    """π0.5 VLA executor node (see module doc). ``kwargs`` go to ``LifecycleNode``."""

    def __init__(self, node_name: str = "oxygen", **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        declare_node_params(self)
        self.problems = ProblemLog()
        self.stats = FrameStats()
        self.cfg: NodeConfig | None = None
        self.configure_error = ""
        self.policy: Pi05Policy | None = None
        self.engine: Engine | None = None
        self.assembler: ObservationAssembler | None = None
        self.inputs: InputHandler | None = None
        self.outputs: Outputs | None = None
        self.worker: InferenceWorker | None = None
        self._command_timer: Timer | None = None
        self._command_group = MutuallyExclusiveCallbackGroup()
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        period = self.get_parameter("diagnostics_period_s").value
        if not isinstance(period, (int, float)) or not 0.05 <= period <= 60.0:
            period = 1.0  # an invalid value is reported at configure
        self._diag_timer = self.create_timer(
            float(period), self._publish_diagnostics, callback_group=MutuallyExclusiveCallbackGroup()
        )
        self.add_on_set_parameters_callback(self._on_set_parameters)  # live changes (params/live.py)

    @property
    def lifecycle_state(self) -> str:
        """rclpy's lifecycle state label (``unconfigured``, ``configuring``, ``inactive``, ``active``,
        ``finalized`` …). rclpy's ``LifecycleNode`` keeps it in its state machine and offers no
        getter; its own transitions read ``_state_machine.current_state`` the same way."""
        return self._state_machine.current_state[1]

    # ------------------------------------------------------------------ helpers
    def report(self, kind: str, message: str, level: int = WARN) -> None:
        """Count a problem for /diagnostics; log it the first time its kind occurs."""
        if self.problems.report(kind, message, time.monotonic(), level):
            log_at(self.get_logger(), level, f"{kind}: {message}")

    def _on_set_parameters(self, params: list[Parameter[Any]]) -> SetParametersResult:
        """A parameter change (``ros2 param set``, ``oxygen params set``): in *unconfigured* every
        value is accepted (read at configure); a configured node applies live ones from the next
        frame and refuses the others with how to apply them (:mod:`oxygen_ros.ros.params.live`)."""
        if self.lifecycle_state not in ("inactive", "active") or self.engine is None:
            return SetParametersResult(successful=True)
        try:
            reason = self._apply_live({p.name: p.value for p in params})
        except Exception as exc:  # racing a transition: refuse, never raise into rclpy
            reason = f"not applied: {type(exc).__name__}: {exc}"
        if reason:
            self.get_logger().warning(f"parameter change refused: {reason}")
        else:
            self.get_logger().info("applied live: " + ", ".join(f"{p.name}={p.value!r}" for p in params))
        return SetParametersResult(successful=not reason, reason=reason)

    def _apply_live(self, params: dict[str, object]) -> str:
        """Check ``params`` (:func:`~oxygen_ros.ros.params.live.live_update`) and hand the new
        configuration to the engine and to each part's ``reconfigure``; all or none. Returns
        ``''`` when applied, else the reason every one was refused. Raises when a part is missing
        (a transition racing): the caller refuses the change."""
        cfg, engine, assembler = self.cfg, self.engine, self.assembler
        worker, outputs, inputs = self.worker, self.outputs, self.inputs
        if cfg is None or engine is None or assembler is None or worker is None or outputs is None or inputs is None:
            raise RuntimeError("the node is not configured")
        update = live_update(
            cfg,
            engine.cfg,
            engine.rtc,
            lambda n: self.get_parameter(n).value if self.has_parameter(n) else None,
            params,
            self.lifecycle_state,
        )
        if update is None or isinstance(update, str):
            return update or ""
        new = update.cfg
        engine.reconfigure(update.engine, update.rtc)
        assembler.reconfigure(
            assembler_config(new, assembler.cfg.slots),
            new.instruction if "instruction" in update.changed else None,
        )
        worker.reconfigure(new)
        outputs.reconfigure(new)
        inputs.reconfigure(new)
        if new.diagnostics_period_s != cfg.diagnostics_period_s:
            self.set_diagnostics_period(new.diagnostics_period_s)
        self.cfg = new
        return ""

    def _camera_silence(self) -> float | None:
        """Seconds since the newest camera image when every camera is stale (input liveness,
        ``input_timeout_s``), else None."""
        inputs, cfg = self.inputs, self.cfg
        if inputs is None or cfg is None:
            return None
        ages = [a for n, a in inputs.liveness(time.monotonic()).ages.items() if n.startswith("camera ")]
        if not ages or any(a is not None and a <= cfg.input_timeout_s for a in ages):
            return None
        return min((a for a in ages if a is not None), default=0.0)

    def set_diagnostics_period(self, period_s: float) -> None:
        """Publish ``/diagnostics`` every ``period_s`` seconds from now on."""
        self._diag_timer.timer_period_ns = int(period_s * 1e9)
        self._diag_timer.reset()

    def _ignore_ask(self, task: str, text: str, reason: str) -> None:
        """Answer an ask the node does not take (not active) on the task's text topic."""
        outputs = self.outputs
        if outputs is not None and task in outputs.texts:
            outputs.publish_text(task, [Emit("text", ignored_notice(text, reason), 0)])

    def _on_time_jump(self) -> None:
        if self.outputs is not None:
            self.outputs.command_stream.clear()

    # ------------------------------------------------------------------ lifecycle
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Validate parameters, load the model, allocate the KV pool, create pubs/subs."""
        try:
            cfg = read_node_config(self)
        except ParamError as exc:
            return self._fail_configure(str(exc))
        try:
            self._load(cfg)
        except Exception as exc:  # model files, CUDA, sizes: report instead of crashing
            self._release()
            return self._fail_configure(f"{type(exc).__name__}: {exc}")
        policy, engine = self.policy, self.engine
        assert policy is not None and engine is not None  # _load sets both or raises
        self.cfg, self.configure_error = cfg, ""
        for note in cfg.notes:
            self.get_logger().warning(note)
        if self._diag_timer.timer_period_ns != int(cfg.diagnostics_period_s * 1e9):  # set while unconfigured
            self.set_diagnostics_period(cfg.diagnostics_period_s)
        self.get_logger().info(
            f"configured: model {cfg.model!r} on {policy.model.device} "
            f"({policy.model.dtype}{', weights ' + cfg.weights if cfg.weights else ''}), "
            f"cameras {sorted(cfg.cameras)}, "
            f"{len(cfg.joint_names)} joints, KV pool {engine.pool.blocks.num_blocks} blocks"
        )
        return SUCCESS

    def _fail_configure(self, message: str) -> TransitionCallbackReturn:
        self.configure_error = message
        self.get_logger().error(f"configure failed: {message}")
        return FAILURE

    def _load(self, cfg: NodeConfig) -> None:
        from oxygen_ros.core.loops.schedules import make_engine
        from oxygen_ros.core.robot_io import RobotFrames

        frames = RobotFrames(action_space(cfg))  # a parameter/checkpoint mismatch fails configure here
        self.policy = policy = load_policy(cfg)
        slots = tuple(policy.cfg.image_slots)
        self.engine = engine = make_engine(
            policy,
            cfg.engine,
            rtc=cfg.rtc,
            rtc_relative=(frames.space.delta, frames.space.anchor),  # delta spaces
            stamp_clock=lambda: self.get_clock().now().nanoseconds * 1e-9,
        )  # stamp → chunk
        self.get_logger().info(engine.pool_plan.describe())
        engine.warmup()
        # every endpoint and part of the configured node, created here with what it needs
        self.cfg = cfg
        self.assembler = assembler = ObservationAssembler(
            assembler_config(cfg, slots), decode_image, instruction=cfg.instruction
        )
        stamps = StampBook()  # input header stamps, reused bit for bit on the outputs
        shadow = None
        if cfg.shadow.enabled and cfg.shadow.operator_topic:
            shadow = ShadowMonitor(
                self, cfg.shadow, cfg.joint_names, cfg.control_period_s, qos_from_name(cfg.shadow_operator_qos)
            )
        self.outputs = outputs = Outputs(
            self, cfg, slots, policy.cfg.vision.image_size, self.report, stamp_of=stamps.exact, shadow=shadow
        )
        self.worker = worker = InferenceWorker(
            engine,
            assembler,
            outputs,
            self.stats,
            self.report,
            self.get_logger(),
            cfg.camera_sync_s,
            frames=frames,
            text_header=cfg.text_header,
            camera_silence=self._camera_silence,
        )
        self.inputs = InputHandler(
            self,
            cfg,
            assembler,
            worker.ask,
            self.problems,
            time.monotonic,
            self._on_time_jump,
            self._ignore_ask,
            stamps=stamps,
        )

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start the inference thread, the command timer and input processing."""
        ret = super().on_activate(state)  # enables the lifecycle publishers
        cfg, worker, inputs = self.cfg, self.worker, self.inputs
        assert cfg is not None and worker is not None and inputs is not None  # activate follows a configure
        if cfg.action_rate_hz > 0:
            self._command_timer = self.create_timer(
                1.0 / cfg.action_rate_hz, self._command_tick, callback_group=self._command_group
            )
        worker.start()
        inputs.activate()
        self.get_logger().info(f"active, ready: {inputs.describe()}")
        return ret

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop input processing, the command timer and the inference thread; end every language
        request still in flight (cancelled, its utterance says ``node deactivated``)."""
        self._stop_activity()
        if self.worker is not None and not self.worker.alive:
            ended = self.worker.end_requests("node deactivated")
            if ended:
                self.get_logger().info(f"deactivated: {ended} language requests ended (cancelled)")
            if self.engine is not None:  # (set with the worker)
                self.engine.reset_chunks("reset")  # the next chunk after activation follows nothing
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Destroy pubs/subs, cancel every request, free the model and the KV pool."""
        self._release()
        return SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop everything and free memory."""
        self.teardown()
        return SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Free everything; back to *unconfigured*."""
        self.teardown()
        return SUCCESS

    def shut_down(self, reason: str = "node shutting down", wait_s: float = 1.5) -> int:
        """Before the process exits (SIGINT / SIGTERM, :func:`main`): stop taking input, stop the
        inference thread (waiting up to ``wait_s`` seconds for its frame) and end every language
        request in flight with ``[request N cancelled: <reason>]`` on its text topics, while the
        publishers still exist. A frame still running after ``wait_s`` is left to end with the
        process; its requests' utterances are ended without the engine. Returns how many ended."""
        if self.inputs is not None:
            self.inputs.active = False
        worker = self.worker
        if worker is None or self.outputs is None:
            return 0
        if worker.stop(wait_s):
            return worker.end_requests(reason)
        return worker.abandon(reason, "cancelled")

    def _stop_activity(self, wait_s: float = 30.0) -> None:
        if self.inputs is not None:
            self.inputs.active = False
        if self._command_timer is not None:
            self.destroy_timer(self._command_timer)
            self._command_timer = None
        if self.worker is not None and not self.worker.stop(wait_s):
            self.get_logger().error(f"inference thread did not stop within {wait_s:g} s")
        if self.assembler is not None:
            self.assembler.clear()
        if self.outputs is not None:
            self.outputs.command_stream.clear()

    def _release(self, wait_s: float = 30.0) -> None:
        self._stop_activity(wait_s)
        if self.inputs is not None:
            self.inputs.destroy()
        if self.outputs is not None:
            self.outputs.destroy()
        if self.engine is not None and not (self.worker is not None and self.worker.alive):
            self.engine.close()  # (a frame still running at exit keeps its engine until the process ends)
        device = getattr(getattr(self.policy, "model", None), "device", None)
        self.policy = self.engine = self.assembler = None
        self.inputs = self.outputs = self.worker = None
        gc.collect()
        if device is not None and device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def teardown(self, wait_s: float = 30.0) -> None:
        """Stop the inference thread (waiting up to ``wait_s`` seconds for its frame) and free
        everything (idempotent; safe after rclpy shutdown)."""
        self._release(wait_s)

    def destroy_node(self) -> None:
        """Destroy the node's endpoints and its lifecycle state machine.

        rclpy's ``LifecycleNode.destroy_node`` leaves the state machine (its ``~/transition_event``
        publisher) to the garbage collector, and the state machine keeps the node handle, and so
        the DDS participant, alive. A process that then exits without the interpreter's
        finalization (:func:`main`) never deletes its participant: every peer kept a ghost
        ``/oxygen`` with only that publisher for the DDS lease (about 20 s), beside a restarted node
        of the same name.
        """
        super().destroy_node()
        self._state_machine.destroy_when_not_in_use()

    # ------------------------------------------------------------------ timers
    def _command_tick(self) -> None:
        outputs = self.outputs
        if outputs is None or self.lifecycle_state != "active":
            return
        try:
            if outputs.publish_command(self.get_clock().now().nanoseconds * 1e-9):
                self.stats.record_command(time.monotonic())
        except Exception as exc:  # racing a transition: never let a timer kill the executor
            self.report("command_error", f"{type(exc).__name__}: {exc}", ERROR)

    def _publish_diagnostics(self) -> None:
        try:
            msg = DiagnosticArray()
            msg.header.stamp = self.get_clock().now().to_msg()
            msg.status = [inference_status(self, time.monotonic())]
            self._diag_pub.publish(msg)
        except Exception as exc:  # e.g. racing a cleanup; the next period reports again
            self.get_logger().debug(f"diagnostics skipped: {type(exc).__name__}: {exc}")


def make_executor(context: Context | None = None) -> tuple[Executor, str]:
    """The node's executor: rclpy's C++ ``EventsExecutor`` where rclpy has it (Jazzy 7.1, Kilted;
    :func:`oxygen_ros.ros.distro.events_executor`),
    else the ``SingleThreadedExecutor``; returns ``(executor, kind)``.

    Why (issue 14): the executor thread and the inference thread share one interpreter (one GIL).
    The Python ``SingleThreadedExecutor`` rebuilds its wait set and runs a Python task for every
    message — ≈0.3–0.5 ms of GIL per message, so ``/joint_states`` at 1 kHz costs the inference
    thread about half of its interpreter time. The ``EventsExecutor`` waits and dispatches in C++
    and holds the GIL only for the message conversion and our (short) callback.
    ``OXYGEN_EXECUTOR=single`` in the environment forces the ``SingleThreadedExecutor`` (for
    comparison in the ingress benchmark).
    """
    events = events_executor()
    if events is None or os.environ.get("OXYGEN_EXECUTOR", "") == "single":
        return SingleThreadedExecutor(context=context), "SingleThreadedExecutor"
    return events(context=context), "EventsExecutor"


def main(args: list[str] | None = None) -> NoReturn:
    """Console script ``oxygen_node``: run the node until SIGINT or SIGTERM, then exit the process
    with status 0 (it does not return).

    On a signal the node answers before it goes: every language request in flight ends with
    ``[request N cancelled: node shutting down]`` on its text topics (:meth:`OxygenNode.shut_down`),
    then the node is torn down and the process exits without the interpreter's slow finalization —
    within about 2 s, also while a frame runs (``ros2 launch`` escalates to SIGTERM after 5 s). rclpy's own signal
    handlers are not installed (:mod:`oxygen_ros.ros.signals`): they would shut the context down
    first, and nothing could be published any more.
    """
    check_node_arguments("oxygen_node", __doc__.split("\n\n")[0], args)  # --help; a non-ROS argument: exit 2
    stop = init_without_signal_handlers(args)
    # The inference thread issues hundreds of short torch calls per frame, each needing the GIL;
    # with the default 5 ms switch interval a busy executor thread (a topic flood) makes it wait
    # up to 5 ms per call. A short interval keeps the action path responsive.
    sys.setswitchinterval(0.00005)
    node = OxygenNode()
    # One executor thread: every callback is short (inference has its own thread). rclpy's
    # MultiThreadedExecutor busy-spins over its task list and starves the inference thread of the GIL.
    executor, kind = make_executor()
    executor.add_node(node)
    node.get_logger().info(f"executor: {kind}")
    try:
        if node.get_parameter("autostart").value is not False:
            if node.trigger_configure() == SUCCESS and not stop.is_set():
                node.trigger_activate()
        while rclpy.ok() and not stop.is_set():  # EventsExecutor.spin() of rclpy 9.1.2 dispatches nothing
            executor.spin_once(timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        try:
            ended = node.shut_down()
            if ended:
                node.get_logger().info(f"shutting down: {ended} language requests ended (cancelled)")
        finally:
            node.teardown(wait_s=0.5)
            executor.shutdown(timeout_sec=0.5)
            node.destroy_node()
            rclpy.try_shutdown()
            # the DDS participant is deleted with the context, not at its shutdown: without this,
            # peers see a ghost of the node until the participant's lease runs out (~20 s)
            get_default_context().destroy()
    # Everything is said and released, the ROS context is gone. What is left is the
    # interpreter's own finalization — tearing down torch and its modules takes 1.5-3 s on a busy
    # robot computer, and `ros2 launch` escalates to SIGTERM 5 s after its SIGINT: skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
