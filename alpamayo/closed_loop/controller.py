"""How the ego follows a plan: pure pursuit for steering and a first-order speed loop, applied at 10 Hz to a
kinematic bicycle.

State: rear-axle position (x, y) metres in the world frame, yaw rad, speed v m/s. Each tick (TICK_S) the
controller reads the latest plan (world xy [T, 2] at times [T] s, without the current pose):
  * steering: the point LOOKAHEAD_S x v ahead along the plan (at least MIN_LOOKAHEAD_M) at angle alpha from the
    heading gives delta = atan(2 WHEELBASE sin(alpha) / distance), clipped to +-MAX_STEER_RAD;
  * speed: the plan's mean speed over its first SPEED_WINDOW_S is the target; a = (target - v) / SPEED_TAU_S,
    clipped to [MAX_BRAKE, MAX_ACCEL];
then the bicycle integrates x' = v cos(yaw), y' = v sin(yaw), yaw' = v tan(delta) / WHEELBASE, v' = a with
SUBSTEPS Euler steps over the tick (speed never below 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from alpamayo.closed_loop.scene import TICK_S

WHEELBASE_M = 2.85
LOOKAHEAD_S, MIN_LOOKAHEAD_M = 1.0, 4.0
MAX_STEER_RAD = 0.6
SPEED_WINDOW_S, SPEED_TAU_S = 1.0, 0.5
MAX_ACCEL, MAX_BRAKE = 3.0, -6.0  # m/s^2
SUBSTEPS = 10


@dataclass(frozen=True)
class EgoState:
    """Rear-axle x, y (m, world), yaw (rad), speed v (m/s)."""

    x: float
    y: float
    yaw: float
    v: float

    @property
    def xy(self) -> np.ndarray:
        return np.array([self.x, self.y])


def controls(state: EgoState, plan_t_s: np.ndarray, plan_xy: np.ndarray, now_s: float) -> tuple[float, float]:
    """(acceleration m/s^2, steering angle rad) following the plan: times plan_t_s [T] (world s, after now_s),
    rear-axle positions plan_xy [T, 2]."""
    path = np.concatenate([state.xy[None], plan_xy])
    t = np.concatenate([[now_s], plan_t_s])
    arc = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(path, axis=0), axis=1))])
    ahead = max(MIN_LOOKAHEAD_M, LOOKAHEAD_S * state.v)
    target = np.array([np.interp(min(ahead, arc[-1]), arc, path[:, i]) for i in (0, 1)])
    delta_xy = target - state.xy
    distance = float(np.linalg.norm(delta_xy))
    if distance < 1e-6:
        steer = 0.0
    else:
        alpha = np.arctan2(delta_xy[1], delta_xy[0]) - state.yaw
        steer = float(np.arctan2(2 * WHEELBASE_M * np.sin(alpha), distance))
    window = min(SPEED_WINDOW_S, float(t[-1] - now_s))
    target_v = float(np.interp(window, t - now_s, arc)) / window if window > 0 else 0.0
    accel = float(np.clip((target_v - state.v) / SPEED_TAU_S, MAX_BRAKE, MAX_ACCEL))
    return accel, float(np.clip(steer, -MAX_STEER_RAD, MAX_STEER_RAD))


def step(state: EgoState, accel: float, steer: float, dt: float = TICK_S) -> EgoState:
    """The bicycle `dt` seconds later under constant (accel, steer)."""
    x, y, yaw, v = state.x, state.y, state.yaw, state.v
    h = dt / SUBSTEPS
    for _ in range(SUBSTEPS):
        x += v * np.cos(yaw) * h
        y += v * np.sin(yaw) * h
        yaw += v * np.tan(steer) / WHEELBASE_M * h
        v = max(0.0, v + accel * h)
    return EgoState(float(x), float(y), float(yaw), float(v))
