"""Ego history in the t0 ego frame (x forward, y left, z up, metres; origin at the t0 pose).

`xyz_local = R_t0^-1 (xyz_world - xyz_t0)` and `R_local = R_t0^-1 R_world`, so the t0 pose becomes the origin
with identity rotation (yaw 0). Poses come as `alpamayo.prediction.EgoHistory` (ego->world quaternions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from alpamayo.prediction import HISTORY_STEPS, EgoHistory
from alpamayo.rotations import heading, to_frame
from planner.checks import require_finite, require_shape

# Quaternions further than this from unit norm are rejected rather than silently renormalised: a norm of
# 0.9 means a corrupted message, while float32 round-off on a unit quaternion stays below 1e-6.
QUAT_NORM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class LocalHistory:
    """Ego history in the t0 ego frame: xyz [16, 3] metres, rot [16, 3, 3] ego->t0 rotations, oldest first."""

    xyz: np.ndarray
    rot: np.ndarray

    @property
    def yaw(self) -> np.ndarray:
        """[16] rad, heading of each pose in the t0 frame, unwrapped so steps lie in (-pi, pi]."""
        return unwrap(heading(self.rot))


def unwrap(angle: np.ndarray) -> np.ndarray:
    """Unwrap the last axis so that every consecutive difference lies in (-pi, pi]; the first value is kept."""
    step = np.diff(angle, axis=-1)
    step = np.arctan2(np.sin(step), np.cos(step))
    return np.concatenate([angle[..., :1], angle[..., :1] + np.cumsum(step, axis=-1)], axis=-1)


def validate_history(history: EgoHistory) -> None:
    """Shapes [16, 3] / [16, 4] / [16], finite values, unit quaternions and strictly increasing times."""
    xyz = np.asarray(history.xyz, dtype=np.float64)
    quat = np.asarray(history.quat_xyzw, dtype=np.float64)
    t_ns = np.asarray(history.t_ns)
    require_shape("ego_history.xyz", xyz, (HISTORY_STEPS, 3))
    require_shape("ego_history.quat_xyzw", quat, (HISTORY_STEPS, 4))
    require_shape("ego_history.t_ns", t_ns, (HISTORY_STEPS,))
    require_finite("ego_history.xyz", xyz)
    require_finite("ego_history.quat_xyzw", quat)
    if not np.issubdtype(t_ns.dtype, np.integer):
        raise ValueError(f"ego_history.t_ns must hold integer nanoseconds, got dtype {t_ns.dtype}")
    norm = np.linalg.norm(quat, axis=-1)
    off = np.flatnonzero(np.abs(norm - 1) > QUAT_NORM_TOLERANCE)
    if len(off):
        raise ValueError(
            f"ego_history.quat_xyzw[{off[0]}] has norm {norm[off[0]]:.6g}; quaternions must be unit "
            f"(|norm - 1| <= {QUAT_NORM_TOLERANCE})"
        )
    steps = np.diff(t_ns)
    back = np.flatnonzero(steps <= 0)
    if len(back):
        i = back[0]
        raise ValueError(
            f"ego_history.t_ns must be strictly increasing: t_ns[{i + 1}] = {t_ns[i + 1]} "
            f"is not after t_ns[{i}] = {t_ns[i]}"
        )


def to_t0_frame(history: EgoHistory) -> LocalHistory:
    """Validate `history` and express it in the ego frame of its last (t0) pose."""
    validate_history(history)
    xyz = np.asarray(history.xyz, dtype=np.float64)
    quat = np.asarray(history.quat_xyzw, dtype=np.float64)
    local, rot = to_frame(xyz[-1], quat[-1], xyz, quat)
    return LocalHistory(xyz=local, rot=rot)
