"""Unit quaternions (x, y, z, w) for ego poses: rotation matrices, yaw, interpolation and the t0 ego frame.

A pose quaternion gives the ego->world rotation (alpamayo.prediction.EgoHistory). All arrays are float64.
"""

from __future__ import annotations

import numpy as np


def quat_to_matrix(quat_xyzw: np.ndarray) -> np.ndarray:
    """[..., 4] unit quaternions (x, y, z, w) -> [..., 3, 3] rotation matrices."""
    q = np.asarray(quat_xyzw, dtype=np.float64)
    x, y, z, w = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    rows = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ]
    return np.stack([np.stack(r, axis=-1) for r in rows], axis=-2)


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


def world_to_ego(xyz_world: np.ndarray, origin_xyz: np.ndarray, origin_quat_xyzw: np.ndarray) -> np.ndarray:
    """[N, 3] world points -> the ego frame of the pose (origin_xyz, origin_quat): R^-1 (xyz - origin)."""
    rot = quat_to_matrix(origin_quat_xyzw)
    return (np.asarray(xyz_world, dtype=np.float64) - origin_xyz) @ rot
