"""Named QoS profiles for oxygen_ros topics.

- ``sensor_data``: best effort, keep last 2, volatile. Cameras and joint states: only the newest
  sample matters and a lost frame must never stall the publisher. Compatible with any publisher
  (reliable or best effort), e.g. camera drivers and ``ros2 bag play``.
- ``reliable``: reliable, keep last 10, volatile. Action chunks. Volatile on purpose: a late
  subscriber must never receive a stale chunk.
- ``text``: reliable, keep last 100, volatile. Streamed text deltas, which only concatenate to the
  whole utterance when none is lost, so the history absorbs a reader that lags briefly.
- ``reliable_keep_all``: reliable, keep all, volatile. Asks: every ask that reaches the node's
  reader is kept until the node takes it, so a burst is answered, queued or rejected with a notice
  — never silently overwritten in the reader. (A *publisher* with keep-last depth d can still
  replace its own unacknowledged samples when it sends more than d at once: publish asks reliable
  with a depth that covers a burst, or keep all.)
- ``system_default``: the RMW's defaults (rclpy's ``qos_profile_system_default``).

Every accessor returns a new ``QoSProfile``, so callers may modify what they get.
"""

from __future__ import annotations

from collections.abc import Callable

from rclpy.qos import (
    DurabilityPolicy,
    HistoryPolicy,
    QoSProfile,
    ReliabilityPolicy,
    qos_profile_system_default,
)

__all__ = [
    "QOS_NAMES",
    "reliable_keep_all_qos",
    "reliable_qos",
    "qos_from_name",
    "sensor_data_qos",
    "system_default_qos",
    "text_qos",
]

SENSOR_DATA_DEPTH = 2
RELIABLE_DEPTH = 10
TEXT_DEPTH = 100


def _keep_last(reliability: ReliabilityPolicy, depth: int) -> QoSProfile:
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"QoS depth must be an integer >= 1, got {depth!r}")
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
        reliability=reliability,
        durability=DurabilityPolicy.VOLATILE,
    )


def sensor_data_qos(depth: int = SENSOR_DATA_DEPTH) -> QoSProfile:
    """Best effort, keep last ``depth`` (default 2), volatile: cameras and joint states."""
    return _keep_last(ReliabilityPolicy.BEST_EFFORT, depth)


def reliable_qos(depth: int = RELIABLE_DEPTH) -> QoSProfile:
    """Reliable, keep last ``depth`` (default 10), volatile: action chunks, instructions."""
    return _keep_last(ReliabilityPolicy.RELIABLE, depth)


def text_qos(depth: int = TEXT_DEPTH) -> QoSProfile:
    """Reliable, keep last ``depth`` (default 100), volatile: streamed text deltas."""
    return _keep_last(ReliabilityPolicy.RELIABLE, depth)


def reliable_keep_all_qos() -> QoSProfile:
    """Reliable, keep all, volatile: asks (see the module doc)."""
    return QoSProfile(
        history=HistoryPolicy.KEEP_ALL,
        depth=0,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.VOLATILE,
    )


def system_default_qos() -> QoSProfile:
    """Return the RMW's default QoS (a copy of rclpy's ``qos_profile_system_default``)."""
    p = qos_profile_system_default
    return QoSProfile(
        history=p.history,
        depth=p.depth,
        reliability=p.reliability,
        durability=p.durability,
    )


_BY_NAME: dict[str, Callable[..., QoSProfile]] = {
    "sensor_data": sensor_data_qos,
    "reliable": reliable_qos,
    "text": text_qos,
    "reliable_keep_all": reliable_keep_all_qos,
    "system_default": system_default_qos,
}
QOS_NAMES: tuple[str, ...] = tuple(_BY_NAME)


def qos_from_name(name: str, depth: int | None = None) -> QoSProfile:
    """Return the QoS profile for a parameter value such as ``camera_qos: sensor_data``.

    Args:
        name: one of ``QOS_NAMES`` (case and surrounding blanks ignored).
        depth: optional history depth overriding the profile's default (keep-last profiles only).

    Raises:
        ValueError: unknown name (the message lists the valid ones), invalid depth, or a depth
            given for ``system_default``.
    """
    key = str(name).strip().lower()
    if key not in _BY_NAME:
        raise ValueError(f"unknown QoS profile name {name!r}; valid names: {', '.join(QOS_NAMES)}")
    if depth is None:
        return _BY_NAME[key]()
    if key in ("system_default", "reliable_keep_all"):
        raise ValueError(f"a QoS depth cannot be combined with {key!r}")
    return _BY_NAME[key](depth)
