"""Helpers for tests that talk to the ``oxygen`` node over real DDS (Fast DDS, localhost only).

- :func:`node_process`: the node in its own process (``python -m oxygen_ros.ros.node --ros-args ...``),
  stopped with SIGINT (never leaked; the exit status is checked by the caller).
- :class:`RosPeer`: an rclpy node with its own Context/domain in the test process, spun in a
  background thread, collecting messages and publishing.
- :class:`SensorFeed`: publishes cameras + joint states at a fixed rate from a thread, with knobs to
  inject bad input. ``python test/ros_helpers.py publish ...`` runs one as a separate process.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"  # before rclpy creates participants

import numpy as np  # noqa: E402
import rclpy  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import QoSProfile  # noqa: E402
from rclpy.signals import SignalHandlerOptions  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from std_msgs.msg import String  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from oxygen_ros.ros.convert import rgb_to_compressed_msg, rgb_to_image_msg, sec_to_stamp  # noqa: E402
from oxygen_ros.ros.distro import close_context  # noqa: E402
from oxygen_ros.ros.qos import reliable_qos, sensor_data_qos  # noqa: E402

ALOHA_JOINTS = (
    "left_waist",
    "left_shoulder",
    "left_elbow",
    "left_forearm_roll",
    "left_wrist_angle",
    "left_wrist_rotate",
    "left_gripper",
    "right_waist",
    "right_shoulder",
    "right_elbow",
    "right_forearm_roll",
    "right_wrist_angle",
    "right_wrist_rotate",
    "right_gripper",
)
ALOHA_COMPRESSED = {
    "base_0_rgb": "cam_high/image_raw/compressed",
    "left_wrist_0_rgb": "cam_left_wrist/image_raw/compressed",
    "right_wrist_0_rgb": "cam_right_wrist/image_raw/compressed",
}


def ros_env(domain_id: int) -> dict[str, str]:
    """Environment for a node process: isolated domain, localhost discovery, repo (and the test
    helpers, e.g. ``fault_node``) importable."""
    env = dict(os.environ)
    env.update(
        ROS_DOMAIN_ID=str(domain_id),
        ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",  # a native crash (SIGSEGV) prints the Python stack of every thread
        RCUTILS_LOGGING_BUFFERED_STREAM="0",
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "test"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    env.pop("ROS_LOCALHOST_ONLY", None)
    return env


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background shell may have ignored SIGINT


@contextlib.contextmanager
def node_process(
    domain_id: int,
    log_path: Path,
    params_file: Path | None = None,
    params: dict[str, Any] | None = None,
    module: str = "oxygen_ros.ros.node",
    extra: list[str] | None = None,
) -> Iterator[subprocess.Popen]:
    """Run ``python -m <module> --ros-args --params-file F -p k:=v ...``; SIGINT it on exit.

    The process's stdout+stderr go to ``log_path``; after the block, ``proc.returncode`` is set (a
    process that ignores SIGINT for 20 s is killed and gets a negative code).
    """
    cmd = [sys.executable, "-m", module] + list(extra or []) + ["--ros-args"]
    if params_file is not None:
        cmd += ["--params-file", str(params_file)]
    for key, value in (params or {}).items():
        cmd += ["-p", f"{key}:={_param_text(value)}"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=ros_env(domain_id), stdout=log, stderr=subprocess.STDOUT, preexec_fn=_default_sigint
        )
        try:
            yield proc
        finally:
            stop_process(proc)


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> int:
    """SIGINT, wait up to ``timeout`` s, then SIGKILL; returns the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


def _param_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_param_text(v) for v in value) + "]"
    return str(value)


