"""Subscriptions of the ``oxygen`` node: cameras, joint states, instruction, language asks.

Every callback is short and never waits for inference: images are stored undecoded in the
:class:`~oxygen_ros.streams.observation.ObservationAssembler` (decoded later, only when used), joint states
arrive as serialized bytes (``raw=True``; ``/joint_states`` runs at the controller rate, up to
1 kHz) and are read by :class:`~oxygen_ros.ros.convert.JointStateDecoder` (no Python message is
built), picked by name and buffered; asks go to ``submit_ask`` (the inference worker's
:meth:`~oxygen_ros.ros.inference.InferenceWorker.ask`: queued in the engine, utterance reserved). Every joint state
is counted
by outcome (``joint_state_counts``: received = accepted + bad + out of order + while inactive).
Bad input is counted and reported in the :class:`~oxygen_ros.ros.diagnostics.ProblemLog` (logged
once per kind), never raised. Work is bounded before it is done: an image's size is read from the
message or its PNG/JPEG header and checked against ``max_image_pixels`` before it is stored (it is
decoded later, on the inference thread, only if a frame uses it); an instruction longer than
``max_instruction_chars`` is refused here; an ask's length is checked by the engine's submit
(``engine.max_request_chars``) before any formatting or tokenization, and an ask taken while the
node is not active is answered at once with a notice on its task's text topic.

Input liveness (:class:`~oxygen_ros.streams.liveness.InputWatch`): while active, every camera and
joint-state message stores its arrival time (monotonic); a small timer (period
``min(0.25, input_timeout_s / 4)`` s) logs ONE warning when an input goes stale (nothing for more
than ``input_timeout_s``), ONE info line when it resumes, and once per activation a warning for
each input that has sent nothing ``2 * input_timeout_s`` after activation. ``/diagnostics`` reads
the same state (:meth:`InputHandler.liveness`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.timer import Timer
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String

from oxygen_ros.ros.convert import (
    ImageConversionError,
    JointStateDecoder,
    JointStateError,
    StampBook,
    compressed_to_rgb,
    image_size,
    image_to_rgb,
)
from oxygen_ros.ros.diagnostics import WARN, ProblemLog
from oxygen_ros.ros.params.node_config import NodeConfig
from oxygen_ros.ros.qos import qos_from_name
from oxygen_ros.streams.liveness import InputWatch, Liveness
from oxygen_ros.streams.observation import ObservationAssembler, Verdict

__all__ = ["JOINT_STATES", "decode_image", "InputHandler"]

#: Name of the joint-state input in liveness messages and ``/diagnostics`` keys (cameras: ``camera <slot>``).
JOINT_STATES = "joint_states"


def decode_image(msg: Image | CompressedImage) -> np.ndarray:
    """uint8 ``[H, W, 3]`` RGB of a raw or compressed image message.

    Raises:
        ImageConversionError: unsupported encoding/format, bad size or corrupt payload.
    """
    if isinstance(msg, CompressedImage):
        return compressed_to_rgb(msg)
    return image_to_rgb(msg)


class InputHandler:
    """Creates the node's subscriptions and feeds the assembler and the engine.

    Args:
        node: the lifecycle node (subscriptions are created on it).
        cfg: the validated configuration.
        assembler: receives images, joint states and the instruction.
        submit_ask: ``(task, text) -> request id`` for a language ask (raises ``KeyError`` /
            ``ValueError`` for a bad one).
        ignore_ask: ``(task, text, reason)`` answers an ask the node does not take (while inactive)
            with a notice on the task's text topic.
        problems: where bad input is counted.
        now: monotonic seconds (for the problem log).
        on_time_jump: called (from a callback thread) when input time jumps backwards.
        stamps: remembers the exact header stamps of the inputs (shared with the outputs, which
            stamp what they publish with them).
    """

    def __init__(
        self,
        node: Node,
        cfg: NodeConfig,
        assembler: ObservationAssembler,
        submit_ask: Callable[[str, str], int],
        problems: ProblemLog,
        now: Callable[[], float],
        on_time_jump: Callable[[], None],
        ignore_ask: Callable[[str, str, str], None] = lambda task, text, reason: None,
        stamps: StampBook | None = None,
    ) -> None:
        self._node, self._cfg, self._asm, self._submit_ask = node, cfg, assembler, submit_ask
        self._ignore_ask = ignore_ask
        self._problems, self._now, self._on_time_jump = problems, now, on_time_jump
        self.active = False
        self.asks = 0
        self.joint_state_counts = dict.fromkeys(("received", "accepted", "bad", "out_of_order", "inactive"), 0)
        self._joints = JointStateDecoder(cfg.state_joint_names or cfg.joint_names)
        self.ignored_inactive = 0
        self.dropped_images = 0  # refused before decoding: not PNG/JPEG, malformed header, too large
        self.refused_instructions = 0
        self.instructions = 0  # accepted from instruction_topic
        self.zero_stamps = 0
        self.stamps = StampBook() if stamps is None else stamps
        self._subs: list[Any] = []
        self.topics: dict[str, str] = {}  # input name (liveness) -> resolved topic
        self.ask_topics: dict[str, str] = {}  # task -> resolved ask topic
        sensors = MutuallyExclusiveCallbackGroup()
        language = MutuallyExclusiveCallbackGroup()
        cam_qos = qos_from_name(cfg.camera_qos)
        for slot, (topic, kind) in cfg.cameras.items():
            msg_type = CompressedImage if kind == "compressed" else Image
            name = f"camera {slot}"
            self._subs.append(
                node.create_subscription(
                    msg_type, topic, lambda m, s=slot, n=name: self._on_image(s, n, m), cam_qos, callback_group=sensors
                )
            )
            self.topics[name] = self._subs[-1].topic_name
        self._subs.append(
            node.create_subscription(
                JointState,
                cfg.joint_state_topic,
                self._on_joint_state,
                qos_from_name(cfg.joint_state_qos),
                callback_group=sensors,
                raw=True,
            )
        )
        self.topics[JOINT_STATES] = self._subs[-1].topic_name
        self._subs.append(
            node.create_subscription(
                String,
                cfg.instruction_topic,
                self._on_instruction,
                qos_from_name(cfg.instruction_qos),
                callback_group=language,
            )
        )
        for task, topics in cfg.task_topics.items():
            if topics.ask:
                self._subs.append(
                    node.create_subscription(
                        String,
                        topics.ask,
                        lambda m, t=task: self._on_ask(t, m),
                        qos_from_name(cfg.ask_qos),
                        callback_group=language,
                    )
                )
                self.ask_topics[task] = self._subs[-1].topic_name
        self.watch = InputWatch(list(self.topics), cfg.input_timeout_s)
        self._arrived = self.watch.last  # the callbacks' one store per message
        self._watch_timer: Timer | None = node.create_timer(
            min(0.25, cfg.input_timeout_s / 4), self._check_inputs, callback_group=sensors
        )

    def destroy(self) -> None:
        """Destroy every subscription and the liveness timer."""
        self.active = False
        for sub in self._subs:
            self._node.destroy_subscription(sub)
        self._subs.clear()
        if self._watch_timer is not None:
            self._node.destroy_timer(self._watch_timer)
            self._watch_timer = None

    def reconfigure(self, cfg: NodeConfig) -> None:
        """Take the node's live parameters (``input_timeout_s`` and ``time_jump_s`` in messages; the
        assembler holds the rest): the stale threshold, its grace period and the check period."""
        self._cfg = cfg
        self.watch.timeout_s, self.watch.grace_s = cfg.input_timeout_s, 2.0 * cfg.input_timeout_s
        if self._watch_timer is not None:
            self._watch_timer.timer_period_ns = int(min(0.25, cfg.input_timeout_s / 4) * 1e9)
            self._watch_timer.reset()

    def activate(self) -> None:
        """Start taking input (at activation); the liveness watch starts from now."""
        self.watch.start(self._now())
        self.active = True

    def describe(self) -> str:
        """One line: the cameras (slot and topic), the joint-state topic and the ask topics."""
        cams = ", ".join(f"{n[len('camera ') :]} {t}" for n, t in self.topics.items() if n != JOINT_STATES)
        asks = ", ".join(f"{t} ({task})" for task, t in self.ask_topics.items()) or "none"
        return f"cameras {cams}; joint states {self.topics[JOINT_STATES]}; asks {asks}"

    def liveness(self, now: float) -> Liveness:
        """The inputs' liveness at ``now`` (monotonic seconds); empty while not active."""
        return self.watch.state(now) if self.active else Liveness()

    def _check_inputs(self) -> None:
        """Liveness timer: log each input's transitions once (stale, resumed, silent since activation)."""
        if not self.active:
            return
        log = self._node.get_logger()
        for c in self.watch.check(self._now()):
            where = f"{c.name} on {self.topics[c.name]}"
            if c.kind == "stale":
                log.warning(
                    f"input stale: {where} has sent nothing for {c.seconds:.1f} s "
                    f"(input_timeout_s {self._cfg.input_timeout_s:g}); /diagnostics warns until it resumes"
                )
            elif c.kind == "resumed":
                log.info(f"input resumed: {where} (silent for about {c.seconds:.1f} s)")
            else:
                tail = (
                    "its slot is masked"
                    if c.name != JOINT_STATES
                    else "no observation can be assembled without joint states"
                )
                log.warning(f"{where} has sent nothing since activation ({c.seconds:.1f} s); {tail}")

    # ------------------------------------------------------------------ helpers
    def _node_state(self) -> str:
        state = getattr(self._node, "lifecycle_state", "")
        return state if state and state != "active" else "not active"

    def _report(self, kind: str, message: str, level: int = WARN) -> None:
        if self._problems.report(kind, message, self._now(), level):
            self._node.get_logger().warning(f"{kind}: {message} (further ones are only counted)")

    def _stamp(self, msg: Any, what: str) -> float:
        return self._stamp_parts(msg.header.stamp.sec, msg.header.stamp.nanosec, what)

    def _stamp_parts(self, sec: int, nanosec: int, what: str) -> float:
        stamp = self.stamps.remember_parts(sec, nanosec)
        if stamp == 0.0:  # publisher without stamps: use the receive time on the node's clock
            self.zero_stamps += 1
            self._report("zero_stamp", f"{what} has no header stamp; using the receive time")
            stamp = self._node.get_clock().now().nanoseconds * 1e-9
        return stamp

    def _verdict(self, verdict: Verdict, what: str, stamp: float) -> None:
        if verdict is Verdict.OUT_OF_ORDER:
            self._report("out_of_order", f"{what}: message stamped {stamp:.3f} is older than the newest one; dropped")
        elif verdict is Verdict.TIME_JUMP:
            self._report(
                "time_jump",
                f"{what}: stamp {stamp:.3f} jumped backwards by more than "
                f"{self._cfg.time_jump_s:g} s; input buffers cleared",
            )
            self._on_time_jump()

    # ------------------------------------------------------------------ callbacks
    def _on_image(self, slot: str, name: str, msg: Image | CompressedImage) -> None:
        if not self.active:
            self.ignored_inactive += 1
            return
        self._arrived[name] = self._now()
        try:  # the size from the message or the PNG/JPEG header: nothing is decoded here
            width, height = image_size(msg)
        except ImageConversionError as exc:
            self.dropped_images += 1
            self._report("bad_image", f"camera {slot}: {exc}; image dropped")
            return
        if width * height > self._cfg.max_image_pixels:
            self.dropped_images += 1
            self._report(
                "image_too_large",
                f"camera {slot}: {width}x{height} = {width * height} pixels is more "
                f"than max_image_pixels = {self._cfg.max_image_pixels}; image dropped undecoded",
            )
            return
        stamp = self._stamp(msg, f"camera {slot}")
        self._verdict(self._asm.add_image(slot, stamp, msg), f"camera {slot}", stamp)

    def _on_joint_state(self, data: bytes) -> None:
        counts = self.joint_state_counts
        counts["received"] += 1
        if not self.active:
            counts["inactive"] += 1
            self.ignored_inactive += 1
            return
        self._arrived[JOINT_STATES] = self._now()
        try:
            sec, nanosec, state = self._joints.decode(data)
        except JointStateError as exc:
            counts["bad"] += 1
            self._report("bad_joint_state", f"{exc}; message dropped")
            return
        stamp = self._stamp_parts(sec, nanosec, "joint state")
        verdict = self._asm.add_state(stamp, state)
        counts["out_of_order" if verdict is Verdict.OUT_OF_ORDER else "accepted"] += 1
        self._verdict(verdict, "joint state", stamp)

    def _on_instruction(self, msg: String) -> None:
        if len(msg.data) > self._cfg.max_instruction_chars:
            self.refused_instructions += 1
            self._report(
                "instruction_too_long",
                f"instruction of {len(msg.data)} characters refused (more than "
                f"max_instruction_chars = {self._cfg.max_instruction_chars}); the previous one stays",
            )
            return
        self._asm.set_instruction(msg.data)
        self.instructions += 1

    def _on_ask(self, task: str, msg: String) -> None:
        if not self.active:
            self.ignored_inactive += 1
            self._report("ask_ignored", f"{task} ask ignored: node not active (answered with a notice)")
            self._ignore_ask(
                task, msg.data, f"the node is {self._node_state()}; asks are answered only while it is active"
            )
            return
        try:
            self._submit_ask(task, msg.data)
            self.asks += 1
        except (KeyError, ValueError) as exc:
            self._report("bad_ask", f"{task} ask rejected: {exc}")
