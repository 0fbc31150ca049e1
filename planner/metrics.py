"""Open-loop planning metrics over the XY plane (Alpamayo's `MinADECalculator` convention) and comfort figures.

Trajectories are [..., T, 3] (or [..., T, 2]) metres in the t0 ego frame, waypoint i at t = (i + 1) dt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from alpamayo.prediction import DT_S
from planner.checks import require_finite
from planner.ego_frame import unwrap

HORIZONS_S = (1.0, 2.0, 3.0, 6.4)

# Comfort limits of Alpamayo's RL comfort reward (NVlabs/alpamayo finetune/rl/rewards/comfort_reward.py).
MAX_ABS_JERK = 8.37  # m/s^3
MAX_ABS_LAT_ACCEL = 4.89  # m/s^2
LON_ACCEL_RANGE = (-4.05, 2.40)  # m/s^2
MAX_ABS_YAW_RATE = 0.95  # rad/s


def _xy(name: str, trajectory: np.ndarray) -> np.ndarray:
    trajectory = np.asarray(trajectory, dtype=np.float64)
    if trajectory.ndim < 2 or trajectory.shape[-1] not in (2, 3):
        raise ValueError(f"{name} must have shape [..., T, 2 or 3], got {list(trajectory.shape)}")
    require_finite(name, trajectory)
    return trajectory[..., :2]


def displacement(pred: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """XY distance per waypoint: pred [..., T, 2|3], gt [T, 2|3] -> [..., T] metres."""
    p, g = _xy("pred", pred), _xy("gt", gt)
    if p.shape[-2] != g.shape[-2]:
        raise ValueError(f"pred has {p.shape[-2]} waypoints but gt has {g.shape[-2]}")
    return np.linalg.norm(p - g, axis=-1)


def horizon_steps(horizon_s: float, n_waypoints: int, dt: float = DT_S) -> int:
    """Number of waypoints covering `horizon_s` seconds (waypoint i is at (i + 1) dt)."""
    steps = round(horizon_s / dt)
    if not 1 <= steps <= n_waypoints or abs(steps * dt - horizon_s) > 1e-6:
        raise ValueError(
            f"horizon {horizon_s} s must be a multiple of dt = {dt} s in [{dt}, {n_waypoints * dt:.1f}] s"
        )
    return steps


def ade(pred: np.ndarray, gt: np.ndarray, horizon_s: float | None = None) -> np.ndarray:
    """Average XY displacement over the first `horizon_s` seconds (all waypoints by default): [...] metres."""
    d = displacement(pred, gt)
    steps = d.shape[-1] if horizon_s is None else horizon_steps(horizon_s, d.shape[-1])
    return d[..., :steps].mean(axis=-1)


def fde(pred: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """XY displacement at the last waypoint: [...] metres."""
    return displacement(pred, gt)[..., -1]


def min_ade(preds: np.ndarray, gt: np.ndarray) -> tuple[float, int]:
    """minADE_K: the smallest ADE over K samples preds [K, T, 2|3], and the index of that sample."""
    per_sample = ade(preds, gt)
    if per_sample.ndim != 1:
        raise ValueError(f"preds must have shape [K, T, 2|3], got {list(np.shape(preds))}")
    best = int(np.argmin(per_sample))
    return float(per_sample[best]), best


def min_ade_at_horizons(
    preds: np.ndarray, gt: np.ndarray, horizons_s: tuple[float, ...] = HORIZONS_S
) -> dict[float, float]:
    """minADE_K over the first h seconds, NVIDIA's way (NVlabs/alpamayo `compute_minade`): the sample is the
    one with the smallest ADE over the whole trajectory (`min_ade`), and each horizon reports that sample's
    ADE, not a per-horizon best. preds [K, T, 2|3], gt [T, 2|3] -> {horizon_s: metres}."""
    _, best = min_ade(preds, gt)
    return {h: float(ade(preds[best], gt, h)) for h in horizons_s}


def horizon_errors(
    pred: np.ndarray, gt: np.ndarray, horizons_s: tuple[float, ...] = HORIZONS_S
) -> dict[float, np.ndarray]:
    """XY displacement at each horizon (1, 2, 3 and 6.4 s by default): {horizon_s: [...] metres}."""
    d = displacement(pred, gt)
    return {h: d[..., horizon_steps(h, d.shape[-1]) - 1] for h in horizons_s}


@dataclass(frozen=True)
class Comfort:
    """Peak dynamics of one trajectory, from finite differences that start at the t0 pose (origin, yaw 0).

    Speed is the XY step length over dt; longitudinal acceleration and jerk are its 1st and 2nd differences;
    lateral (centripetal) acceleration is speed x yaw rate.
    """

    max_abs_jerk: float  # m/s^3
    max_abs_lat_accel: float  # m/s^2
    min_lon_accel: float  # m/s^2
    max_lon_accel: float  # m/s^2
    max_abs_yaw_rate: float  # rad/s

    @property
    def within_limits(self) -> bool:
        """All figures inside the comfort limits of Alpamayo's RL comfort reward."""
        return (
            self.max_abs_jerk <= MAX_ABS_JERK
            and self.max_abs_lat_accel <= MAX_ABS_LAT_ACCEL
            and LON_ACCEL_RANGE[0] <= self.min_lon_accel
            and self.max_lon_accel <= LON_ACCEL_RANGE[1]
            and self.max_abs_yaw_rate <= MAX_ABS_YAW_RATE
        )


def comfort(xyz: np.ndarray, heading: np.ndarray, dt: float = DT_S) -> Comfort:
    """Comfort figures of a trajectory xyz [T, 2|3] with heading [T] rad (t0 frame), T >= 3."""
    xy = _xy("xyz", xyz)
    heading = np.asarray(heading, dtype=np.float64)
    if xy.ndim != 2 or heading.shape != xy.shape[:1] or len(heading) < 3:
        raise ValueError(
            f"comfort needs xyz [T, 2|3] and heading [T] with T >= 3, got {list(np.shape(xyz))} and "
            f"{list(heading.shape)}"
        )
    require_finite("heading", heading)
    xy = np.concatenate([np.zeros((1, 2)), xy])
    yaw = unwrap(np.concatenate([[0.0], heading]))
    speed = np.linalg.norm(np.diff(xy, axis=0), axis=-1) / dt
    lon_accel = np.diff(speed) / dt
    yaw_rate = np.diff(yaw) / dt
    return Comfort(
        max_abs_jerk=float(np.abs(np.diff(lon_accel) / dt).max()),
        max_abs_lat_accel=float(np.abs(speed * yaw_rate).max()),
        min_lon_accel=float(lon_accel.min()),
        max_lon_accel=float(lon_accel.max()),
        max_abs_yaw_rate=float(np.abs(yaw_rate).max()),
    )
