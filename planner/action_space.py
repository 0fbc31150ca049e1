"""Unicycle action space: per-waypoint (acceleration m/s^2, curvature 1/m) at dt = 0.1 s, in the t0 ego frame.

Rollout (actions -> trajectory), starting at the origin with heading 0 and speed v0:
    v[i+1]     = v[i] + a[i] dt
    theta[i+1] = theta[i] + k[i] (v[i] dt + a[i] dt^2 / 2)          (arc length of the step times curvature)
    p[i+1]     = p[i] + dt / 2 (v[i] u(theta[i]) + v[i+1] u(theta[i+1])),  u(t) = (cos t, sin t)   (trapezoid)
    z          = z at t0 (0 in the t0 frame)
The inverse (trajectory -> actions, for ground-truth tokens) and the v0 estimate solve the same relations by
Tikhonov-regularised least squares, as Alpamayo's `UnicycleAccelCurvatureActionSpace` does: speed and heading
with a 3rd-order smoothness penalty (lambda / dt^6), acceleration and curvature with a 2nd-order one
(lambda / dt^4), plus a small ridge, each a dense SPD system of at most 65 unknowns (float64).
"""

from __future__ import annotations

import numpy as np

from alpamayo.prediction import HISTORY_STEPS
from planner.checks import require_finite, require_shape
from planner.ego_frame import LocalHistory, unwrap
from planner.settings import ActionSpaceSettings


def smoothness_penalty(n: int, order: int, weight: float, dt: float) -> np.ndarray:
    """[n, n] = weight / dt^(2 order) * D^T D, with D the order-th finite-difference operator [n - order, n]."""
    d = np.diff(np.eye(n), n=order, axis=0)
    return weight / dt ** (2 * order) * d.T @ d


def regularised_least_squares(
    design: np.ndarray,
    target: np.ndarray,
    penalty: np.ndarray,
    ridge: float,
    first: float | None = None,
) -> np.ndarray:
    """argmin_x |design x - target|^2 + x^T penalty x + ridge |x_free|^2.

    With `first`, x[0] is pinned to that value and only x[1:] is solved for (the smoothness penalty still
    couples x[1] to it). design [m, n], target [m], penalty [n, n] -> x [n].
    """
    if first is None:
        lhs = design.T @ design + penalty + ridge * np.eye(design.shape[1])
        return np.linalg.solve(lhs, design.T @ target)
    a0, a1 = design[:, 0], design[:, 1:]
    lhs = a1.T @ a1 + penalty[1:, 1:] + ridge * np.eye(a1.shape[1])
    rhs = a1.T @ (target - a0 * first) - penalty[1:, 0] * first
    return np.concatenate([[first], np.linalg.solve(lhs, rhs)])


def _trapezoid_design(theta: np.ndarray) -> np.ndarray:
    """[2N, N+1] matrix A with A v = interleaved (v[i] cos theta[i] + v[i+1] cos theta[i+1], same with sin)."""
    n = len(theta) - 1
    design = np.zeros((2 * n, n + 1))
    rows = np.arange(n)
    for axis, fn in enumerate((np.cos, np.sin)):
        design[2 * rows + axis, rows] = fn(theta[:-1])
        design[2 * rows + axis, rows + 1] = fn(theta[1:])
    return design


