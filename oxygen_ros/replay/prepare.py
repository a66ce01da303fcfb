"""Replay set-up: the node's own parameters and topic mapping, checked against a bag.

:func:`load_node_config` reads a ``ros__parameters`` YAML file (and ``name:=value`` overrides)
exactly as the ``oxygen`` node does: a short-lived rclpy node in a private context declares the
node's parameters (:func:`oxygen_ros.ros.params.node_config.read_node_config`), so names, defaults, types,
ranges and error messages are the node's. :class:`TopicMap` resolves the node's relative topic
names against its namespace (as rcl does), and :func:`check_bag` compares them with a bag's
topics: a missing camera is a warning (its slot is masked in every frame, as on the robot); a
missing joint-state topic, no camera at all, or a topic of the wrong type is an error.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from oxygen_ros.bags.reader import BagInput

if TYPE_CHECKING:  # rclpy is imported only when a config is read (`replay --help` stays quick)
    from oxygen_ros.core.policy import Pi05Policy
    from oxygen_ros.ros.params.node_config import NodeConfig

__all__ = [
    "ReplayError",
    "ReplaySetupError",
    "check_policy",
    "load_policy",
    "TopicMap",
    "check_bag",
    "default_params_file",
    "load_node_config",
    "resolve_topic",
]

CAMERA_MSGTYPES = {"compressed": "sensor_msgs/msg/CompressedImage", "raw": "sensor_msgs/msg/Image"}
JOINT_STATE_MSGTYPE = "sensor_msgs/msg/JointState"
STRING_MSGTYPE = "std_msgs/msg/String"


class ReplayError(RuntimeError):
    """The replay cannot start (bag, parameters, model or output path); the message says why."""


class ReplaySetupError(ValueError):
    """Parameters or bag topics that make a replay impossible (the message says what to fix)."""


def default_params_file() -> Path | None:
    """The package's ``config/oxygen.yaml``: the source tree's, else the installed share folder's."""
    here = Path(__file__).resolve().parents[2] / "config" / "oxygen.yaml"
    if here.is_file():
        return here
    try:
        from ament_index_python.packages import get_package_share_directory

        shared = Path(get_package_share_directory("oxygen_ros")) / "config" / "oxygen.yaml"
        return shared if shared.is_file() else None
    except Exception:  # noqa: BLE001 - ament_index is optional (pip installs)
        return None


def load_node_config(
    params_file: str | os.PathLike[str] | None,
    overrides: Sequence[str] = (),
    node_name: str = "oxygen",
    namespace: str = "/",
) -> NodeConfig:
    """The node's configuration from a parameter file (:func:`oxygen_ros.ros.params.node_config.load_node_config`).

    Raises:
        ReplaySetupError: unreadable file, malformed override, or invalid parameters (named).
    """
    from oxygen_ros.ros.params.node_config import ParamsFileError
    from oxygen_ros.ros.params.node_config import load_node_config as node_load

    try:
        return node_load(params_file, overrides, node_name, namespace)
    except ParamsFileError as exc:
        raise ReplaySetupError(str(exc)) from exc


def resolve_topic(name: str, namespace: str = "/", node_name: str = "oxygen") -> str:
    """Fully qualified topic name, as rcl resolves it (``~`` = the node's private namespace)."""
    ns = "/" + namespace.strip("/") if namespace.strip("/") else ""
    if name.startswith("/"):
        return name
    if name.startswith("~"):
        return f"{ns}/{node_name}" + ("/" + name[1:].lstrip("/") if name[1:].strip("/") else "")
    return f"{ns}/{name}"


