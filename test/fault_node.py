"""``python -m fault_node --ros-args ...``: the real ``oxygen`` node process, with faults armed on
command (tests only).

Everything is the shipped node — its rclpy logger, executor, inference thread, DDS endpoints and
/diagnostics — except that, once configured, it also listens on ``/test_fault``
(``std_msgs/String``) and arms what a message names, for the next call of that piece:

- ``<stage>`` (``vision``, ``prefill``, ``denoise``, ``decode``, ``sampling``, ``detokenize``):
  that engine stage raises (a contained engine fault, :class:`oxygen_ros.bench.injection.FaultInjector`);
- ``<stage>_always``: that stage raises on every call until ``clear``;
- ``hang <seconds>``: the next denoise sleeps that long first (a stalled frame);
- ``frame_stats``: the node's own frame handling (its frame statistics) raises on the next frame
  that leaves a language request in flight — a fault of the node's glue, outside the engine's
  containment: the inference thread's supervisor handles it, and the request is still in flight
  when it does;
- ``clear``: disarm everything.
"""

from __future__ import annotations

import sys
import time

from std_msgs.msg import String

from oxygen_ros.bench.injection import STAGES, FaultInjector
from oxygen_ros.ros import node as node_module

_original_load = node_module.OxygenNode._load


class _Faults:
    """The armed faults of one configured node."""

    def __init__(self, node: node_module.OxygenNode) -> None:
        self.injector = FaultInjector(node.engine)
        self.always: set[str] = set()
        self.frame_stats_faults = 0
        stats, engine = node.worker._stats, node.engine
        record = stats.record

        def faulty_record(*args, **kwargs):
            if self.frame_stats_faults and engine.in_flight > 0:
                self.frame_stats_faults -= 1
                raise RuntimeError("injected fault in frame_stats")
            return record(*args, **kwargs)

        stats.record = faulty_record
        self.sub = node.create_subscription(String, "/test_fault", self.on_command, 10)
        self.log = node.get_logger()

    def rearm(self, stage: str) -> None:
        def hook() -> None:
            if stage in self.always:
                self.injector.arm(stage)
                self.injector.on_next_call(stage, hook)

        self.injector.on_next_call(stage, hook)

    def on_command(self, msg: String) -> None:
        words = msg.data.split()
        if not words:
            return
        cmd = words[0]
        if cmd in STAGES:
            self.injector.arm(cmd)
        elif cmd.endswith("_always") and cmd[: -len("_always")] in STAGES:
            stage = cmd[: -len("_always")]
            self.always.add(stage)
            self.rearm(stage)
        elif cmd == "hang":
            seconds = float(words[1])
            self.injector.on_next_call("denoise", lambda: time.sleep(seconds))
        elif cmd == "frame_stats":
            self.frame_stats_faults += 1
        elif cmd == "clear":
            self.always.clear()
            self.injector.disarm()
            self.frame_stats_faults = 0
        self.log.info(f"test fault armed: {msg.data}")


def _load(self, cfg):
    _original_load(self, cfg)
    self._test_faults = _Faults(self)


node_module.OxygenNode._load = _load

if __name__ == "__main__":
    sys.exit(node_module.main())
