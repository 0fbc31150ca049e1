"""Flow-matching sampling of normalised actions (NVIDIA's `FlowMatching._euler`), with optional navigation
guidance.

    x_0 = noise [K, 64, 2] (randn x temperature);  t_k = linspace(0, 1, N + 1)[k];  dt_k = t_{k+1} - t_k
    x_{k+1} = x_k + dt_k v(x_k, t_k)                                      k = 0 .. N-1 (last v at t = 0.9)
    with guidance w: v = (1 - w) v_unguided + w v_guided                  (w = 1 is pure guided)

t = 0 is noise and t = 1 data; the result is (accel, curvature) normalised by the action-space statistics. x
stays float32 whatever the expert's dtype (its velocity is added to a float32 state, as NVIDIA's is).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from alpamayo.config.expert import ACTION_DIMS
from alpamayo.config.flow import FlowSettings
from alpamayo.generation import row_seeds
from alpamayo.prediction import Cancellation
from alpamayo.profiling.tracer import Tracer

Velocity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # x [K, T, 2], t [K] -> v [K, T, 2]
NOISE_STREAM = 1  # seed stream of the initial noise (stream 0 samples the reasoning tokens)


def initial_noise(rows: int, n_waypoints: int, temperature: float, seed: int | None) -> torch.Tensor:
    """randn [rows, n_waypoints, 2] float32 x temperature; row i from its own generator, so sample i's noise
    depends only on (seed, i) (seed None: fresh entropy)."""
    seeds = row_seeds(seed, rows, stream=NOISE_STREAM)
    draws = [torch.randn(n_waypoints, ACTION_DIMS, generator=torch.Generator().manual_seed(s)) for s in seeds]
    return torch.stack(draws) * temperature


def check_noise(noise: torch.Tensor | np.ndarray, rows: int, n_waypoints: int) -> torch.Tensor:
    """An explicit initial noise as float32 [rows, n_waypoints, 2]; ValueError naming the shape or the first
    non-finite element."""
    x = torch.as_tensor(noise)
    expected = (rows, n_waypoints, ACTION_DIMS)
    if tuple(x.shape) != expected:
        raise ValueError(
            f"initial noise must have shape {list(expected)} (samples, waypoints, accel/curvature), "
            f"got {list(x.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"initial noise must be floating point, got {x.dtype}")
    bad = ~torch.isfinite(x)
    if bad.any():
        where = [int(i) for i in bad.nonzero()[0]]
        raise ValueError(f"initial noise must be finite; element {where} is {float(x[tuple(where)])}")
    return x.float()


def euler_sample(
    x0: torch.Tensor,
    steps: int,
    velocity: Velocity,
    unguided: Velocity | None = None,
    guidance: float = 1.0,
    tracer: Tracer | None = None,
    cancel: Cancellation | None = None,
) -> torch.Tensor:
    """Integrate x0 [K, T, 2] float32 from t = 0 to 1 in `steps` Euler steps -> [K, T, 2] float32.

    With `unguided`, each step mixes (1 - guidance) unguided + guidance guided velocities (two forwards). With a
    tracer, each step is an `expert_step` span (args: step, t). `cancel` is checked before each step.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"flow steps must be an integer >= 1, got {steps!r}")
    times = torch.linspace(0.0, 1.0, steps + 1)
    x = x0.float()
    rows = x.shape[0]
    tracer = tracer or Tracer(enabled=False)
    cancel = cancel or Cancellation()
    for k in range(steps):
        cancel.check()
        t = times[k].expand(rows)
        with tracer.span("expert_step", step=k, t=float(times[k])):
            v = velocity(x, t)
            if unguided is not None:
                v = (1 - guidance) * unguided(x, t) + guidance * v
            # dt as a [1, 1, 1] tensor, not a 0-dim one, so that dt * v promotes a bfloat16 v to float32
            # as NVIDIA's [K, 1, 1] dt does (a 0-dim float32 tensor would keep v's dtype).
            x = x + (times[k + 1] - times[k]).view(1, 1, 1) * v.to(x.device)
    return x


def noise_for(
    rows: int,
    n_waypoints: int,
    settings: FlowSettings,
    seed: int | None,
    noise: torch.Tensor | np.ndarray | None = None,
) -> torch.Tensor:
    """The initial noise of one sampling: `noise` when given (checked), else `initial_noise`."""
    if noise is not None:
        return check_noise(noise, rows, n_waypoints)
    return initial_noise(rows, n_waypoints, settings.temperature, seed)
