"""Reference policies that drive the same scenes as the model, so that a score can be read against them (NAVSIM
reports constant-velocity and ego-status baselines beside a model, and a privileged PDM planner above them).

* `constant-velocity`: the ego keeps the velocity of its last 0.5 s of history
  (`planner.baselines.constant_velocity`), re-planned every tick from the poses AlpaSim sends;
* `stop`: brakes to a standstill along its heading at the controller's full braking, STOP_DECEL_MPS2;
* `route` (privileged): follows the road centreline, which is the route AlpaSim sends, at the scene's speed
  limit (`World.speed_limit_mps`), keeping its distance to the car ahead in its lane with the intelligent driver
  model (IDM: Treiber, Hennecke and Helbing 2000). It reads the road and the scripted traffic's future from the
  world, which no model is given: an upper reference in the manner of NAVSIM's PDM-Closed (centreline + IDM).

Each is a `Driver` (`alpamayo.closed_loop.driver`) that answers `drive` in-process from what the session sent
(and, for `route`, the world); none looks at the cameras, so the runner renders none for them. Their plans have
the model's layout: the current pose, then 64 waypoints 0.1 s apart (local frame, scene clock).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from alpamayo.closed_loop.controller import MAX_ACCEL, MAX_BRAKE
from alpamayo.closed_loop.driver import DrivePlan, Egomotion
from alpamayo.closed_loop.scene import (
    CAR_LENGTH_M,
    EGO_CENTER_AHEAD_M,
    EGO_LENGTH_M,
    START_US,
    TICK_S,
    to_us,
)
from alpamayo.demo_drive.world import LANE_WIDTH_M, World
from alpamayo.prediction import FUTURE_STEPS, HISTORY_STEPS
from alpamayo.rotations import from_frame, quat_heading, to_frame, yaw_to_quat
from planner.baselines import constant_velocity

POLICIES = ("model", "constant-velocity", "stop", "route")
BASELINES = POLICIES[1:]
STOP_DECEL_MPS2 = -MAX_BRAKE
# IDM: maximum acceleration, comfortable deceleration (m/s^2), desired time gap (s), standstill gap (m), and
# the free-road exponent; Treiber's city-traffic values.
IDM_ACCEL, IDM_DECEL, IDM_TIME_GAP_S, IDM_MIN_GAP_M, IDM_DELTA = 1.5, 3.0, 1.5, 2.0, 4
EGO_FRONT_M = EGO_CENTER_AHEAD_M + EGO_LENGTH_M / 2  # rear axle to front bumper


class BaselineDriver:
    """A `Driver` whose plans come from the reference policy `policy` (one of BASELINES) in `world`."""

    def __init__(self, policy: str, world: World):
        if policy not in BASELINES:
            raise ValueError(f"baseline {policy!r} unknown; known: {list(BASELINES)}")
        self.policy, self.world = policy, world
        self._egomotion: Egomotion | None = None

    def start_session(self, session_id: str, seed: int, cameras: Sequence[str]) -> None:
        self._egomotion = None

    def submit_image(
        self, session_id: str, logical_id: str, frame_start_us: int, frame_end_us: int, image: bytes
    ) -> None:
        """Baselines do not look."""

    def submit_egomotion(self, session_id: str, egomotion: Egomotion) -> None:
        self._egomotion = egomotion

    def submit_route(self, session_id: str, timestamp_us: int, waypoints_rig: np.ndarray) -> None:
        """`route` reads the same centreline from the world; the others have no use for it."""

    def drive(self, session_id: str, time_now_us: int, time_query_us: int) -> DrivePlan:
        e = self._egomotion
        if e is None or len(e.timestamps_us) < HISTORY_STEPS:
            empty = np.zeros((0,), dtype=np.int64)
            return DrivePlan(empty, np.zeros((0, 3)), np.zeros((0, 4)))
        now_s = (time_now_us - START_US) / 1e6
        p0, q0 = e.xyz[-1], e.quat_xyzw[-1]
        if self.policy == "constant-velocity":
            history, _ = to_frame(p0, q0, e.xyz[-HISTORY_STEPS:])
            future = from_frame(p0, q0, constant_velocity(history))
        elif self.policy == "stop":
            future = from_frame(p0, q0, _braking(float(e.velocity[-1, 0])))
        else:
            future = self._route(now_s, p0, float(e.velocity[-1, 0]))
        xyz = np.concatenate([p0[None], future])
        return DrivePlan(to_us(now_s + TICK_S * np.arange(FUTURE_STEPS + 1)), xyz, _quats(xyz, q0))

    def close_session(self, session_id: str) -> None:
        self._egomotion = None

    def _route(self, now_s: float, p0: np.ndarray, speed: float) -> np.ndarray:
        """[64, 3] local: IDM along the centreline from the ego's place on it, behind the car ahead in its lane."""
        world = self.world
        s, _ = world.project(p0[:2])
        in_lane = [c for c in world.cars if abs(c.d) < LANE_WIDTH_M / 2 and c.speed >= 0]
        arc = []
        v = speed
        for k in range(FUTURE_STEPS):
            t = now_s + k * TICK_S
            gap, lead_v = np.inf, 0.0
            for car in in_lane:
                car_s = float(car.s_at(t))
                bumpers = car_s - CAR_LENGTH_M / 2 - (s + EGO_FRONT_M)
                if car_s > s and bumpers < gap:
                    gap, lead_v = bumpers, (float(car.s_at(t + TICK_S)) - car_s) / TICK_S
            a = float(np.clip(idm_accel(v, world.speed_limit_mps, gap, lead_v), MAX_BRAKE, MAX_ACCEL))
            v_next = max(0.0, v + a * TICK_S)
            s += 0.5 * (v + v_next) * TICK_S
            v = v_next
            arc.append(s)
        xy, _ = world.at(np.array(arc))
        return np.concatenate([xy, np.full((len(arc), 1), p0[2])], axis=1)


