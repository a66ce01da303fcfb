"""Which inputs of the node (each camera, the joint states) have stopped, and since when (ROS-free).

Times are monotonic wall seconds (``time.monotonic``) of message *arrival*, not header stamps: a
camera whose stamps look fine but that stopped sending is what this catches (the observation
assembler only compares stamps with each other, so inputs that all stop together look fresh to it).

- The subscription callbacks store the arrival time of every message in :attr:`InputWatch.last`
  (one dict store per message, nothing else on that path).
- An input is *stale* while it has delivered a message since activation but none for more than
  ``timeout_s``; every input silent (stale, or nothing since activation) with at least one stale
  is *every input stopped*.
- An input that delivered nothing ``grace_s`` after activation (default ``2 * timeout_s``: the
  first message of a publisher that is already running arrives within one period of activation,
  and a driver that starts with the node gets the stale threshold once more to deliver its first
  one) is *silent since activation*, reported once per activation.
- :meth:`InputWatch.check`, called from a timer, returns the transitions since its last call — an
  input went stale, resumed, or is silent since activation — so each is logged once, not every
  period.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Change", "InputWatch", "Liveness"]


@dataclass(frozen=True)
class Change:
    """One transition of an input: ``kind`` is ``'stale'`` (``seconds``: silent so far),
    ``'resumed'`` (``seconds``: about how long it was silent) or ``'never'`` (``seconds`` since
    activation, nothing received)."""

    kind: str
    name: str
    seconds: float


@dataclass
class Liveness:
    """The inputs at one instant: ``stale`` as (name, seconds silent), longest first;
    ``all_stopped`` when every input is silent and at least one is stale; ``ages`` name -> seconds
    since its last message (None: nothing since activation)."""

    stale: list[tuple[str, float]] = field(default_factory=list)
    all_stopped: bool = False
    ages: dict[str, float | None] = field(default_factory=dict)


class InputWatch:
    """Arrival times of the node's inputs and their stale / resumed transitions.

    Args:
        names: the inputs, e.g. ``camera base_0_rgb``, ``joint_states``.
        timeout_s: silence longer than this (seconds) makes an input stale (> 0).
        grace_s: after activation, an input silent this long (seconds) is reported once as silent
            since activation (None: ``2 * timeout_s``).
    """

    def __init__(self, names: Sequence[str], timeout_s: float, grace_s: float | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.names = tuple(names)
        self.timeout_s = float(timeout_s)
        self.grace_s = 2.0 * self.timeout_s if grace_s is None else float(grace_s)
        self.last: dict[str, float] = {}  # name -> arrival time of its newest message
        self._t0: float | None = None
        self._stale: dict[str, float] = {}  # stale input -> its last arrival before the silence
        self._grace_done = False

    def start(self, now: float) -> None:
        """Activation at ``now``: forget every arrival and transition."""
        self.last.clear()
        self._stale.clear()
        self._t0, self._grace_done = now, False

    def seen(self, name: str, now: float) -> None:
        """A message of ``name`` arrived at ``now`` (callers on a hot path store into :attr:`last`)."""
        self.last[name] = now

    def check(self, now: float) -> list[Change]:
        """Transitions since the previous call (none before :meth:`start`)."""
        if self._t0 is None:
            return []
        out = []
        for name in self.names:
            t = self.last.get(name)
            if t is None:  # never arrived: neither stale nor resumed
                continue
            silent = now - t > self.timeout_s
            if silent and name not in self._stale:
                self._stale[name] = t
                out.append(Change("stale", name, now - t))
            elif not silent and name in self._stale:
                # t: the newest arrival, at most one check period after the first one after the gap
                out.append(Change("resumed", name, t - self._stale.pop(name)))
        if not self._grace_done and now - self._t0 >= self.grace_s:
            self._grace_done = True
            out += [Change("never", n, now - self._t0) for n in self.names if n not in self.last]
        return out

    def state(self, now: float) -> Liveness:
        """The inputs at ``now`` (empty before :meth:`start`)."""
        if self._t0 is None:
            return Liveness()
        ages = {n: (now - self.last[n] if n in self.last else None) for n in self.names}
        stale = sorted(((n, a) for n, a in ages.items() if a is not None and a > self.timeout_s), key=lambda x: -x[1])
        silent = len(stale) + sum(1 for a in ages.values() if a is None)
        return Liveness(stale, bool(stale) and silent == len(self.names), ages)
