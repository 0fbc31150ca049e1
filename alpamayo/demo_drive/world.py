"""The synthetic drive's world, deterministic from a seed: a curving three-lane road, the ego car driving the
centre lane, other cars, and roadside poles, signs and trees.

World frame: x east, y north, z up, metres, flat ground at z = 0. The road centreline is the ego path, so road
curvature and ego yaw rate always agree (yaw rate = curvature x speed). Lanes are 3.6 m wide: the ego lane in
the middle, a same-direction lane on the right and an oncoming lane on the left.

A script (SCRIPTS) replaces the seed's road and traffic with a situation that tells driving policies apart; the
recorded ego (the log) drives it safely at SCRIPT_SPEED_MPS, and the seed still draws the colours and the
roadside. Times are world seconds (the closed loop takes over at 1.5 s):
  * `lead-brakes`: a straight road; the lead car, LEAD_GAP_M ahead at the ego's speed, brakes at
    LEAD_BRAKE_MPS2 to a standstill from BRAKE_AT_S; the recorded ego brakes with it;
  * `curve`: straight, then from CURVE_START_M of arc length a bend to the left through CURVE_TURN_RAD at
    radius CURVE_RADIUS_M (curvature rising and falling linearly over CURVE_RAMP_M), then straight again; the
    lead car keeps the ego's speed 30 m ahead;
  * `stopped-car`: a straight road with a car standing in the ego lane STOPPED_CAR_M ahead of the ego's start;
    the recorded ego brakes at EGO_BRAKE_MPS2 from BRAKE_AT_S and stands 10 m (rear axle to the car's centre)
    behind it.
Scripted scenes carry only their script's car: no other traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LANE_WIDTH_M = 3.6
ROAD_HALF_WIDTH_M = 1.5 * LANE_WIDTH_M
SHOULDER_M = 1.6
PATH_STEP_M = 0.5
PATH_BEHIND_M = 60.0  # the path starts this far behind the ego start (side and rear cameras see it)
VIEW_AHEAD_M = 420.0  # the path extends this far beyond the last pose (the renderer draws 400 m ahead)

SCRIPTS = ("lead-brakes", "curve", "stopped-car")
SCRIPT_SPEED_MPS = 12.0  # 43 km/h: the recorded ego's speed and the speed limit of a scripted scene
BRAKE_AT_S = 2.0  # half a second after the closed loop takes over
LEAD_GAP_M, LEAD_BRAKE_MPS2 = 20.0, 6.0  # an emergency stop 20 m ahead (14 m bumper to bumper)
CURVE_START_M, CURVE_RAMP_M, CURVE_RADIUS_M = 24.0, 10.0, 40.0  # 3.6 m/s^2 lateral at 12 m/s
CURVE_TURN_RAD = np.pi / 2
STOPPED_CAR_M, EGO_BRAKE_MPS2 = 58.0, 3.0


PALETTE = ((180, 30, 30), (30, 60, 150), (220, 220, 225), (30, 30, 35), (120, 120, 125), (200, 160, 40))


@dataclass(frozen=True)
class Box:
    """An axis-aligned box in its own frame, placed at arc length `s` (m) and lateral offset `d` (m, left
    positive) of the centreline, yawed `yaw_offset` from the road direction. size = (length, width, height),
    `z0` the bottom height, `color` RGB."""

    s: float
    d: float
    size: tuple[float, float, float]
    z0: float
    color: tuple[int, int, int]
    yaw_offset: float = 0.0


def braking_arc(s0: float, speed: float, t: np.ndarray | float, brake: tuple[float, float] | None):
    """Arc length (m) at times t (s) of a body at s0 at t = 0 moving at `speed` m/s that, with `brake`
    (from_s, decel_mps2), brakes from time from_s at decel_mps2 to a standstill and stays there."""
    t = np.asarray(t, dtype=np.float64)
    s = s0 + speed * t
    if brake is not None:
        from_s, decel = brake
        dt = np.clip(t - from_s, 0.0, speed / decel)
        s = np.where(t > from_s, s0 + speed * from_s + speed * dt - 0.5 * decel * dt**2, s)
    return s if s.ndim else float(s)


@dataclass(frozen=True)
class Car:
    """A car moving along its lane: arc length s0 + speed * t (speed negative for oncoming traffic), braking to a
    standstill from brake = (from_s, decel_mps2) when set (same-direction cars only)."""

    s0: float
    d: float
    speed: float
    color: tuple[int, int, int]
    brake: tuple[float, float] | None = None

    def s_at(self, t: np.ndarray | float) -> np.ndarray | float:
        """Arc length (m) of the car's centre at world times t (s)."""
        return braking_arc(self.s0, self.speed, t, self.brake)

    def boxes(self, t: float) -> list[Box]:
        s = float(self.s_at(t))
        yaw = np.pi if self.speed < 0 else 0.0
        glass = (40, 48, 60)
        return [
            Box(s, self.d, (4.5, 1.85, 0.75), 0.3, self.color, yaw),
            Box(s - (0.3 if self.speed >= 0 else -0.3), self.d, (2.4, 1.6, 0.55), 1.05, glass, yaw),
        ]


