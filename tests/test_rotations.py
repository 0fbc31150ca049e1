"""alpamayo.rotations against an independent reference: explicit rotation matrices (Rz Ry Rx written out from
their definition) and the quaternion slerp formula of Shoemake (sin-weighted great-circle interpolation after
the short-path sign flip), not scipy. Also: no other product module does its own quaternion maths."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from alpamayo.rotations import compose, from_frame, heading, slerp, to_frame, yaw_to_quat

ROOT = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(23)


def rz(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def ry(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def rx(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def matrix(q: np.ndarray) -> np.ndarray:
    """Hamilton unit quaternion (x, y, z, w) -> rotation matrix, from the definition."""
    x, y, z, w = q / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def axis_angle(axis: np.ndarray, angle: float) -> np.ndarray:
    axis = axis / np.linalg.norm(axis)
    return np.array([*(np.sin(angle / 2) * axis), np.cos(angle / 2)])


def shoemake(q0: np.ndarray, q1: np.ndarray, u: float) -> np.ndarray:
    """Textbook slerp: flip q1 onto q0's hemisphere, then sin-weight along the great circle (u may leave [0, 1])."""
    if np.dot(q0, q1) < 0:
        q1 = -q1
    theta = np.arccos(np.clip(np.dot(q0, q1), -1.0, 1.0))
    return (np.sin((1 - u) * theta) * q0 + np.sin(u * theta) * q1) / np.sin(theta)


def random_quats(n: int) -> np.ndarray:
    q = RNG.normal(size=(n, 4))
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def test_yaw_quaternions_are_rz_with_w_following_the_angle():
    yaw = np.array([-7.0, -3.5, -0.4, 0.0, 0.3, 3.5, 7.0])  # beyond +-pi too: an unwrapped heading track
    q = yaw_to_quat(yaw)
    assert q.shape == (7, 4)
    for a, qa in zip(yaw, q, strict=True):
        np.testing.assert_allclose(matrix(qa), rz(a), atol=1e-15)
        np.testing.assert_allclose(qa, [0.0, 0.0, np.sin(a / 2), np.cos(a / 2)], atol=1e-16)  # the sign too
    assert yaw_to_quat(0.3).shape == (4,) and yaw_to_quat(np.zeros((2, 3))).shape == (2, 3, 4)


def test_heading_is_the_yaw_of_a_yaw_pitch_roll_rotation():
    angles = RNG.uniform(
        [-np.pi, -1.2, -np.pi], [np.pi, 1.2, np.pi], size=(20, 3)
    )  # pitch away from +-90 deg
    rot = np.stack([rz(y) @ ry(p) @ rx(r) for y, p, r in angles])
    np.testing.assert_allclose(heading(rot), angles[:, 0], atol=1e-12)


def test_poses_to_and_from_a_frame_match_explicit_matrices():
    origin_q, quats = random_quats(1)[0], random_quats(5)
    origin_xyz, xyz = RNG.normal(size=3) * 10, RNG.normal(size=(5, 3)) * 10
    r0 = matrix(origin_q)
    local, rot = to_frame(origin_xyz, origin_q, xyz, quats)
    np.testing.assert_allclose(local, (xyz - origin_xyz) @ r0, atol=1e-12)  # rows: R0^T (x - x0)
    np.testing.assert_allclose(rot, [r0.T @ matrix(q) for q in quats], atol=1e-12)
    assert to_frame(origin_xyz, origin_q, xyz)[1] is None
    np.testing.assert_allclose(from_frame(origin_xyz, origin_q, local), xyz, atol=1e-12)
    np.testing.assert_allclose(
        from_frame(origin_xyz, -origin_q, xyz[0]), r0 @ xyz[0] + origin_xyz, atol=1e-12
    )


def test_compose_applies_the_inner_rotation_first():
    a, b = random_quats(4), random_quats(4)
    c = compose(a, b)
    for qa, qb, qc in zip(a, b, c, strict=True):
        np.testing.assert_allclose(matrix(qc), matrix(qa) @ matrix(qb), atol=1e-12)
    np.testing.assert_allclose(compose(a[0], yaw_to_quat(np.zeros(3))), np.tile(a[0], (3, 1)), atol=1e-15)


@pytest.mark.parametrize("u", [0.0, 0.25, 0.5, 1.0, -0.5, 1.5, 3.0])
def test_slerp_matches_shoemake_inside_and_outside_the_interval(u):
    for q0, q1 in zip(random_quats(10), random_quats(10), strict=True):
        np.testing.assert_allclose(slerp(q0, q1, u), shoemake(q0, q1, u), atol=1e-12)


def test_slerp_takes_the_short_arc_whatever_the_sign_and_keeps_q0s_sign():
    q0, q1 = yaw_to_quat(0.1), yaw_to_quat(0.5)
    for sign in (1.0, -1.0):  # -q1 is the same rotation: through yaw 0.3, not the long way round
        np.testing.assert_allclose(slerp(q0, sign * q1, 0.5), yaw_to_quat(0.3), atol=1e-15)
        np.testing.assert_allclose(slerp(-q0, sign * q1, 0.5), -yaw_to_quat(0.3), atol=1e-15)
    np.testing.assert_allclose(slerp(q0, q1, 2.0), yaw_to_quat(0.9), atol=1e-15)  # extrapolated
    np.testing.assert_allclose(slerp(q0, q1, -1.0), yaw_to_quat(-0.3), atol=1e-15)
    np.testing.assert_allclose(slerp(q0, q0, 0.7), q0, atol=1e-15)  # no angle: no 0 / 0
    # about an arbitrary axis: the rotation angle is linear in u
    axis = np.array([0.3, -0.5, 0.8])
    np.testing.assert_allclose(
        slerp(axis_angle(axis, 0.2), axis_angle(axis, 1.0), 1.75), axis_angle(axis, 1.6), atol=1e-15
    )


def test_slerp_broadcasts_pairs_and_fractions():
    q0, q1, u = random_quats(6), random_quats(6), RNG.uniform(-1, 2, size=6)
    expected = [shoemake(a, b, w) for a, b, w in zip(q0, q1, u, strict=True)]
    np.testing.assert_allclose(slerp(q0, q1, u), expected, atol=1e-12)
    np.testing.assert_allclose(slerp(q0[0], q1[0], u), [shoemake(q0[0], q1[0], w) for w in u], atol=1e-12)


def test_no_other_product_module_does_quaternion_maths():
    """scipy.spatial.transform is used through alpamayo.rotations only (the PhysicalAI-AV devkit's own
    interpolator in bridges.drives.pai hands back its scipy rotations, read with as_quat)."""
    users = []
    for package in ("alpamayo", "planner", "bridges", "vision"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(n.startswith("scipy.spatial") for n in names):
                    users.append(str(path.relative_to(ROOT)))
    assert users == ["alpamayo/rotations.py"]
