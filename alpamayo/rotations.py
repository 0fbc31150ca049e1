"""Quaternions (x, y, z, w) of planar ego poses from their yaw. Rotation matrices and the t0 ego frame are in
planner.ego_frame, slerp here (the ego track's interpolation in bridges.window and bridges.recording). A pose quaternion gives the ego->world rotation."""

from __future__ import annotations

import numpy as np


def yaw_to_quat(yaw: np.ndarray) -> np.ndarray:
    """[...] yaw angles (rad, about +z) -> [..., 4] quaternions (x, y, z, w)."""
    half = 0.5 * np.asarray(yaw, dtype=np.float64)
    zeros = np.zeros_like(half)
    return np.stack([zeros, zeros, np.sin(half), np.cos(half)], axis=-1)


def slerp(q0: np.ndarray, q1: np.ndarray, u: float) -> np.ndarray:
    """Spherical interpolation of unit quaternions (x, y, z, w) along the short arc; u outside [0, 1]
    extrapolates along the same great circle."""
    if np.dot(q0, q1) < 0.0:
        q1 = -q1
    # The angle between the unit vectors via atan2 stays accurate near 0, where arccos(dot) loses half the digits.
    theta = 2.0 * np.arctan2(np.linalg.norm(q0 - q1), np.linalg.norm(q0 + q1))
    if theta < 1e-12:
        return q0.copy()
    q = (np.sin((1 - u) * theta) * q0 + np.sin(u * theta) * q1) / np.sin(theta)
    return q / np.linalg.norm(q)