class RosPeer:
    """An rclpy node with its own Context in this process, spun by a background thread."""

    def __init__(self, domain_id: int, name: str = "peer") -> None:
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node(name, context=self.context)
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self.node)
        self._lock = threading.Lock()
        self.received: dict[str, list[tuple[float, Any]]] = {}
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while self.context.ok():
            try:
                self._executor.spin_once(timeout_sec=0.05)
            except Exception:  # shutdown races
                if not self.context.ok():
                    return
                raise

    def collect(self, msg_type: type, topic: str, qos: QoSProfile | None = None) -> str:
        """Record every message on ``topic`` as (monotonic receive time, msg); returns the key."""
        self.received.setdefault(topic, [])

        def cb(msg: Any) -> None:
            with self._lock:
                self.received[topic].append((time.monotonic(), msg))

        self.node.create_subscription(msg_type, topic, cb, qos or reliable_qos(100))
        return topic

    def messages(self, topic: str, since: float = 0.0) -> list[Any]:
        """Messages of ``topic`` received at or after monotonic time ``since``."""
        with self._lock:
            return [m for t, m in self.received.get(topic, []) if t >= since]

    def times(self, topic: str, since: float = 0.0) -> list[float]:
        """Receive times (monotonic) of ``topic`` at or after ``since``."""
        with self._lock:
            return [t for t, _ in self.received.get(topic, []) if t >= since]

    def wait_for(self, pred: Callable[[], Any], timeout: float, poll: float = 0.05) -> Any:
        """Poll ``pred`` until truthy (returned) or ``timeout`` seconds pass (returns the last)."""
        end = time.monotonic() + timeout
        value = pred()
        while not value and time.monotonic() < end:
            time.sleep(poll)
            value = pred()
        return value

    def diagnostics(self, suffix: str = ": inference") -> list[dict[str, str]]:
        """Key/values of every received ``/diagnostics`` status whose name ends with ``suffix``
        (collect ``/diagnostics`` first), plus ``_message``."""
        out = []
        for msg in self.messages("/diagnostics"):
            for st in msg.status:
                if st.name.endswith(suffix):
                    out.append({kv.key: kv.value for kv in st.values} | {"_message": st.message})
        return out

    def wait_outputs_matched(self, topics: list[str], timeout: float = 60.0) -> dict[str, str]:
        """Wait until the node is active and its publisher of every topic in ``topics`` has
        matched a subscription (``subscribers /<topic>`` >= 1 on its ``/diagnostics``: writer side,
        so reliable messages published from now on reach this peer). Returns those diagnostics.

        Raises:
            AssertionError: not within ``timeout`` seconds (with the last diagnostics seen).
        """
        keys = [f"subscribers {t if t.startswith('/') else '/' + t}" for t in topics]

        def matched():
            for d in reversed(self.diagnostics()):
                if d.get("state") == "active" and all(int(d.get(k, 0)) >= 1 for k in keys):
                    return d
            return None

        got = self.wait_for(matched, timeout)
        assert got, f"outputs {topics} not matched in {timeout} s; last diagnostics: {self.diagnostics()[-1:]}"
        return got

    def publish_matched(self, pub: Any, msg: Any, timeout: float = 30.0) -> None:
        """Publish ``msg`` once ``pub`` has matched a subscription (writer side), so a reliable
        message is not sent into the void before discovery completed.

        Raises:
            AssertionError: no subscription matched within ``timeout`` seconds.
        """
        assert self.wait_for(lambda: pub.get_subscription_count() > 0, timeout), (
            f"no subscription of {pub.topic_name} matched in {timeout} s"
        )
        pub.publish(msg)

    def close(self) -> None:
        """Shut down the context, join the spin thread, destroy the node (oxygen_ros.ros.distro)."""
        close_context(self.context, [self.node], self._executor, self._thread)