class UnicycleActionSpace:
    """Rollout and inverse of the unicycle model with the checkpoint's `ActionSpaceSettings`."""

    def __init__(self, settings: ActionSpaceSettings | None = None):
        self.settings = settings = settings or ActionSpaceSettings()
        self.dt, self.n_waypoints = settings.dt, settings.n_waypoints

    def _speeds(self, dxy: np.ndarray, theta: np.ndarray, v0: float | None) -> np.ndarray:
        """Speeds [N+1] at the poses whose headings are theta [N+1] and steps dxy [N, 2]; v[0] = v0 if given."""
        s = self.settings
        design = _trapezoid_design(theta)
        penalty = smoothness_penalty(len(theta), 3, s.v_lambda, self.dt)
        return regularised_least_squares(design, 2 / self.dt * dxy.reshape(-1), penalty, s.v_ridge, v0)

    def estimate_v0(self, history: LocalHistory) -> float:
        """Speed at t0 (m/s) from the 16 history positions and headings (t0 frame)."""
        xyz, yaw = np.asarray(history.xyz, dtype=np.float64), history.yaw
        require_shape("history xyz", xyz, (HISTORY_STEPS, 3))
        require_finite("history xyz", xyz)
        require_finite("history yaw", yaw)
        return float(self._speeds(np.diff(xyz[:, :2], axis=0), yaw, None)[-1])

    def _check_actions(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions, dtype=np.float64)
        if actions.shape[-2:] != (self.n_waypoints, 2):
            raise ValueError(
                f"actions must have shape [..., {self.n_waypoints}, 2], got {list(actions.shape)}"
            )
        require_finite("actions", actions)
        return actions

    def denormalise(self, normalised: np.ndarray) -> np.ndarray:
        """Actions normalised by the action-space statistics (the flow-matching expert's output) [..., 64, 2]
        -> (acceleration m/s^2, curvature 1/m) float64: a * std + mean per column. No clipping (NVIDIA's
        bounds only flag out-of-range actions)."""
        s = self.settings
        std, mean = np.array([s.accel_std, s.curvature_std]), np.array([s.accel_mean, s.curvature_mean])
        return self._check_actions(normalised) * std + mean

    def rollout(self, actions: np.ndarray, v0: float, z0: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """actions [..., 64, 2] -> (xyz [..., 64, 3] metres, heading [..., 64] rad), t0 ego frame."""
        actions = self._check_actions(actions)
        require_finite("v0 and z0", np.array([v0, z0], dtype=np.float64))
        dt, accel, kappa = self.dt, actions[..., 0], actions[..., 1]
        lead = accel.shape[:-1]
        speed = np.concatenate([np.full((*lead, 1), v0), v0 + np.cumsum(accel * dt, axis=-1)], axis=-1)
        turn = kappa * (speed[..., :-1] * dt + accel * dt**2 / 2)
        theta = np.concatenate([np.zeros((*lead, 1)), np.cumsum(turn, axis=-1)], axis=-1)
        half = dt / 2
        x = np.cumsum(
            half * (speed[..., :-1] * np.cos(theta[..., :-1]) + speed[..., 1:] * np.cos(theta[..., 1:])), -1
        )
        y = np.cumsum(
            half * (speed[..., :-1] * np.sin(theta[..., :-1]) + speed[..., 1:] * np.sin(theta[..., 1:])), -1
        )
        xyz = np.stack([x, y, np.full_like(x, z0)], axis=-1)
        return xyz, theta[..., 1:]

    def actions_from_trajectory(self, xyz: np.ndarray, heading: np.ndarray, v0: float) -> np.ndarray:
        """Ground-truth future xyz [64, 3] and heading [64] (t0 frame) and the t0 speed -> actions [64, 2].

        Heading is smoothed with the t0 heading (0) pinned, speeds are fitted to the trapezoidal steps with v0
        pinned, then accel = dv/dt and curvature = dtheta / (v dt + a dt^2 / 2) are fitted with smoothness.
        """
        s, dt, n = self.settings, self.dt, self.n_waypoints
        xyz, heading = np.asarray(xyz, dtype=np.float64), np.asarray(heading, dtype=np.float64)
        require_shape("future xyz", xyz, (n, 3))
        require_shape("future heading", heading, (n,))
        for name, value in (("future xyz", xyz), ("future heading", heading), ("v0", np.array([v0]))):
            require_finite(name, value)
        target = unwrap(np.concatenate([[0.0], heading]))
        data = np.eye(n + 1)[1:]  # the data term skips the pinned t0 heading
        theta = regularised_least_squares(
            data, target[1:], smoothness_penalty(n + 1, 3, s.theta_lambda, dt), s.theta_ridge, 0.0
        )
        dxy = np.diff(np.concatenate([np.zeros((1, 2)), xyz[:, :2]]), axis=0)
        speed = self._speeds(dxy, theta, float(v0))
        accel = regularised_least_squares(
            np.eye(n), np.diff(speed) / dt, smoothness_penalty(n, 2, s.a_lambda, dt), s.a_ridge
        )
        arc = dt * speed[:-1] + dt**2 / 2 * accel
        kappa = regularised_least_squares(
            np.diag(arc), np.diff(theta), smoothness_penalty(n, 2, s.kappa_lambda, dt), s.kappa_ridge
        )
        return np.stack([accel, kappa], axis=-1)

    def within_bounds(self, actions: np.ndarray) -> np.ndarray:
        """[...] bool: every waypoint's acceleration and curvature lie inside the configured bounds."""
        actions = self._check_actions(actions)
        (a_lo, a_hi), (k_lo, k_hi) = self.settings.accel_bounds, self.settings.curvature_bounds
        accel, kappa = actions[..., 0], actions[..., 1]
        return np.all((accel >= a_lo) & (accel <= a_hi) & (kappa >= k_lo) & (kappa <= k_hi), axis=-1)