def idm_accel(v: float, v_limit: float, gap_m: float, lead_v: float) -> float:
    """The IDM acceleration (m/s^2) at speed v (m/s) towards v_limit, `gap_m` bumper to bumper behind a car at
    lead_v m/s (gap inf: a free road)."""
    free = 1.0 - (v / v_limit) ** IDM_DELTA
    if not np.isfinite(gap_m):
        return IDM_ACCEL * free
    desired = IDM_MIN_GAP_M + max(
        0.0, v * IDM_TIME_GAP_S + v * (v - lead_v) / (2 * np.sqrt(IDM_ACCEL * IDM_DECEL))
    )
    return IDM_ACCEL * (free - (desired / max(gap_m, 0.1)) ** 2)


def _braking(speed: float) -> np.ndarray:
    """[64, 3] rig frame: straight ahead from `speed` m/s braking at STOP_DECEL_MPS2 to a standstill."""
    t = np.minimum(TICK_S * np.arange(1, FUTURE_STEPS + 1), max(speed, 0.0) / STOP_DECEL_MPS2)
    x = max(speed, 0.0) * t - 0.5 * STOP_DECEL_MPS2 * t**2
    return np.stack([x, np.zeros_like(x), np.zeros_like(x)], axis=1)


def _quats(xyz: np.ndarray, q0: np.ndarray) -> np.ndarray:
    """[T, 4] orientations along the path xyz [T, 3]: the first is q0, each later one faces along the step into
    it (the previous heading where the path stands still)."""
    yaw = [float(quat_heading(q0))]
    for step in np.diff(xyz[:, :2], axis=0):
        yaw.append(float(np.arctan2(step[1], step[0])) if np.hypot(*step) > 1e-6 else yaw[-1])
    out = yaw_to_quat(np.array(yaw))
    out[0] = q0
    return out
