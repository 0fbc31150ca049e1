"""Planning metrics: displacement errors over XY and comfort figures on trajectories with known dynamics."""

from __future__ import annotations

import numpy as np
import pytest

from planner.action_space import UnicycleActionSpace
from planner.baselines import constant_velocity
from planner.metrics import (
    ade,
    comfort,
    displacement,
    fde,
    horizon_errors,
    horizon_steps,
    min_ade,
    min_ade_at_horizons,
)

T = 0.1 * np.arange(1, 65)


def straight(speed: float, lateral_offset: float = 0.0, z: float = 0.0) -> np.ndarray:
    return np.stack([speed * T, np.full(64, lateral_offset), np.full(64, z)], -1)


def test_errors_are_measured_in_the_xy_plane_only():
    gt = straight(10.0)
    pred = straight(10.0, lateral_offset=0.5, z=7.0)  # z differs a lot: ignored
    assert ade(pred, gt) == pytest.approx(0.5) and fde(pred, gt) == pytest.approx(0.5)


def test_ade_fde_and_horizons_on_a_growing_error():
    gt = straight(10.0)
    pred = straight(11.0)  # error 1 m/s * t along x
    np.testing.assert_allclose(displacement(pred, gt), T, atol=1e-12)
    assert ade(pred, gt) == pytest.approx(T.mean())
    assert ade(pred, gt, horizon_s=1.0) == pytest.approx(T[:10].mean())
    assert fde(pred, gt) == pytest.approx(6.4)
    errors = horizon_errors(pred, gt)
    assert list(errors) == [1.0, 2.0, 3.0, 6.4]
    np.testing.assert_allclose([errors[h] for h in errors], [1.0, 2.0, 3.0, 6.4])


def test_min_ade_picks_the_closest_sample():
    gt = straight(10.0)
    preds = np.stack([straight(12.0), straight(10.0, lateral_offset=0.3), straight(9.0)])
    value, best = min_ade(preds, gt)
    assert best == 1 and value == pytest.approx(0.3)
    np.testing.assert_allclose(ade(preds, gt), [2 * T.mean(), 0.3, T.mean()])


def test_min_ade_per_horizon_keeps_the_sample_best_over_the_whole_trajectory():
    """NVIDIA's compute_minade picks the sample by its 6.4 s ADE and truncates that sample: sample 0 starts on
    the recorded path and drifts away (best at 1 s), sample 1 is 0.3 m off throughout (best over 6.4 s)."""
    gt = straight(10.0)
    drifting = straight(10.0) + np.stack([np.zeros(64), 0.2 * T**2, np.zeros(64)], -1)
    preds = np.stack([drifting, straight(10.0, lateral_offset=0.3)])
    assert ade(preds[0], gt, 1.0) < 0.3 < ade(preds[0], gt)
    at = min_ade_at_horizons(preds, gt)
    assert at == pytest.approx({1.0: 0.3, 2.0: 0.3, 3.0: 0.3, 6.4: 0.3})
    assert at[6.4] == pytest.approx(min_ade(preds, gt)[0])


def test_bad_shapes_and_horizons_are_rejected():
    with pytest.raises(ValueError, match=r"pred has 63 waypoints but gt has 64"):
        ade(straight(1.0)[:63], straight(1.0))
    with pytest.raises(ValueError, match=r"horizon 7.0 s must be a multiple of dt = 0.1 s in \[0.1, 6.4\] s"):
        horizon_steps(7.0, 64)
    with pytest.raises(ValueError, match=r"horizon 0.25 s"):
        horizon_steps(0.25, 64)
    bad = straight(1.0)
    bad[3, 0] = np.nan
    with pytest.raises(ValueError, match=r"pred\[3, 0\] = nan"):
        fde(bad, straight(1.0))


def test_comfort_of_a_steady_turn_is_v_squared_kappa():
    space = UnicycleActionSpace()
    v, kappa = 10.0, 0.03
    xyz, heading = space.rollout(np.tile([0.0, kappa], (64, 1)), v0=v)
    c = comfort(xyz, heading)
    assert c.max_abs_yaw_rate == pytest.approx(v * kappa, rel=1e-9)
    assert c.max_abs_lat_accel == pytest.approx(v * v * kappa, rel=1e-3)  # chord speed is v (1 - O(dt^2))
    assert abs(c.max_lon_accel) < 1e-6 and abs(c.min_lon_accel) < 1e-6 and c.max_abs_jerk < 1e-4
    assert c.within_limits


def test_comfort_sees_a_jerk_and_a_hard_brake():
    space = UnicycleActionSpace()
    accel = np.where(T <= 3.0, 0.0, -6.0)  # a step from 0 to -6 m/s^2 within one step: 60 m/s^3
    xyz, heading = space.rollout(np.stack([accel, np.zeros(64)], -1), v0=30.0)
    c = comfort(xyz, heading)
    assert c.min_lon_accel == pytest.approx(-6.0, rel=1e-6)
    assert c.max_abs_jerk == pytest.approx(30.0, rel=1e-6)  # the step spreads over two trapezoid intervals
    assert not c.within_limits


def test_constant_velocity_baseline_extrapolates_the_last_half_second():
    t = 0.1 * np.arange(-15, 1)
    history = np.stack([9.0 * t, -2.0 * t, np.full(16, 0.3)], axis=1)
    future = constant_velocity(history)
    tf = 0.1 * np.arange(1, 65)
    assert np.allclose(future, np.stack([9.0 * tf, -2.0 * tf, np.full(64, 0.3)], axis=1))
    history[:-6, 0] = 0.0  # only the last 0.5 s (5 steps) sets the velocity
    assert np.allclose(constant_velocity(history), future)
    history[3, 1] = np.nan
    with pytest.raises(ValueError, match="history_xyz"):
        constant_velocity(history)