def sample_picture(height: int = 48, width: int = 64, seed: int = 0) -> np.ndarray:
    """A fixed, non-trivial uint8 RGB picture."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


class SensorFeed:
    """Publishes cameras + joint states at ``rate_hz`` from a thread, stamps from ``clock``.

    Knobs (plain attributes, change any time): ``cameras_on`` (slot -> bool), ``stamp_offset``
    (seconds added to the stamps), ``state_hook`` (JointState -> JointState|None, to corrupt or
    drop), ``image_hook`` (slot, msg -> msg|None).
    """

    def __init__(
        self,
        peer: RosPeer,
        topics: dict[str, str],
        joints: tuple[str, ...],
        rate_hz: float = 30.0,
        compressed: bool = False,
        joint_topic: str = "joint_states",
        picture: np.ndarray | None = None,
    ) -> None:
        self.peer, self.rate_hz, self.joints, self.compressed = peer, rate_hz, joints, compressed
        qos = sensor_data_qos(5)
        kind = "CompressedImage" if compressed else "Image"
        from sensor_msgs.msg import CompressedImage, Image

        msg_type = CompressedImage if compressed else Image
        self.cam_pubs = {s: peer.node.create_publisher(msg_type, t, qos) for s, t in topics.items()}
        self.joint_pub = peer.node.create_publisher(JointState, joint_topic, qos)
        self.kind = kind
        self.picture = sample_picture() if picture is None else picture
        self._encoded = (
            rgb_to_compressed_msg(self.picture, "jpeg") if compressed else rgb_to_image_msg(self.picture, "rgb8")
        )
        self.cameras_on = {s: True for s in topics}
        self.stamp_offset = 0.0
        self.state_hook: Callable[[JointState], JointState | None] | None = None
        self.image_hook: Callable[[str, Any], Any] | None = None
        self.sent_stamps: list[float] = []
        self.ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> SensorFeed:
        """Start publishing."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop publishing."""
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        period = 1.0 / self.rate_hz
        next_t = time.monotonic()
        while not self._stop.is_set() and self.peer.context.ok():
            self.publish_once()
            next_t += period
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def publish_once(self) -> float:
        """Publish one tick (all enabled cameras + a joint state) with one stamp; returns it."""
        stamp = time.time() + self.stamp_offset
        ros_stamp = sec_to_stamp(stamp)
        for slot, pub in self.cam_pubs.items():
            if not self.cameras_on[slot]:
                continue
            msg = type(self._encoded)()
            msg.header.stamp = ros_stamp
            if self.compressed:
                msg.format, msg.data = self._encoded.format, self._encoded.data
            else:
                msg.height, msg.width, msg.encoding = self._encoded.height, self._encoded.width, "rgb8"
                msg.step, msg.data = self._encoded.step, self._encoded.data
            if self.image_hook is not None:
                msg = self.image_hook(slot, msg)
            if msg is not None:
                pub.publish(msg)
        k = self.ticks
        js = JointState(
            name=list(self.joints), position=[0.1 * math.sin(0.05 * k + i) for i in range(len(self.joints))]
        )
        js.header.stamp = ros_stamp
        if self.state_hook is not None:
            js = self.state_hook(js)
        if js is not None:
            self.joint_pub.publish(js)
        self.sent_stamps.append(stamp)
        self.ticks += 1
        return stamp


def _publisher_main(argv: list[str]) -> int:
    """Separate publisher process: cameras + joint states at a rate and the instruction. Asks are
    sent by the test itself, once the node's outputs have matched (``RosPeer.publish_matched``)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--domain", type=int, required=True)
    ap.add_argument("--rate", type=float, default=30.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--compressed", action="store_true")
    ap.add_argument("--instruction", default="pick up the red cube")
    ap.add_argument("--stamps-out", default="")
    a = ap.parse_args(argv)
    peer = RosPeer(a.domain, "sensor_publisher")
    feed = SensorFeed(
        peer,
        ALOHA_COMPRESSED if a.compressed else {s: t.replace("/compressed", "") for s, t in ALOHA_COMPRESSED.items()},
        ALOHA_JOINTS,
        a.rate,
        compressed=a.compressed,
    ).start()
    instr = peer.node.create_publisher(String, "instruction", reliable_qos())
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    end = time.monotonic() + a.duration
    while not stop.is_set() and time.monotonic() < end:
        instr.publish(String(data=a.instruction))
        stop.wait(0.5)
    feed.stop()
    if a.stamps_out:
        Path(a.stamps_out).write_text("\n".join(repr(s) for s in feed.sent_stamps))
    peer.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["publish"]:
        sys.exit(_publisher_main(sys.argv[2:]))
    sys.exit(f"usage: {sys.argv[0]} publish --domain N [...]")


def child_pids(pid: int) -> list[int]:
    """The live children of process ``pid`` (from /proc; zombies excluded)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:  # state, ppid
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
