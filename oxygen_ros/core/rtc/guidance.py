"""The guided denoise step of real-time chunking, as tensors.

Follows LeRobot 0.6.1 ``policies/rtc/modeling_rtc.py`` (``RTCProcessor.denoise_step``,
``get_prefix_weights``) in LeRobot's flow time ``t`` (t = 1 noise, t = 0 actions, velocity
``v ≈ noise - actions``), which is this package's convention too (:mod:`..model.flow`):

* target ``Y`` ``[1, T, D]``: the previous chunk's leftover in normalised model space, row ``j``
  the target of new row ``j``, zero-padded to the model's ``D`` action dims and ``T`` rows (the padded
  dims are targets with value 0 — LeRobot's convention, kept for parity);
* prefix weights ``W`` ``[T]``: 1 on the ``d'`` delay rows, the schedule's ramp up to the effective
  horizon ``H' = min(H, T_left)``, 0 after (``d' = min(d, H')``);
* guidance weight ``g(t) = min(β, (t² + (1-t)²) / (t (1-t)))``, ``g(1) = β``;
* per Euler step: ``x̂₁ = x - t·v``, ``c = W ⊙ (Y - x̂₁)``, ``v' = v - g(t)·c``, ``x ← x + dt·v'``.

LeRobot computes ``c`` with ``autograd.grad`` but its velocity is not on the graph, so its ``c`` is
the weighted error itself (``elementwise`` here). The paper's form (``vjp``) multiplies by the
Jacobian of ``x̂₁`` with respect to ``x``: ``c = (∂x̂₁/∂x)ᵀ (W ⊙ (Y - x̂₁))`` — a backward pass through
the action expert per step (Black et al. 2025, Eq. 2–5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .config import SCHEDULES


@dataclass
class RTCGuide:
    """Per-frame inputs of the guided denoise loop; static shapes, so a compiled loop never
    recompiles when the delay or the leftover changes.

    Attributes:
        target: ``[1, T, D]`` float32 ``Y`` (normalised model space, zero padded).
        weights: ``[1, T, 1]`` float32 prefix weights ``W`` (all 0: plain flow).
        times: ``[S]`` float32 flow time of each denoise step.
        gains: ``[S]`` float32 guidance weight ``g(t)`` of each step.
        vjp: the paper's vector–Jacobian form instead of LeRobot's elementwise one.
        delay: the delay ``d'`` in use (rows), -1 when inactive.
        horizon: the effective horizon ``H'`` (rows), 0 when inactive.
    """

    target: Tensor
    weights: Tensor
    times: Tensor
    gains: Tensor
    vjp: bool = False
    delay: int = -1
    horizon: int = 0

    @property
    def active(self) -> bool:
        """True when some row is guided (an inactive guide gives the plain flow)."""
        return self.horizon > 0

    def to(self, device: torch.device | str) -> RTCGuide:
        """The same guide with its tensors on ``device``."""
        return RTCGuide(
            self.target.to(device),
            self.weights.to(device),
            self.times.to(device),
            self.gains.to(device),
            self.vjp,
            self.delay,
            self.horizon,
        )


def prefix_weights(schedule: str, delay: int, horizon: int, left_len: int, length: int) -> Tensor:
    """LeRobot's soft mask over the rows of the new chunk.

    Args:
        schedule: one of :data:`~.config.SCHEDULES`.
        delay: ``d`` rows executed from the old chunk while the new one is computed (>= 0).
        horizon: ``H`` execution horizon (>= 1); shortened to ``left_len``.
        left_len: rows of the leftover (0 … ``length``).
        length: ``T`` rows of a chunk.

    Returns:
        ``[T]`` float32: 1 for ``i < d'``; for ``d' <= i < H'`` 0 (zeros), 1 (ones), ``c_i`` (linear)
        or ``c_i (e^{c_i} - 1) / (e - 1)`` (exp) with ``c_i`` = ``linspace(1, 0, n + 2)[1:-1]``,
        ``n = H' - d'``; 0 from ``H'`` on.

    Raises:
        ValueError: unknown schedule or out-of-range sizes.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown RTC schedule {schedule!r}; one of {SCHEDULES}")
    if not (0 <= left_len <= length and horizon >= 1 and delay >= 0):
        raise ValueError(f"bad RTC sizes: delay {delay}, horizon {horizon}, leftover {left_len}, chunk {length}")
    h = min(horizon, left_len)
    d = min(delay, h)
    w = torch.zeros(length, dtype=torch.float32)
    w[:d] = 1.0
    n = h - d
    if n > 0 and schedule != "zeros":
        if schedule == "ones":
            w[d:h] = 1.0
        else:
            c = torch.linspace(1.0, 0.0, n + 2, dtype=torch.float32)[1:-1]
            w[d:h] = c if schedule == "linear" else c * torch.expm1(c) / (math.e - 1.0)
    return w


def guidance_weights(times: Sequence[float] | Tensor, max_weight: float) -> Tensor:
    """``[S]`` float32 ``g(t) = min(β, (t² + (1-t)²) / (t (1-t)))``; ``β`` at ``t >= 1`` (and at
    ``t <= 0``, where the ratio is unbounded too)."""
    t = torch.as_tensor(times, dtype=torch.float64).reshape(-1)
    inside = (t > 0) & (t < 1)
    ts = torch.where(inside, t, torch.full_like(t, 0.5))
    ratio = (ts**2 + (1 - ts) ** 2) / (ts * (1 - ts))
    return torch.where(inside, ratio.clamp(max=max_weight), torch.full_like(t, max_weight)).to(torch.float32)


