"""The replay's stand-in for the ``oxygen`` node: bag messages in, engine frames, outputs recorded.

:class:`NodeSim` is fed raw bag messages (``feed``) and runs frames (``frame``) with the node's
own pieces: ``rclpy.serialization`` turns the CDR bytes into the message objects a subscription
would deliver, ``oxygen_ros.ros.inputs.decode_image`` and ``oxygen_ros.ros.convert`` convert them, the
:class:`~oxygen_ros.streams.observation.ObservationAssembler` builds observations with the node's
settings, :class:`~oxygen_ros.core.robot_io.RobotFrames` applies the action space, the engine runs
the frame, ``command_messages`` and ``Utterances`` build the published messages. Bad input is counted in
``stats.drops``, never raised.

Chunk switches (:class:`~oxygen_ros.streams.switches.ChunkSwitches`, on the published values:
robot command units): a chunk becomes available its latency after its observation stamp (wall
seconds from the observation's arrival to the chunk, times ``rate``: the playback rate with
recorded timing) and takes over from the previous one at its first point due at or after then.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
from rclpy.serialization import deserialize_message
from std_msgs.msg import String

from oxygen_ros.bags.reader import msg_class
from oxygen_ros.bags.writer import BagOutput
from oxygen_ros.core.action_space import ActionSpace
from oxygen_ros.core.engine.engine import Engine
from oxygen_ros.core.engine.requests import RequestResult, RequestStatus
from oxygen_ros.core.robot_io import RobotFrames
from oxygen_ros.core.types import ActionChunk, Observation, TextDelta
from oxygen_ros.replay.console import Console
from oxygen_ros.replay.prepare import TopicMap, resolve_topic
from oxygen_ros.replay.report import FrameRecord, ReplayStats, RequestRecord
from oxygen_ros.ros.convert import JointStateError, StampBook, command_messages, joint_state_to_vector, primary_values
from oxygen_ros.ros.inputs import decode_image
from oxygen_ros.ros.model_setup import assembler_config
from oxygen_ros.ros.params.node_config import NodeConfig
from oxygen_ros.streams.observation import ObservationAssembler, Verdict
from oxygen_ros.streams.switches import ChunkSwitches
from oxygen_ros.streams.text import Utterances

__all__ = ["NodeSim"]


def _short(reason: str) -> str:
    return re.sub(r"\s*\(.*\)$", "", reason)


class NodeSim:
    """Node inputs and outputs around one engine (see module doc).

    Args:
        cfg: node configuration; topics: its resolved topics; engine: the engine to drive.
        types: topic -> bag message type (``pkg/msg/Name``) of every topic that will be fed.
        start_ns: bag start (log time) — the zero of the bag clock.
        writer: output bag (None: nothing written); console: terminal output.
        reference_topic: a JointState topic recorded for the trajectory plot and the action
            accuracy (e.g. commands); reference_joints: its joint names when its messages have none.
        rate: bag seconds per wall second of a chunk's latency (the playback rate; 1 = fast timing).
        stats: where frames, requests and drops are recorded.
        now: wall clock (seconds).
    """

    def __init__(
        self,
        cfg: NodeConfig,
        topics: TopicMap,
        engine: Engine,
        types: dict[str, str],
        start_ns: int,
        writer: BagOutput | None,
        console: Console,
        stats: ReplayStats,
        reference_topic: str | None = None,
        now: Callable[[], float] = time.perf_counter,
        rate: float = 1.0,
        reference_joints: tuple[str, ...] = (),
    ) -> None:
        self.cfg, self.topics, self.engine, self.writer = cfg, topics, engine, writer
        self.console, self.stats, self.start_ns, self.now = console, stats, start_ns, now
        self.reference_topic, self.reference_joints = reference_topic, tuple(reference_joints)
        self.reference_note: str | None = None  # why there is no reference topic (set by the replay)
        self.classes = {t: msg_class(m) for t, m in types.items()}
        self.asm = ObservationAssembler(
            assembler_config(cfg, tuple(engine.policy.cfg.image_slots)), decode_image, instruction=cfg.instruction
        )
        self.utterances = Utterances([t.name for t in engine.cfg.tasks], cfg.text_header)
        self._state_names = self.state_names = cfg.state_joint_names or cfg.joint_names
        self.frames = RobotFrames(ActionSpace(cfg.action_space, cfg.joint_names, self._state_names))
        engine.handover.relative_to_state(self.frames.space.delta, self.frames.space.anchor)  # RTC, delta spaces
        self.position_topic = resolve_topic(cfg.position_action_topic)
        self.t0 = now()
        self.bag_now_ns = start_ns  # bag clock: log time of the newest fed message
        self.times: dict[str, list[float]] = {t: [] for t in (*topics.cameras, topics.joint_state)}
        self.states: list[tuple[float, np.ndarray]] = []
        self.reference: list[tuple[float, np.ndarray]] = []  # in joint_names order (the plot)
        self.reference_samples: list[tuple[float, list[str], np.ndarray]] = []  # (stamp, names, positions)
        self.position_chunks = True  # every chunk in self.chunks is joint positions of joint_names
        self.chunks: list[ActionChunk] = []
        self.texts: list[tuple[str, int, str]] = []
        self.available: OrderedDict[float, float] = OrderedDict()  # input stamp -> wall arrival
        self.stamps = StampBook()
        self._asks: dict[int, str] = {}
        self._n_asks = 0
        self._obs_frames = 0
        self.warmup = 1
        self.rate = rate
        self.switches = ChunkSwitches(cfg.control_period_s)

    # ------------------------------------------------------------------ inputs
    def bag_time(self, log_ns: int | None = None) -> float:
        """Seconds since the bag start on the bag clock."""
        return ((self.bag_now_ns if log_ns is None else log_ns) - self.start_ns) / 1e9

    def _stamp(self, msg: Any, log_ns: int) -> float:
        stamp = self.stamps.remember(msg.header.stamp)
        if stamp == 0.0:  # as the node: no header stamp -> receive time (here: the log time)
            self.stats.drops["zero stamps (log time used)"] += 1
            stamp = log_ns / 1e9
        return stamp

    def _verdict(self, verdict: Verdict, what: str) -> None:
        if verdict is Verdict.OUT_OF_ORDER:
            self.stats.drops[f"out of order ({what})"] += 1
        elif verdict is Verdict.TIME_JUMP:
            self.stats.drops["backwards time jumps (buffers cleared)"] += 1
            self.console.line(f"[{self.bag_time():6.2f} s] {what}: time jumped backwards; input buffers cleared")

    def feed(self, topic: str, log_ns: int, raw: bytes, arrival: float | None = None) -> str | None:
        """Deliver one bag message as a subscription callback would.

        Returns:
            The image slot when a camera image was accepted (it may trigger a frame), else None.
        """
        self.bag_now_ns = max(self.bag_now_ns, log_ns)
        arrival = self.now() if arrival is None else arrival
        try:
            msg: Any = deserialize_message(raw, self.classes[topic])
        except Exception:  # noqa: BLE001 - rmw raises RuntimeError subclasses for bad CDR
            self.stats.drops[f"undecodable messages on {topic}"] += 1
            return None
        t = self.bag_time(log_ns)
        if topic in self.topics.cameras:
            slot = self.topics.cameras[topic][0]
            stamp = self._stamp(msg, log_ns)
            verdict = self.asm.add_image(slot, stamp, msg)
            self._verdict(verdict, f"camera {slot}")
            self.times[topic].append(t)
            self._arrived(stamp, arrival)
            return None if verdict is Verdict.OUT_OF_ORDER else slot
        if topic == self.reference_topic:
            self._reference(msg, log_ns)
            if topic != self.topics.joint_state:
                return None
        if topic == self.topics.joint_state:
            try:
                vec = joint_state_to_vector(msg, self._state_names)
            except JointStateError as exc:
                self.stats.drops[f"bad joint states on {topic}"] += 1
                if self.stats.drops[f"bad joint states on {topic}"] == 1:
                    self.console.line(f"[{t:6.2f} s] {topic}: {exc}; message dropped")
                return None
            stamp = self._stamp(msg, log_ns)
            self.times[topic].append(t)
            self.states.append((stamp, vec))
            self._verdict(self.asm.add_state(stamp, vec), "joint state")
            self._arrived(stamp, arrival)
        if topic == self.topics.instruction:
            self.asm.set_instruction(msg.data)
        for task in self.topics.asks.get(topic, ()):
            self._ask(task, msg.data, t)
        return None

    def _reference(self, msg: Any, log_ns: int) -> None:
        """Keep a reference message as (stamp, names, positions); in the plot's list when it
        has every joint (names from ``reference_joints`` when the message has none)."""
        names = list(msg.name) or list(self.reference_joints)
        pos = np.asarray(msg.position, dtype=np.float64)
        stamp = self._stamp(msg, log_ns)
        self.reference_samples.append((stamp, names, pos))
        index = {n: i for i, n in reversed(list(enumerate(names))) if i < pos.shape[0]}
        if all(n in index for n in self.cfg.joint_names):
            self.reference.append((stamp, pos[[index[n] for n in self.cfg.joint_names]]))

    def _arrived(self, stamp: float, wall: float) -> None:
        self.available.setdefault(stamp, wall)
        while len(self.available) > 512:
            self.available.popitem(last=False)

    def _ask(self, task: str, text: str, t: float) -> None:
        tc = self.engine.cfg.task(task)
        seed = None
        if tc.temperature > 0:  # reproducible sampling: one seed per ask (periodic requests
            # sample from the global RNG, seeded with engine.seed: keep the streams apart)
            seed = ((self.engine.cfg.seed + 1) * 1_000_003 + self._n_asks) & 0x7FFF_FFFF
        self._n_asks += 1
        try:
            rid = self.utterances.submit(task, text, lambda: self.engine.submit_request(task, text=text, seed=seed))
        except (KeyError, ValueError) as exc:
            self.stats.drops["asks rejected"] += 1
            self.console.line(f"[{t:6.2f} s] ask ({task}) rejected: {exc}")
            return
        self._asks[rid] = text
        self.console.ask(t, task, text)

    # ------------------------------------------------------------------ frames
    def assemble(self) -> Observation | None:
        """The node's assembly step; a frame with nothing new is counted in ``stats.waiting``."""
        a = self.asm.assemble()
        for err in a.errors:
            if self.asm.decode_errors == 1:
                self.console.line(f"[{self.bag_time():6.2f} s] {err}; image dropped")
        if a.observation is None:
            self.stats.waiting[_short(a.waiting) if a.waiting else "no new input since the last frame"] += 1
        return a.observation

    def frame(self, obs: Observation | None, available: float | None = None, log_ns: int | None = None) -> FrameRecord:
        """Run one engine frame on ``obs`` (None: language only) and record/write its outputs.

        Args:
            available: wall time the observation became available (default: now, or the
                recorded arrival of its newest input when known).
            log_ns: log time of the outputs (default: the bag clock).
        """
        log_ns = self.bag_now_ns if log_ns is None else log_ns
        if obs is not None:
            self.engine.submit_observation(self.frames.observation(obs))
            if available is None:
                available = self.available.get(obs.stamp, self.now())
        start = self.now()
        acted: list[float] = []

        def on_action(chunk: ActionChunk) -> None:
            acted.append(self.now())
            try:
                cmd = self.frames.command(chunk)
                main, positions = command_messages(
                    cmd, self.stamps.exact(chunk.stamp), self.cfg.control_period_s, self.cfg.frame_id
                )
            except ValueError as exc:
                self.stats.drops["action chunks refused"] += 1
                self.console.line(f"frame {chunk.frame_id}: action chunk refused: {exc}")
                return
            _, values, kind = primary_values(cmd)  # what the action topic carries
            arrival = self.available.get(chunk.stamp)  # unknown: from its first point on
            latency = 0.0 if arrival is None else max(0.0, (acted[-1] - arrival) * self.rate)
            self.switches.add(chunk.stamp, values, chunk.stamp + latency)
            self.stats.meta["command_kind"] = kind
            # the report plots joint positions: keep the robot command when it is one per joint
            full = cmd.position_joints == tuple(self.cfg.joint_names)
            self.position_chunks &= full
            self.chunks.append(ActionChunk(cmd.positions, chunk.stamp, chunk.frame_id) if full else chunk)
            if self.writer is not None:
                self.writer.write(self.topics.action, log_ns, main)
                if positions is not None:
                    self.writer.write(self.position_topic, log_ns, positions)

        res = self.engine.step(on_action=on_action)
        m = res.metrics
        warm = obs is not None and self._obs_frames < self.warmup
        self._obs_frames += obs is not None
        rec = FrameRecord(
            frame_id=res.frame_id,
            wall_start=start - self.t0,
            bag_time=self.bag_time(log_ns),
            has_obs=obs is not None,
            stamp=None if obs is None else obs.stamp,
            action=res.action is not None,
            latency=None if not acted or available is None else acted[0] - available,
            frame_time=m.frame_time,
            vision=m.vision,
            prefill=m.prefill,
            denoise=m.denoise,
            start=m.extra.get("start", 0.0),
            decode=m.decode,
            bookkeeping=m.bookkeeping,
            decode_steps=m.decode_steps,
            decode_batch=m.decode_batch,
            tokens=m.tokens_emitted,
            running=self.engine.running,
            blocks_in_use=m.blocks_in_use,
            blocks_total=m.blocks_total,
            masked=() if obs is None else tuple(s for s, v in obs.images.items() if v is None),
            error=res.error,
            warmup=warm,
            language=bool(m.extra.get("language_load")),
            batcher_busy=m.extra.get("batcher_busy"),
        )
        self.stats.frames.append(rec)
        if res.error:
            self.console.line(f"[{rec.bag_time:6.2f} s] frame {res.frame_id}: {res.error}")
        self.text(res.deltas, res.ended, log_ns, rec.bag_time)
        return rec

    def text(self, deltas: list[TextDelta], ended: list[RequestResult], log_ns: int, t: float) -> None:
        """Serialise a frame's deltas and ended requests per task, write and show them."""
        by_task = self.utterances.frame(deltas, ended)
        for r in ended:
            self.stats.requests.append(
                RequestRecord(
                    r.id,
                    r.task,
                    self._asks.pop(r.id, ""),
                    r.status.name.lower(),
                    r.reason,
                    len(r.token_ids),
                    r.text,
                    r.time_to_first_token,
                    r.latency,
                    r.frame_id,
                )
            )
            if r.status in (RequestStatus.REJECTED, RequestStatus.FAILED):
                self.stats.drops[f"language requests {r.status.name.lower()}"] += 1
                self.console.line(f"[{t:6.2f} s] {r.task} #{r.id} {r.status.name.lower()}: {r.reason}")
        for task, emits in by_task.items():
            for e in emits:
                if e.kind == "delta" and not e.text:
                    continue
                if e.kind == "text":
                    self.texts.append((task, e.request_id, e.text))
                if self.writer is not None:
                    topic = self.topics.deltas[task] if e.kind == "delta" else self.topics.texts[task]
                    self.writer.write(topic, log_ns, String(data=e.text))
            self.console.emit(t, task, emits)

    def counts(self) -> None:
        """Copy the assembler's counters into ``stats.drops``, the chunk switches into
        ``stats.switches``."""
        self.stats.switches = self.switches.summary()
        c = self.asm.counts()
        self.stats.drops["image decode errors"] += c["image_decode_errors"]
        self.stats.drops["observations dropped by the engine"] += self.engine.dropped_observations
