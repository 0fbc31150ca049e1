"""Quaternions (x, y, z, w) of planar ego poses from their yaw. Rotation matrices and the t0 ego frame are in
planner.ego_frame, interpolation in bridges.window. A pose quaternion gives the ego->world rotation."""

from __future__ import annotations

import numpy as np


def yaw_to_quat(yaw: np.ndarray) -> np.ndarray:
    """[...] yaw angles (rad, about +z) -> [..., 4] quaternions (x, y, z, w)."""
    half = 0.5 * np.asarray(yaw, dtype=np.float64)
    zeros = np.zeros_like(half)
    return np.stack([zeros, zeros, np.sin(half), np.cos(half)], axis=-1)