def make_guide(
    left_over: np.ndarray | Tensor | None,
    delay: int,
    *,
    schedule: str,
    horizon: int,
    max_weight: float,
    times: Sequence[Tensor] | Tensor,
    length: int,
    action_dim: int,
    vjp: bool = False,
) -> RTCGuide:
    """The guide of one chunk.

    Args:
        left_over: ``[T_left, A]`` previous-chunk rows in normalised model space, row ``j`` the target
            of new row ``j`` (LeRobot's ``prev_chunk_left_over``; ``A <= D``), or None / 0 rows for
            an inactive guide (plain flow).
        delay: ``d`` rows (>= 0). schedule / horizon / max_weight: see :class:`~.config.RTCConfig`.
        times: the ``S`` flow times (:func:`~oxygen_ros.core.model.flow.euler_times`).
        length / action_dim: ``T`` and ``D`` of the model's chunk.

    Returns:
        An :class:`RTCGuide` on the CPU.

    Raises:
        ValueError: a leftover with more rows than ``T`` or more dims than ``D``, not 2-D, or not
            finite; a negative delay.
    """
    y = torch.zeros(1, length, action_dim, dtype=torch.float32)
    rows = 0
    if left_over is not None:
        lo = torch.as_tensor(
            np.asarray(left_over, dtype=np.float32)
            if not isinstance(left_over, Tensor)
            else left_over.detach().float().cpu()
        )
        if lo.ndim == 3 and lo.shape[0] == 1:
            lo = lo[0]
        if lo.ndim != 2 or lo.shape[0] > length or lo.shape[1] > action_dim:
            raise ValueError(
                f"prev_chunk_left_over must be [rows <= {length}, dims <= {action_dim}], got {list(lo.shape)}"
            )
        if not bool(torch.isfinite(lo).all()):
            raise ValueError("prev_chunk_left_over is not finite")
        rows = int(lo.shape[0])
        y[0, :rows, : lo.shape[1]] = lo
    if delay < 0:
        raise ValueError(f"inference delay must be >= 0 rows, got {delay}")
    ts = torch.stack([torch.as_tensor(t, dtype=torch.float32).reshape(()) for t in times]).cpu()
    w = prefix_weights(schedule, delay, horizon, rows, length) if rows else torch.zeros(length)
    h = min(horizon, rows)
    return RTCGuide(
        y, w.reshape(1, length, 1), ts, guidance_weights(ts, max_weight), vjp, min(delay, h) if h else -1, h
    )


def guided_velocity(x: Tensor, v: Tensor, t: Tensor, g: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """LeRobot's guided velocity ``v - g · W ⊙ (Y - (x - t v))`` (elementwise; all ``[B, T, D]``
    but ``t``, ``g`` 0-d and ``w`` ``[B, T, 1]``). With ``W = 0`` it is ``v`` exactly."""
    return v - g * (w * (y - (x - t * v)))


def vjp_guided_velocity(
    velocity: Callable[[Tensor], Tensor], x: Tensor, t: Tensor, g: Tensor, y: Tensor, w: Tensor
) -> Tensor:
    """The paper's guided velocity: ``v - g · (∂x̂₁/∂x)ᵀ (W ⊙ (Y - x̂₁))`` with ``x̂₁ = x - t·v(x)``,
    one backward pass through ``velocity`` (``[B, T, D] -> [B, T, D]``). Every tensor ``velocity``
    saves must be a normal tensor (not created under ``inference_mode``).

    Returns:
        ``[B, T, D]`` float32, detached.
    """
    with torch.inference_mode(False), torch.enable_grad():
        xg = x.detach().clone().requires_grad_(True)
        v = velocity(xg)
        x1 = xg - t.detach().clone() * v
        (corr,) = torch.autograd.grad(x1, xg, grad_outputs=w * (y - x1.detach()))
    return (v.detach() - g * corr).detach()


def integrate_guided(velocity: Callable[[Tensor, int], Tensor], noise: Tensor, dt: Tensor, guide: RTCGuide) -> Tensor:
    """Euler integration with RTC guidance (eager; the dense reference path and the ``vjp`` form).

    Args:
        velocity: ``v(x [1, T, D], step index) -> [1, T, D]``.
        noise: ``[1, T, D]`` x at t = 1. dt: 0-d ``-1/S``. guide: on ``noise``'s device.

    Returns:
        ``[1, T, D]`` float32 normalised actions.
    """
    x = noise.to(torch.float32)
    for i in range(guide.times.shape[0]):
        t, g = guide.times[i], guide.gains[i]
        if guide.vjp:

            def velocity_at(z: Tensor, i: int = i) -> Tensor:
                return velocity(z, i)

            v = vjp_guided_velocity(velocity_at, x, t, g, guide.target, guide.weights)
        else:
            v = guided_velocity(x, velocity(x, i), t, g, guide.target, guide.weights)
        x = x + dt * v
    return x


__all__ = [
    "RTCGuide",
    "prefix_weights",
    "guidance_weights",
    "make_guide",
    "guided_velocity",
    "vjp_guided_velocity",
    "integrate_guided",
]