class World:
    """Road path sampled every PATH_STEP_M of arc length, the ego speed profile, cars and static objects; a
    `script` (SCRIPTS) replaces the road and traffic with its situation (see the module docstring)."""

    def __init__(self, seed: int, duration_s: float, script: str | None = None):
        if script is not None and script not in SCRIPTS:
            raise ValueError(f"script {script!r} unknown; known: {list(SCRIPTS)}")
        self.script = script
        rng = np.random.default_rng(seed)
        # Speed v(t) = v0 + dv sin(2 pi t / T + phi): urban-to-rural speeds, gentle +-1.5 m/s^2 at most.
        self.v0 = float(rng.uniform(9.0, 14.0))
        self.dv = float(rng.uniform(0.5, 2.0))
        self.period = float(rng.uniform(8.0, 16.0))
        self.phase = float(rng.uniform(0, 2 * np.pi))
        # Curvature kappa(s): a long bend plus a shorter wiggle; |kappa| < 0.014 1/m (radius > 70 m), so the
        # lateral acceleration v^2 kappa stays under about 3 m/s^2.
        amps = (rng.uniform(0.004, 0.010), rng.uniform(0.001, 0.004))
        lengths = (rng.uniform(250.0, 500.0), rng.uniform(80.0, 160.0))
        phases = rng.uniform(0, 2 * np.pi, size=2)
        # The recorded ego's braking (from_s, decel) of a script, and the scene's speed limit: the top of the
        # recorded speed (the route reference drives at it).
        self.brake: tuple[float, float] | None = None
        if script is not None:
            self.v0, self.dv = SCRIPT_SPEED_MPS, 0.0
            if script == "lead-brakes":
                self.brake = (BRAKE_AT_S, LEAD_BRAKE_MPS2)
            elif script == "stopped-car":
                self.brake = (BRAKE_AT_S, EGO_BRAKE_MPS2)
        self.speed_limit_mps = self.v0 + self.dv
        length = self.arc_length(duration_s) + VIEW_AHEAD_M
        self.s = np.arange(-PATH_BEHIND_M, length + PATH_STEP_M, PATH_STEP_M)
        if script is None:
            kappa = sum(
                a * np.sin(2 * np.pi * self.s / lam + ph)
                for a, lam, ph in zip(amps, lengths, phases, strict=True)
            )
        elif script == "curve":
            # each ramp turns CURVE_RAMP_M / (2 R); the constant part the rest of CURVE_TURN_RAD
            end = CURVE_START_M + CURVE_RAMP_M + CURVE_TURN_RAD * CURVE_RADIUS_M
            rise = np.clip((self.s - CURVE_START_M) / CURVE_RAMP_M, 0.0, 1.0)
            fall = np.clip((end - self.s) / CURVE_RAMP_M, 0.0, 1.0)
            kappa = np.minimum(rise, fall) / CURVE_RADIUS_M
        else:
            kappa = np.zeros_like(self.s)
        heading0 = float(rng.uniform(-np.pi, np.pi))
        # Heading and position integrated with the trapezoidal rule from the ego start (s = 0).
        yaw = np.concatenate([[0.0], np.cumsum(0.5 * (kappa[1:] + kappa[:-1]) * PATH_STEP_M)])
        start = round(PATH_BEHIND_M / PATH_STEP_M)
        self.yaw = yaw - yaw[start] + heading0
        dx, dy = np.cos(self.yaw), np.sin(self.yaw)
        x = np.concatenate([[0.0], np.cumsum(0.5 * (dx[1:] + dx[:-1]) * PATH_STEP_M)])
        y = np.concatenate([[0.0], np.cumsum(0.5 * (dy[1:] + dy[:-1]) * PATH_STEP_M)])
        self.xy = np.stack([x - x[start], y - y[start]], axis=1)
        self.cars = self._cars(rng, length) if script is None else self._scripted_cars(rng)
        self.statics = self._statics(rng, length)

    def arc_length(self, t: np.ndarray | float) -> np.ndarray | float:
        """Ego arc length (m) at time t (s): the integral of v(t)."""
        if self.brake is not None:  # scripts drive at a constant speed before braking
            return braking_arc(0.0, self.v0, t, self.brake)
        w = 2 * np.pi / self.period
        return self.v0 * t + self.dv / w * (np.cos(self.phase) - np.cos(w * np.asarray(t) + self.phase))

    def at(self, s: np.ndarray, d: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """World xy [..., 2] and road yaw [...] at arc length s offset d metres to the left of the centreline."""
        s = np.clip(np.asarray(s, dtype=np.float64), self.s[0], self.s[-1])
        yaw = np.interp(s, self.s, self.yaw)
        xy = np.stack([np.interp(s, self.s, self.xy[:, 0]), np.interp(s, self.s, self.xy[:, 1])], axis=-1)
        normal = np.stack([-np.sin(yaw), np.cos(yaw)], axis=-1)
        return xy + np.asarray(d)[..., None] * normal, yaw

    def project(self, xy: np.ndarray) -> tuple[float, float]:
        """(arc length s, lateral offset d left of the centreline), metres, of the world point xy [2]: the
        nearest path sample refined along its tangent (the path is sampled every PATH_STEP_M)."""
        xy = np.asarray(xy, dtype=np.float64)
        i = int(np.argmin(np.sum((self.xy - xy) ** 2, axis=1)))
        tangent = np.array([np.cos(self.yaw[i]), np.sin(self.yaw[i])])
        delta = xy - self.xy[i]
        along = float(np.clip(delta @ tangent, -PATH_STEP_M, PATH_STEP_M))
        return float(self.s[i]) + along, float(delta @ np.array([-tangent[1], tangent[0]]))

    def ego_pose(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Ego rear-axle position xyz [N, 3] (on the ground) and yaw [N] at times t [N] seconds."""
        xy, yaw = self.at(self.arc_length(np.asarray(t, dtype=np.float64)))
        return np.concatenate([xy, np.zeros((len(xy), 1))], axis=1), yaw

    def _cars(self, rng: np.random.Generator, length: float) -> list[Car]:
        # The lead car keeps the ego's mean speed 30 m ahead, so the gap only breathes with the ego speed.
        cars = [Car(30.0, 0.0, self.v0, PALETTE[int(rng.integers(len(PALETTE)))])]
        s = float(rng.uniform(15.0, 60.0))
        while s < length:  # slower traffic on the right that the ego overtakes
            cars.append(
                Car(s, -LANE_WIDTH_M, self.v0 - float(rng.uniform(2.0, 4.0)), PALETTE[int(rng.integers(6))])
            )
            s += float(rng.uniform(70.0, 130.0))
        s = float(rng.uniform(40.0, 90.0))
        while s < 2 * length:  # oncoming traffic on the left
            cars.append(
                Car(s, LANE_WIDTH_M, -self.v0 * float(rng.uniform(0.8, 1.2)), PALETTE[int(rng.integers(6))])
            )
            s += float(rng.uniform(60.0, 140.0))
        return cars

    def _scripted_cars(self, rng: np.random.Generator) -> list[Car]:
        color = PALETTE[int(rng.integers(len(PALETTE)))]
        if self.script == "lead-brakes":
            return [Car(LEAD_GAP_M, 0.0, self.v0, color, (BRAKE_AT_S, LEAD_BRAKE_MPS2))]
        if self.script == "stopped-car":
            return [Car(STOPPED_CAR_M, 0.0, 0.0, color)]
        return [Car(30.0, 0.0, self.v0, color)]

    def _statics(self, rng: np.random.Generator, length: float) -> list[Box]:
        boxes = []
        edge = ROAD_HALF_WIDTH_M + SHOULDER_M
        for s in np.arange(-PATH_BEHIND_M + 20.0, length, 50.0):  # poles with a sign on the right
            boxes.append(Box(float(s), -(edge + 1.0), (0.15, 0.15, 3.2), 0.0, (110, 110, 115)))
            boxes.append(Box(float(s), -(edge + 1.0), (0.08, 1.2, 0.8), 2.2, (30, 110, 60)))
        s = -PATH_BEHIND_M
        while s < length:  # trees on both sides
            side = 1.0 if rng.random() < 0.5 else -1.0
            d = side * (edge + float(rng.uniform(3.0, 9.0)))
            height = float(rng.uniform(3.0, 6.0))
            green = (int(rng.integers(40, 70)), int(rng.integers(95, 135)), int(rng.integers(35, 60)))
            boxes.append(Box(s, d, (0.4, 0.4, height * 0.5), 0.0, (95, 70, 45)))
            boxes.append(Box(s, d, (2.6, 2.6, height * 0.6), height * 0.4, green))
            s += float(rng.uniform(8.0, 30.0))
        return boxes
