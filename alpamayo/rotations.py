"""Ego pose rotations, the one home of quaternion maths, on `scipy.spatial.transform.Rotation`.

Quaternions are (x, y, z, w), scalar last: scipy's default and the layout of every pose here (`EgoHistory`, the
wire protocol, MCAP / ROS 2 messages); AlpaSim's (w, x, y, z) fields are named one by one at its wire. A pose
quaternion gives the ego->world rotation; frames are x forward, y left, z up, yaw about +z. Signs are kept as
given (scipy does not canonicalise them: `as_quat()` returns q or -q as composed), so a track's quaternions
stay continuous where their inputs were.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation


def yaw_to_quat(yaw: np.ndarray | float) -> np.ndarray:
    """[...] yaw angles (rad, about +z) -> [..., 4] quaternions (x, y, z, w); w = cos(yaw / 2), so a yaw beyond
    +-pi gives w < 0 (the sign follows the angle, as an unwrapped heading track needs)."""
    yaw = np.asarray(yaw, dtype=np.float64)
    return Rotation.from_euler("z", yaw.reshape(-1, 1)).as_quat().reshape(*yaw.shape, 4)


def heading(rot: np.ndarray) -> np.ndarray:
    """Rotation matrices [..., 3, 3] -> [...] rad in (-pi, pi]: the direction of the rotated forward (+x) axis
    in the xy plane, the yaw of a z-y-x (yaw, pitch, roll) decomposition."""
    rot = np.asarray(rot, dtype=np.float64)
    return np.arctan2(rot[..., 1, 0], rot[..., 0, 0])


def quat_heading(quat_xyzw: np.ndarray) -> np.ndarray:
    """[..., 4] quaternions (x, y, z, w) -> [...] rad in (-pi, pi]: `heading` of their rotation matrices."""
    quat = np.asarray(quat_xyzw, dtype=np.float64)
    return heading(Rotation.from_quat(quat.reshape(-1, 4)).as_matrix().reshape(*quat.shape[:-1], 3, 3))


def compose(outer_xyzw: np.ndarray, inner_xyzw: np.ndarray) -> np.ndarray:
    """outer * inner [..., 4] (broadcast): `inner` applied first, e.g. a link's rotation in its parent frame
    composed below the parent's rotation in the world."""
    outer, inner = np.broadcast_arrays(np.asarray(outer_xyzw, np.float64), np.asarray(inner_xyzw, np.float64))
    q = Rotation.from_quat(outer.reshape(-1, 4)) * Rotation.from_quat(inner.reshape(-1, 4))
    return q.as_quat().reshape(outer.shape)


def to_frame(
    origin_xyz: np.ndarray, origin_xyzw: np.ndarray, xyz: np.ndarray, quat_xyzw: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Poses in the frame of the pose (origin_xyz [3] m, origin_xyzw [4]): xyz_local [..., 3] = R0^-1 (xyz -
    origin_xyz) and, when `quat_xyzw` [..., 4] is given, rotation matrices R0^-1 R [..., 3, 3] (else None)."""
    r0_inv = Rotation.from_quat(np.asarray(origin_xyzw, np.float64)).inv()
    xyz = np.asarray(xyz, dtype=np.float64)
    local = _rotate(r0_inv, xyz - origin_xyz)
    if quat_xyzw is None:
        return local, None
    quat = np.asarray(quat_xyzw, dtype=np.float64)
    rot = (r0_inv * Rotation.from_quat(quat.reshape(-1, 4))).as_matrix().reshape(*quat.shape[:-1], 3, 3)
    return local, rot


def from_frame(origin_xyz: np.ndarray, origin_xyzw: np.ndarray, xyz_local: np.ndarray) -> np.ndarray:
    """Points [..., 3] given in the frame of the pose (origin_xyz [3] m, origin_xyzw [4]) -> the parent frame:
    R0 xyz_local + origin_xyz (the inverse of `to_frame`)."""
    xyz_local = np.asarray(xyz_local, dtype=np.float64)
    r0 = Rotation.from_quat(np.asarray(origin_xyzw, np.float64))
    return _rotate(r0, xyz_local) + origin_xyz


def _rotate(r: Rotation, xyz: np.ndarray) -> np.ndarray:
    """One rotation applied to points [..., 3]. Not `Rotation.apply`: that is a batched matmul, which OpenBLAS
    rounds differently with its thread count (an eval clip's waypoints differed in the last bits between an
    in-process run and a one-CPU Ray worker); einsum's own loop gives the same bits on any thread count."""
    return np.einsum("ij,...j->...i", r.as_matrix(), xyz)


def slerp(q0: np.ndarray, q1: np.ndarray, u: np.ndarray | float) -> np.ndarray:
    """Spherical interpolation of quaternions q0, q1 [..., 4] (x, y, z, w) at fractions u [...] (broadcast),
    along the short arc: q0 * (q0^-1 q1)^u with the relative rotation taken at its angle in [0, pi] (the same
    rotation whichever sign q1 has). u outside [0, 1] extrapolates along the same great circle, which scipy's
    `Slerp` refuses; the result keeps q0's sign."""
    q0, q1 = np.asarray(q0, np.float64), np.asarray(q1, np.float64)
    u = np.asarray(u, dtype=np.float64)
    shape = np.broadcast_shapes(q0.shape[:-1], q1.shape[:-1], u.shape)
    r0 = Rotation.from_quat(np.broadcast_to(q0, (*shape, 4)).reshape(-1, 4))
    r1 = Rotation.from_quat(np.broadcast_to(q1, (*shape, 4)).reshape(-1, 4))
    step = (r0.inv() * r1).as_rotvec() * np.broadcast_to(u, shape).reshape(-1, 1)
    return (r0 * Rotation.from_rotvec(step)).as_quat().reshape(*shape, 4)
