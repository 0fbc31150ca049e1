"""Physics baselines for open-loop accuracy: what a model must beat to be worth its latency.

Constant velocity is the standard reference in trajectory-prediction benchmarks: the ego keeps the velocity
vector it had over the last `window` history steps.
"""

from __future__ import annotations

import numpy as np

from alpamayo.prediction import DT_S, FUTURE_STEPS, HISTORY_STEPS
from planner.checks import require_finite, require_shape

CV_WINDOW_STEPS = 5  # 0.5 s: long enough to average out pose noise, short enough to follow a speed change


def constant_velocity(history_xyz: np.ndarray, window: int = CV_WINDOW_STEPS, dt: float = DT_S) -> np.ndarray:
    """history_xyz [16, 3] metres (t0 ego frame, oldest first) -> future [64, 3] at t = 0.1 .. 6.4 s."""
    xyz = np.asarray(history_xyz, dtype=np.float64)
    require_shape("history_xyz", xyz, (HISTORY_STEPS, 3))
    require_finite("history_xyz", xyz)
    if not 1 <= window < HISTORY_STEPS:
        raise ValueError(f"window must be in [1, {HISTORY_STEPS - 1}] steps, got {window}")
    velocity = (xyz[-1] - xyz[-1 - window]) / (window * dt)
    velocity[2] = 0.0  # keep the ground height, as the rollout does
    t = dt * np.arange(1, FUTURE_STEPS + 1)
    return xyz[-1] + t[:, None] * velocity