@dataclass(frozen=True)
class TopicMap:
    """The node's topics, fully qualified.

    Attributes:
        cameras: camera topic -> (image slot, ``raw``/``compressed``).
        joint_state: joint-state topic; instruction: instruction topic.
        asks: ask topic -> language task (several tasks may share one topic).
        action: action-chunk output topic; deltas / texts: task -> output topic.
    """

    cameras: dict[str, tuple[str, str]]
    joint_state: str
    instruction: str
    asks: dict[str, list[str]] = field(default_factory=dict)
    action: str = "/action_chunk"
    deltas: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: NodeConfig, namespace: str = "/", node_name: str = "oxygen") -> TopicMap:
        """Resolve every topic of ``cfg``."""

        def r(name: str) -> str:
            return resolve_topic(name, namespace, node_name)

        asks: dict[str, list[str]] = {}
        for task, topics in cfg.task_topics.items():
            if topics.ask:
                asks.setdefault(r(topics.ask), []).append(task)
        return cls(
            cameras={r(t): (slot, kind) for slot, (t, kind) in cfg.cameras.items()},
            joint_state=r(cfg.joint_state_topic),
            instruction=r(cfg.instruction_topic),
            asks=asks,
            action=r(cfg.action_topic),
            deltas={k: r(v.delta) for k, v in cfg.task_topics.items()},
            texts={k: r(v.text) for k, v in cfg.task_topics.items()},
        )

    @property
    def inputs(self) -> list[str]:
        """Every input topic the node subscribes to."""
        return [*self.cameras, self.joint_state, self.instruction, *self.asks]


def check_bag(bag: BagInput, topics: TopicMap, instruction: str) -> list[str]:
    """Compare the bag's topics with the node's inputs.

    Returns:
        Warnings (missing cameras -> masked slots, no instruction / ask messages).

    Raises:
        ReplaySetupError: every fatal problem at once — no joint states, no camera, a topic
            recorded with another type than the node subscribes with.
    """
    errors, warnings = [], []
    have = {t: i for t, i in bag.topics.items() if i.count > 0}
    listing = ", ".join(sorted(have)) or "none"

    def wrong_type(topic: str, want: str, param: str) -> None:
        if topic in have and have[topic].msgtype != want:
            errors.append(
                f"{topic} ({param}) is {have[topic].msgtype} in the bag, but the node subscribes to it as {want}"
            )

    if topics.joint_state not in have:
        errors.append(f"joint-state topic {topics.joint_state} (parameter joint_state_topic) is not in the bag")
    wrong_type(topics.joint_state, JOINT_STATE_MSGTYPE, "joint_state_topic")
    present = [t for t in topics.cameras if t in have]
    for topic, (slot, kind) in topics.cameras.items():
        if topic not in have:
            warnings.append(
                f"camera topic {topic} (cameras.{slot}.topic) is not in the bag: slot "
                f"{slot} will be masked in every frame"
            )
        else:
            wrong_type(topic, CAMERA_MSGTYPES[kind], f"cameras.{slot}.type={kind}")
    if not present:
        errors.append(
            "none of the camera topics ("
            + ", ".join(f"{t} -> {s}" for t, (s, _) in topics.cameras.items())
            + ") is in the bag; no frame can be built"
        )
    wrong_type(topics.instruction, STRING_MSGTYPE, "instruction_topic")
    if topics.instruction not in have:
        what = f"the parameter instruction={instruction!r}" if instruction else "an EMPTY instruction"
        warnings.append(f"instruction topic {topics.instruction} is not in the bag: using {what}")
    for topic, tasks in topics.asks.items():
        wrong_type(topic, STRING_MSGTYPE, f"tasks.{tasks[0]}.ask_topic")
    if topics.asks and not any(t in have for t in topics.asks):
        warnings.append(
            "none of the ask topics (" + ", ".join(sorted(topics.asks)) + ") is in the "
            "bag: no language asks, only periodic language tasks run"
        )
    if errors:
        raise ReplaySetupError(
            f"bag {bag.path} does not fit the node parameters: " + "; ".join(errors) + f" (bag topics: {listing})"
        )
    return warnings


def load_policy(cfg: NodeConfig, model: str | None = None) -> Pi05Policy:
    """The policy the node would load for ``cfg`` (:func:`oxygen_ros.ros.model_setup.load_policy`).

    Raises:
        ReplayError: the checkpoint cannot be loaded or does not fit the joints/cameras.
    """
    from oxygen_ros.ros.model_setup import load_policy as node_load_policy

    try:
        return node_load_policy(cfg, model)
    except Exception as exc:  # noqa: BLE001 - checkpoint errors of every kind end here
        raise ReplayError(f"cannot load model {model or cfg.model!r}: {type(exc).__name__}: {exc}") from exc


def check_policy(cfg: NodeConfig, policy: Pi05Policy) -> None:
    """Raise ReplayError when ``policy`` does not fit the node configuration."""
    from oxygen_ros.ros.model_setup import check_policy as node_check_policy

    try:
        node_check_policy(cfg, policy)
    except ValueError as exc:
        raise ReplayError(str(exc)) from exc
