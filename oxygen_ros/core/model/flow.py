"""Flow-matching pieces of π0.5: the sin-cos time embedding and the Euler sampler.

Follows openpi ``models_pytorch/pi0_pytorch.py`` (``create_sinusoidal_pos_embedding``,
``sample_actions``): noise at t = 1, integrate ``x <- x + dt * v(x, t)`` with ``dt = -1/S`` down to
t = 0, the time accumulated in float32 exactly as openpi does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor


def sinusoidal_time_embedding(t: Tensor, dim: int, min_period: float, max_period: float) -> Tensor:
    """Sin-cos embedding of flow time.

    Args:
        t: ``[B]`` flow time in [0, 1].
        dim: embedding size (even); periods span ``min_period … max_period`` geometrically.

    Returns:
        ``[B, dim]`` float32 ``[sin(2π t / period) ‖ cos(2π t / period)]``.

    Raises:
        ValueError: odd ``dim``.
    """
    if dim % 2:
        raise ValueError(f"time embedding dim must be even, got {dim}")
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    arg = (2.0 * math.pi / period)[None, :] * t.to(torch.float64)[:, None]
    return torch.cat([torch.sin(arg), torch.cos(arg)], dim=1).to(torch.float32)


def euler_integrate(velocity: Callable[[Tensor, Tensor], Tensor], noise: Tensor, num_steps: int) -> Tensor:
    """Integrate the flow from t = 1 (noise) to t = 0 in ``num_steps`` Euler steps.

    Args:
        velocity: ``v(x_t [B, H, A], t [B]) -> [B, H, A]``.
        noise: ``[B, H, A]`` float32 initial sample.
        num_steps: S ≥ 1.

    Returns:
        ``[B, H, A]`` float32 denoised actions (normalised units).

    Raises:
        ValueError: ``num_steps < 1``.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32, device=noise.device)
    t = torch.tensor(1.0, dtype=torch.float32, device=noise.device)
    x = noise.to(torch.float32)
    for _ in range(num_steps):
        v = velocity(x, t.expand(x.shape[0]))
        x = x + dt * v.to(torch.float32)
        t = t + dt
    return x


def euler_times(num_steps: int, device: torch.device | str = "cpu") -> tuple[list[Tensor], Tensor]:
    """The flow times ``t_0 = 1, t_{i+1} = t_i + dt`` (float32 accumulation, as
    :func:`euler_integrate`) and ``dt = -1/S`` — the frame constants of the S denoise steps.

    Raises:
        ValueError: ``num_steps < 1``.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32, device=device)
    t = torch.tensor(1.0, dtype=torch.float32, device=device)
    out = []
    for _ in range(num_steps):
        out.append(t)
        t = t + dt
    return out, dt
