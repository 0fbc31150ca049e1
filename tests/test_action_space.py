"""Unicycle action space: closed-form kinematics, the t0-speed estimate, and round trips (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from alpamayo.prediction import EgoHistory
from planner.action_space import UnicycleActionSpace
from planner.ego_frame import LocalHistory, to_t0_frame
from planner.tokenizers import FutureTokenizer, HistoryTokenizer

SPACE = UnicycleActionSpace()
T = 0.1 * np.arange(1, 65)  # waypoint times, s

# Round-trip tolerance for forward, jerk-limited controls (|jerk| <= 2 m/s^3, |dk/dt| <= 0.02 1/(m s)). The
# inverse is regularised (Alpamayo's lambdas), so it smooths: over 3000 random such controls the worst
# position error was 0.124 m (v0 = 0.3 m/s, where heading is barely observable), the median 6 mm.
ROUND_TRIP_POSITION_M = 0.25
ROUND_TRIP_HEADING_RAD = 0.05


def history_at_speed(speed: float, accel: float = 0.0, yaw_rate: float = 0.0) -> LocalHistory:
    """16 exact unicycle poses ending at the t0 origin: constant accel and yaw rate, integrated finely."""
    t = np.linspace(-1.5, 0.0, 1501)
    v = speed + accel * t
    yaw = yaw_rate * t
    dt = np.diff(t)
    x = np.concatenate([[0], np.cumsum(dt * (v[:-1] * np.cos(yaw[:-1]) + v[1:] * np.cos(yaw[1:])) / 2)])
    y = np.concatenate([[0], np.cumsum(dt * (v[:-1] * np.sin(yaw[:-1]) + v[1:] * np.sin(yaw[1:])) / 2)])
    pick = np.arange(0, 1501, 100)
    xyz = np.stack([x[pick] - x[-1], y[pick] - y[-1], np.zeros(16)], -1)
    c, s = np.cos(yaw[pick]), np.sin(yaw[pick])
    rot = np.zeros((16, 3, 3))
    rot[:, 0, 0], rot[:, 0, 1], rot[:, 1, 0], rot[:, 1, 1], rot[:, 2, 2] = c, -s, s, c, 1
    return LocalHistory(xyz=xyz, rot=rot)


def test_constant_acceleration_straight_line_is_exact():
    actions = np.tile([1.5, 0.0], (64, 1))
    xyz, heading = SPACE.rollout(actions, v0=10.0)
    # the trapezoid is exact for a speed linear in time: x = v0 t + a t^2 / 2
    np.testing.assert_allclose(xyz[:, 0], 10.0 * T + 0.75 * T**2, rtol=0, atol=1e-9)
    assert np.all(xyz[:, 1:] == 0) and np.all(heading == 0)


def test_constant_curvature_follows_a_circle():
    kappa, v = 0.05, 8.0
    xyz, heading = SPACE.rollout(np.tile([0.0, kappa], (64, 1)), v0=v)
    np.testing.assert_allclose(heading, kappa * v * T, rtol=1e-12)
    # exact circle through the origin with centre (0, 1/kappa); the trapezoid's chord error is O(dt^2)
    exact = np.stack([np.sin(kappa * v * T) / kappa, (1 - np.cos(kappa * v * T)) / kappa], -1)
    assert np.abs(xyz[:, :2] - exact).max() < 0.02
    np.testing.assert_allclose(np.hypot(xyz[:, 0], xyz[:, 1] - 1 / kappa), 1 / kappa, atol=0.02)


@pytest.mark.parametrize(
    "speed, accel, yaw_rate", [(0.0, 0.0, 0.0), (13.9, 0.0, 0.0), (8.0, 1.2, 0.0), (6.0, -0.8, 0.3)]
)
def test_t0_speed_is_estimated_from_the_history(speed, accel, yaw_rate):
    v0 = SPACE.estimate_v0(history_at_speed(speed, accel, yaw_rate))
    assert abs(v0 - speed) < 0.01


def test_the_inverse_recovers_smooth_controls():
    accel = 1.0 - 0.03 * T  # m/s^2, a slow ramp
    kappa = 0.02 * np.sin(T / 2)
    actions = np.stack([accel, kappa], -1)
    xyz, heading = SPACE.rollout(actions, v0=12.0)
    recovered = SPACE.actions_from_trajectory(xyz, heading, v0=12.0)
    assert np.abs(recovered[:, 0] - accel).max() < 0.02
    assert np.abs(recovered[:, 1] - kappa).max() < 1e-3


@st.composite
def jerk_limited_controls(draw):
    """Forward driving within the checkpoint bounds: accel and curvature random walks with bounded rates."""
    v0 = draw(st.floats(0.0, 35.0))
    a0, k0 = draw(st.floats(-3.0, 3.0)), draw(st.floats(-0.1, 0.1))
    da = draw(arrays(np.float64, 64, elements=st.floats(-0.2, 0.2)))
    dk = draw(arrays(np.float64, 64, elements=st.floats(-0.002, 0.002)))
    actions = np.stack([a0 + np.cumsum(da), k0 + np.cumsum(dk)], -1)
    assume(v0 + np.cumsum(actions[:, 0] * 0.1).min() >= 0)
    assume(SPACE.within_bounds(actions))
    return actions, v0


@settings(max_examples=80, deadline=None)
@given(jerk_limited_controls())
def test_trajectory_to_actions_to_trajectory_round_trip(controls):
    actions, v0 = controls
    xyz, heading = SPACE.rollout(actions, v0)
    xyz2, heading2 = SPACE.rollout(SPACE.actions_from_trajectory(xyz, heading, v0), v0)
    assert np.abs(xyz2 - xyz).max() <= ROUND_TRIP_POSITION_M
    assert np.abs(heading2 - heading).max() <= ROUND_TRIP_HEADING_RAD


@settings(max_examples=60, deadline=None)
@given(arrays(np.int64, (128,), elements=st.integers(0, 2999)), st.floats(0.0, 40.0))
def test_any_token_sequence_rolls_out_to_a_bounded_trajectory(bins, v0):
    actions = FutureTokenizer().decode(bins)
    assert SPACE.within_bounds(
        actions
    )  # +-10 sigma of the released stats lies inside the +-9.8 / +-0.33 bounds
    xyz, heading = SPACE.rollout(actions, v0)
    assert np.all(np.isfinite(xyz)) and np.all(np.isfinite(heading))
    # |a| <= 0.02903 + 10 * 0.68104 m/s^2, so no waypoint is farther than v0 t + a_max t^2 / 2
    reach = v0 * T + (0.02903 + 10 * 0.68104) * T**2 / 2
    assert np.all(np.linalg.norm(xyz[:, :2], axis=-1) <= reach + 1e-9)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_values_are_rejected(value):
    actions = np.zeros((64, 2))
    actions[63, 0] = value
    with pytest.raises(ValueError, match=r"actions\[63, 0\] = .*must be finite"):
        SPACE.rollout(actions, 5.0)
    with pytest.raises(ValueError, match=r"v0 and z0\[0\]"):
        SPACE.rollout(np.zeros((64, 2)), value)
    xyz, heading = SPACE.rollout(np.zeros((64, 2)), 5.0)
    heading[10] = value
    with pytest.raises(ValueError, match=r"future heading\[10\]"):
        SPACE.actions_from_trajectory(xyz, heading, 5.0)
    with pytest.raises(ValueError, match=r"actions must have shape \[\.\.\., 64, 2\], got \[63, 2\]"):
        SPACE.rollout(np.zeros((63, 2)), 5.0)


@settings(max_examples=40, deadline=None)
@given(
    arrays(np.float64, (64, 3), elements=st.floats(-50.0, 50.0)),
    st.integers(0, 63),
    st.integers(0, 1),
    st.sampled_from([np.nan, np.inf, -np.inf]),
)
def test_any_non_finite_input_is_rejected_by_index(values, row, col, bad):
    """One NaN or inf anywhere in the actions or a trajectory is refused by every entry point, naming its
    index, instead of propagating into waypoints or tokens."""
    values[row, col] = bad
    at = rf"\[{row}, {col}\] = {bad}"
    with pytest.raises(ValueError, match=r"actions" + at):
        SPACE.rollout(values[:, :2], 5.0)
    with pytest.raises(ValueError, match=r"actions" + at):
        FutureTokenizer().encode(values[:, :2])
    with pytest.raises(ValueError, match=r"future xyz" + at):
        SPACE.actions_from_trajectory(values, np.zeros(64), 5.0)
    history = values[row - row % 16 :][:16]  # the 16 rows holding the bad value, at row % 16
    with pytest.raises(ValueError, match=rf"history xyz\[{row % 16}, {col}\] = {bad}"):
        HistoryTokenizer().encode(history)


def test_batched_rollout_equals_one_by_one():
    rng = np.random.default_rng(0)
    actions = np.stack([rng.uniform(-2, 2, (3, 64)), rng.uniform(-0.05, 0.05, (3, 64))], -1)
    xyz, heading = SPACE.rollout(actions, 7.0)
    for i in range(3):
        one = SPACE.rollout(actions[i], 7.0)
        np.testing.assert_array_equal(xyz[i], one[0])
        np.testing.assert_array_equal(heading[i], one[1])


def yaw_quat(yaw: np.ndarray) -> np.ndarray:
    return np.stack([np.zeros_like(yaw), np.zeros_like(yaw), np.sin(yaw / 2), np.cos(yaw / 2)], -1)


def test_world_history_is_expressed_in_the_t0_ego_frame():
    # the car drives north (world +y) at 10 m/s, heading +90 deg; in its own frame it drives along +x
    t_ns = np.arange(16) * 100_000_000
    xyz = np.stack([np.full(16, 100.0), 50.0 + np.arange(16) * 1.0, np.full(16, 3.0)], -1)
    local = to_t0_frame(EgoHistory(xyz=xyz, quat_xyzw=yaw_quat(np.full(16, np.pi / 2)), t_ns=t_ns))
    np.testing.assert_allclose(local.xyz[:, 0], np.arange(-15.0, 1.0), atol=1e-12)
    np.testing.assert_allclose(local.xyz[:, 1:], 0, atol=1e-12)
    np.testing.assert_allclose(local.rot, np.broadcast_to(np.eye(3), (16, 3, 3)), atol=1e-12)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda h: h.t_ns.__setitem__(7, h.t_ns[6]), r"t_ns\[7\] = 600000000 is not after t_ns\[6\]"),
        (lambda h: h.xyz.__setitem__((3, 1), np.nan), r"ego_history.xyz\[3, 1\] = nan"),
        (lambda h: h.quat_xyzw.__setitem__(4, [0, 0, 0, 0.5]), r"quat_xyzw\[4\] has norm 0.5"),
    ],
)
def test_bad_ego_history_is_rejected_with_the_offending_value(change, message):
    history = EgoHistory(
        xyz=np.zeros((16, 3)), quat_xyzw=yaw_quat(np.zeros(16)), t_ns=np.arange(16) * 100_000_000
    )
    change(history)
    with pytest.raises(ValueError, match=message):
        to_t0_frame(history)
