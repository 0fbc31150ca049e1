"""Unit quaternions (x, y, z, w) of ego poses: from yaw, and interpolated. Rotation matrices and the t0 ego frame
are in planner.ego_frame. A pose quaternion gives the ego->world rotation (alpamayo.prediction.EgoHistory)."""

from __future__ import annotations

import numpy as np


def yaw_to_quat(yaw: np.ndarray) -> np.ndarray:
    """[...] yaw angles (rad, about +z) -> [..., 4] quaternions (x, y, z, w)."""
    half = 0.5 * np.asarray(yaw, dtype=np.float64)
    zeros = np.zeros_like(half)
    return np.stack([zeros, zeros, np.sin(half), np.cos(half)], axis=-1)


def slerp(q0: np.ndarray, q1: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Spherical interpolation between [N, 4] unit quaternions with weights w [N] in [0, 1] (shortest arc)."""
    q0 = np.asarray(q0, dtype=np.float64)
    q1 = np.asarray(q1, dtype=np.float64).copy()
    w = np.asarray(w, dtype=np.float64)[:, None]
    dot = np.sum(q0 * q1, axis=-1, keepdims=True)
    q1 = np.where(dot < 0, -q1, q1)
    dot = np.abs(dot)
    theta = np.arccos(np.clip(dot, -1.0, 1.0))
    sin_theta = np.sin(theta)
    # Nearly parallel quaternions: sin(theta) underflows, and the linear blend is exact to rounding there.
    near = sin_theta < 1e-9
    safe = np.where(near, 1.0, sin_theta)
    a = np.where(near, 1 - w, np.sin((1 - w) * theta) / safe)
    b = np.where(near, w, np.sin(w * theta) / safe)
    out = a * q0 + b * q1
    return out / np.linalg.norm(out, axis=-1, keepdims=True)
