"""Controller groups: one command topic per ros2_control controller.

A humanoid does not run one controller for every joint: each arm, each hand, the waist and the
head have their own ``JointTrajectoryController`` (topic ``/<controller>/joint_trajectory``) or
``forward_command_controller`` (``/<controller>/commands``, ``std_msgs/Float64MultiArray`` in the
controller's joint order), each owning its joints. A params file declares the groups:

.. code-block:: yaml

    controller_names: [left_arm_controller, left_hand_controller]
    controllers:
      left_arm_controller:  {joints: [l_shoulder_pitch, …]}                 # JointTrajectory
      left_hand_controller: {joints: [l_thumb, …], type: forward_command}  # per-step Float64MultiArray

and the node sends each chunk as one ``JointTrajectory`` per ``joint_trajectory`` group (the same
header stamp and ``time_from_start`` in every group: time-aligned) and each step of the per-step
command stream as one ``Float64MultiArray`` per ``forward_command`` group. The conventions are
ros2_control's (``joint_trajectory_controller`` / ``forward_command_controller`` topics and
message types). Every action joint belongs to exactly one group, so nothing the checkpoint
outputs is silently left uncommanded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.exceptions import InvalidParameterTypeException, ParameterUninitializedException
from rclpy.node import Node
from rclpy.parameter import Parameter

__all__ = ["CONTROLLER_TYPES", "ControllerGroup", "check_groups", "declare_controller_params", "read_controller_groups"]

CONTROLLER_TYPES = ("joint_trajectory", "forward_command")
_DEFAULT_SUFFIX = {"joint_trajectory": "joint_trajectory", "forward_command": "commands"}
_SA, _S = Parameter.Type.STRING_ARRAY, Parameter.Type.STRING


@dataclass(frozen=True)
class ControllerGroup:
    """One controller's share of the action.

    Attributes:
        name: the controller's name (``left_arm_controller``).
        joints: its joints, in the controller's own order (a subset of ``joint_names``).
        topic: where its commands go (relative: the node's namespace applies).
        type: ``joint_trajectory`` (a JointTrajectory per chunk) or ``forward_command`` (a
            Float64MultiArray per step of the command stream, ``action_rate_hz``).
    """

    name: str
    joints: tuple[str, ...]
    topic: str
    type: str = "joint_trajectory"


def _declare(node: Node, name: str, ptype: Parameter.Type, description: str) -> None:
    """Declare ``name`` as ``ptype`` (unset allowed); a value of another type from the params file is
    kept (dynamically typed) so :func:`read_controller_groups` names it instead of rclpy raising."""
    if node.has_parameter(name):
        return
    try:
        node.declare_parameter(name, ptype, ParameterDescriptor(name=name, type=ptype.value, description=description))
    except InvalidParameterTypeException:
        node.declare_parameter(name, None, ParameterDescriptor(name=name, description=description, dynamic_typing=True))


def _get(node: Node, name: str) -> Any:
    try:
        return node.get_parameter(name).value
    except ParameterUninitializedException:
        return None


def _is_names(value: object) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


def declare_controller_params(node: Node) -> list[str]:
    """Declare ``controller_names`` and ``controllers.<name>.{joints,topic,type}`` for each listed
    name (idempotent). Returns the valid listed names (others are reported by
    :func:`read_controller_groups`)."""
    _declare(
        node,
        "controller_names",
        _SA,
        "ros2_control controllers the action is split over, each with "
        "controllers.<name>.joints/topic/type. Unset = the whole chunk on action_topic only.",
    )
    names = _get(node, "controller_names")
    if not _is_names(names):
        return []
    valid = [n for n in names if n and n.replace("_", "").isalnum()]
    for name in valid:
        p = f"controllers.{name}."
        _declare(node, p + "joints", _SA, f"Joints of controller {name}, in its own order. Required.")
        _declare(
            node,
            p + "type",
            _S,
            f"Message of controller {name}: 'joint_trajectory' "
            "(trajectory_msgs/JointTrajectory per chunk) or 'forward_command' (std_msgs/Float64MultiArray "
            "per command step). Default 'joint_trajectory'.",
        )
        _declare(
            node,
            p + "topic",
            _S,
            f"Topic of controller {name} (default <name>/joint_trajectory, <name>/commands for forward_command).",
        )
    return valid


def read_controller_groups(node: Node, problems: list[str]) -> tuple[ControllerGroup, ...]:
    """The declared groups, every malformed value appended to ``problems`` (one message each, naming
    the parameter); call after :func:`declare_controller_params`. Cross-checks against the joints
    and the action space are :func:`check_groups`."""
    names = _get(node, "controller_names")
    if names is None:
        return ()
    if not _is_names(names):
        problems.append(f"controller_names={names!r}: expected a list of controller names")
        return ()
    groups = []
    for name in names:
        if not name or not name.replace("_", "").isalnum():
            problems.append(f"controller_names: {name!r} is not a valid controller name (letters, digits, _)")
            continue
        p = f"controllers.{name}."
        joints, ctype, topic = _get(node, p + "joints"), _get(node, p + "type"), _get(node, p + "topic")
        ctype = "joint_trajectory" if ctype is None else ctype
        if ctype not in CONTROLLER_TYPES:
            problems.append(f"{p}type={ctype!r}: must be one of {list(CONTROLLER_TYPES)}")
            continue
        if joints is None or not _is_names(joints) or not joints:
            problems.append(f"{p}joints={joints!r}: give the controller's joints (a non-empty list of names)")
            continue
        if topic is not None and not isinstance(topic, str):
            problems.append(f"{p}topic={topic!r}: expected a topic name")
            continue
        groups.append(ControllerGroup(name, tuple(joints), topic or f"{name}/{_DEFAULT_SUFFIX[ctype]}", ctype))
    if len(set(names)) != len(names):
        problems.append(f"controller_names={list(names)!r}: duplicate names")
    return tuple(groups)


def check_groups(
    groups: tuple[ControllerGroup, ...],
    joint_names: tuple[str, ...],
    action_kind: str,
    action_rate_hz: float,
    reserved_topics: dict[str, str],
) -> list[str]:
    """Cross-checks of the groups: every action joint in exactly one group, a position action space
    (absolute / delta), a command stream for forward groups and a consumer for the stream, topics
    distinct from each other and from the node's other outputs (``reserved_topics``: topic ->
    parameter). Returns one message per problem (empty: consistent)."""
    if not groups:
        return []
    problems = []
    if action_kind not in ("absolute", "delta"):
        problems.append(
            f"controller_names with action_space.kind={action_kind!r}: controller groups carry joint "
            "positions (kind absolute or delta)"
        )
    owner: dict[str, str] = {}
    for g in groups:
        for j in g.joints:
            if j not in joint_names:
                problems.append(f"controllers.{g.name}.joints: {j!r} is not in joint_names")
            elif j in owner:
                problems.append(f"controllers.{g.name}.joints: {j!r} is already in controller {owner[j]!r}")
            else:
                owner[j] = g.name
    missing = [j for j in joint_names if j not in owner]
    if missing:
        problems.append(
            f"joints in no controller group: {missing} (every action joint goes to exactly one "
            "controller; list them in a controllers.<name>.joints)"
        )
    forward = [g.name for g in groups if g.type == "forward_command"]
    if forward and action_rate_hz <= 0:
        problems.append(
            f"controllers {forward} are forward_command controllers: they take one command per "
            "step, so set action_rate_hz > 0 (e.g. 1 / control_period_s)"
        )
    if not forward and action_rate_hz > 0:
        problems.append(
            f"action_rate_hz={action_rate_hz} but no controller group is a forward_command "
            "controller: with controller groups the per-step stream only feeds forward_command "
            "controllers (set action_rate_hz: 0.0, or a group type: forward_command)"
        )
    seen = dict(reserved_topics)
    for g in groups:
        if g.topic in seen:
            problems.append(f"controllers.{g.name}.topic={g.topic!r} is also {seen[g.topic]}")
        seen[g.topic] = f"controllers.{g.name}.topic"
    return problems
