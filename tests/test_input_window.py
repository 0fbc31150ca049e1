"""The input window at t0 (alpamayo.input_window) against independent references: numpy's `interp` and scipy's
`Slerp` between poses at non-uniform times, the analytic motion of a constant-velocity, constant-yaw-rate track
beyond its newest pose, scipy's `CubicSpline` as another interpolator, and a brute-force frame search per slot."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.interpolate import CubicSpline
from scipy.spatial.transform import Rotation, Slerp

from alpamayo.input_window import HistoryUnavailable, PoseTrack, SlotMissing, frame_slots
from alpamayo.prediction import HISTORY_STEPS, PERIOD_NS

MS = 1_000_000
RNG = np.random.default_rng(7)


def random_track(n: int = 40) -> PoseTrack:
    """Poses at non-uniform times (20..80 ms apart) with random positions and rotations about random axes."""
    t = 5_000 * MS + np.cumsum(RNG.integers(20 * MS, 80 * MS, size=n)).astype(np.int64)
    xyz = np.cumsum(RNG.normal(size=(n, 3)), axis=0)
    rotvec = np.cumsum(RNG.normal(scale=0.2, size=(n, 3)), axis=0)
    return PoseTrack(t, xyz, Rotation.from_rotvec(rotvec).as_quat())


def analytic(t_ns: np.ndarray, t_ref: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A car at constant velocity (8, 1, 0.1) m/s turning at a constant 0.3 rad/s about +z: the truth beyond
    its last pose, which linear position and slerp continued at a constant rate reproduce exactly."""
    s = (np.asarray(t_ns) - t_ref) / 1e9
    xyz = np.stack([8.0 * s, 1.0 * s, 0.1 * s], axis=-1)
    return xyz, Rotation.from_euler("z", 0.3 * s[:, None]).as_quat()


def rotation_error(q: np.ndarray, reference: Rotation) -> float:
    return float(np.max((Rotation.from_quat(q).inv() * reference).magnitude()))


def test_between_poses_linear_xyz_and_slerp_match_numpy_and_scipy_at_non_uniform_times():
    track = random_track()
    times = np.sort(RNG.integers(track.t_ns[0], track.t_ns[-1] + 1, size=200))
    times = np.concatenate([times, track.t_ns[[0, 5, -1]]])  # on a pose, the first and the last too
    xyz, quat = track.at(times, max_gap_ns=None)
    reference = np.stack([np.interp(times, track.t_ns, track.xyz[:, i]) for i in range(3)], axis=-1)
    np.testing.assert_allclose(xyz, reference, rtol=0, atol=1e-12)
    slerp = Slerp(track.t_ns.astype(np.float64), Rotation.from_quat(track.quat_xyzw))
    assert rotation_error(quat, slerp(times.astype(np.float64))) < 1e-12
    # a pose's time gives the pose itself, bit for bit (the node's window equals the drive's own poses)
    np.testing.assert_array_equal(xyz[-3:], track.xyz[[0, 5, -1]])
    np.testing.assert_array_equal(quat[-3:], track.quat_xyzw[[0, 5, -1]])


def test_history_at_is_sixteen_poses_a_period_apart_ending_at_t0():
    track = random_track()
    t0 = int(track.t_ns[-1]) - 7 * MS
    history = track.history_at(t0, max_gap_ns=None)
    np.testing.assert_array_equal(history.t_ns, t0 - PERIOD_NS * np.arange(HISTORY_STEPS - 1, -1, -1))
    xyz, quat = track.at(history.t_ns, max_gap_ns=None)
    np.testing.assert_array_equal(history.xyz, xyz)
    np.testing.assert_array_equal(history.quat_xyzw, quat)


def test_beyond_the_newest_pose_the_motion_continues_up_to_the_limit_and_no_further():
    t = np.array([0, 37, 81, 130], dtype=np.int64) * MS  # non-uniform
    track = PoseTrack(t, *analytic(t))
    at = np.array([130, 150, 180], dtype=np.int64) * MS
    xyz, quat = track.at(at, extrapolate_ns=50 * MS)  # 180 ms: exactly the limit past 130 ms
    truth_xyz, truth_quat = analytic(at)
    np.testing.assert_allclose(xyz, truth_xyz, atol=1e-12)
    assert rotation_error(quat, Rotation.from_quat(truth_quat)) < 1e-12
    with pytest.raises(HistoryUnavailable) as e:
        track.at(np.array([180 * MS + 1]), extrapolate_ns=50 * MS)
    assert (e.value.reason, e.value.t) == ("after", 180 * MS + 1)
    with pytest.raises(HistoryUnavailable, match="after"):  # no extrapolation unless asked for
        track.at(np.array([131 * MS]))


def test_a_velocity_moves_the_extrapolated_position_and_one_pose_without_it_cannot_be_extrapolated():
    t = np.array([0, 60], dtype=np.int64) * MS
    xyz, quat = analytic(t)
    velocity = np.array([10.0, -2.0, 0.0])
    with_velocity = PoseTrack(t, xyz, quat, velocity=velocity)
    got, got_quat = with_velocity.at(np.array([100 * MS]), extrapolate_ns=50 * MS)
    np.testing.assert_allclose(got[0], xyz[-1] + velocity * 0.04, atol=1e-12)
    # the rotation still continues the last two poses' turn
    assert rotation_error(got_quat, Rotation.from_quat(analytic(np.array([100 * MS]))[1])) < 1e-12
    single = PoseTrack(t[1:], xyz[1:], quat[1:])
    with pytest.raises(HistoryUnavailable) as e:
        single.at(np.array([100 * MS]), extrapolate_ns=50 * MS)
    assert e.value.reason == "no_velocity"
    np.testing.assert_array_equal(single.at(t[1:])[0], xyz[1:])  # its own time needs no motion
    held, held_quat = PoseTrack(t[1:], xyz[1:], quat[1:], velocity=velocity).at(
        np.array([80 * MS]), extrapolate_ns=50 * MS
    )
    np.testing.assert_allclose(held[0], xyz[1] + velocity * 0.02, atol=1e-12)
    np.testing.assert_array_equal(held_quat[0], quat[1])  # one pose: the rotation is held


def test_a_gap_over_the_limit_is_refused_at_the_limit_accepted_and_without_a_limit_interpolated():
    t = np.array([0, 100, 350, 400], dtype=np.int64) * MS
    track = PoseTrack(t, *analytic(t))
    with pytest.raises(HistoryUnavailable) as e:
        track.at(np.array([50, 200], dtype=np.int64) * MS, max_gap_ns=250 * MS - 1)
    assert (e.value.reason, e.value.t, e.value.gap) == ("gap", 200 * MS, 250 * MS)
    track.at(np.array([200 * MS]), max_gap_ns=250 * MS)  # exactly the limit
    xyz, _ = track.at(np.array([200 * MS]), max_gap_ns=None)
    np.testing.assert_allclose(
        xyz[0], [np.interp(200 * MS, t, track.xyz[:, i]) for i in range(3)], atol=1e-12
    )


def test_the_first_time_that_fails_names_the_reason_oldest_first():
    t = np.array([300, 400, 900, 1000], dtype=np.int64) * MS
    track = PoseTrack(t, *analytic(t))
    with pytest.raises(HistoryUnavailable) as e:  # 200 ms precedes the track, 600 ms is in a gap: 200 ms wins
        track.at(np.array([200, 600], dtype=np.int64) * MS)
    assert (e.value.reason, e.value.t) == ("before", 200 * MS)
    with pytest.raises(HistoryUnavailable) as e:
        PoseTrack(t[:0], track.xyz[:0], track.quat_xyzw[:0]).at(np.array([0]))
    assert e.value.reason == "empty"


def test_another_interpolator_gives_the_poses_between_samples_after_the_same_checks():
    t = np.array([0, 40, 100, 130, 200, 260], dtype=np.int64) * MS
    track = random_track(len(t))
    spline = CubicSpline(t, track.xyz)
    asked: list[np.ndarray] = []

    def cubic(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        asked.append(times)
        return spline(times), Slerp(t, Rotation.from_quat(track.quat_xyzw))(times).as_quat()

    cubic_track = PoseTrack(t, track.xyz, track.quat_xyzw, interpolator=cubic)
    times = np.array([10, 70, 130, 255], dtype=np.int64) * MS
    xyz, _ = cubic_track.at(times)
    np.testing.assert_array_equal(xyz, spline(times))
    with pytest.raises(HistoryUnavailable):
        cubic_track.at(np.array([300 * MS]))
    assert len(asked) == 1  # a time outside the samples never reaches it


def brute_force_nearest(times: np.ndarray, slot: int) -> tuple[int, int]:
    errors = [abs(int(x) - slot) for x in times]
    j = min(range(len(times)), key=lambda i: (errors[i], i))
    return j, errors[j]


def test_nearest_slots_match_a_brute_force_search_on_jittered_frames():
    for _ in range(50):
        times = np.sort(RNG.integers(0, 40 * MS, size=12) + np.arange(12) * 30 * MS).astype(np.int64)
        t0 = int(times[-1])
        slots = [t0 - k * PERIOD_NS for k in (3, 2, 1, 0)]
        expected = [brute_force_nearest(times, s) for s in slots]
        tolerance = 30 * MS
        if all(err <= tolerance for _, err in expected) and len({j for j, _ in expected}) == 4:
            assert frame_slots(times, t0, tolerance) == [j for j, _ in expected]
        else:
            with pytest.raises(SlotMissing) as e:
                frame_slots(times, t0, tolerance)
            missing = [
                (k, err) for k, (_, err) in zip((3, 2, 1, 0), expected, strict=True) if err > tolerance
            ]
            assert e.value.missing == missing


def test_a_nearest_slot_at_the_tolerance_is_taken_one_past_it_is_missing_and_a_shared_frame_is_refused():
    t0 = 1_000 * MS
    times = np.array([t0 - 300 * MS + 20 * MS, t0 - 200 * MS, t0 - 100 * MS, t0], dtype=np.int64)
    assert frame_slots(times, t0, 20 * MS) == [0, 1, 2, 3]
    with pytest.raises(SlotMissing) as e:
        frame_slots(times, t0, 20 * MS - 1)
    assert (e.value.missing, e.value.shared) == ([(3, 20 * MS)], False)
    without = np.delete(times, 2)  # no frame near t0 - 100 ms: its nearest is 100 ms away
    with pytest.raises(SlotMissing) as e:
        frame_slots(without, t0, 20 * MS)
    assert e.value.missing == [(1, 100 * MS)]
    # one frame half-way between two slots is the nearest of both
    midway = np.array([t0 - 300 * MS, t0 - 150 * MS, t0], dtype=np.int64)
    with pytest.raises(SlotMissing) as e:
        frame_slots(midway, t0, 50 * MS)
    assert e.value.shared and e.value.missing == []
    with pytest.raises(SlotMissing) as e:
        frame_slots(np.array([], dtype=np.int64), t0, 50 * MS)
    assert e.value.missing == [(3, None), (2, None), (1, None), (0, None)]


def test_at_or_before_slots_take_the_newest_frame_not_after_each_slot_at_most_the_tolerance_old():
    us = 1_000  # the PhysicalAI-AV clips' unit
    period = 100_000
    t0 = 2_000_000
    times = np.array([1_690_000, 1_750_000, 1_800_000, 1_899_000, 1_990_000, 2_000_000], dtype=np.int64)
    assert frame_slots(times, t0, period, period, rule="at_or_before") == [0, 2, 3, 5]
    reference = [int(np.flatnonzero(times <= s)[-1]) for s in t0 - period * np.array([3, 2, 1, 0])]
    assert frame_slots(times, t0, period, period, rule="at_or_before") == reference
    # a dropped frame: one frame serves two slots when it is young enough for both, as NVIDIA's loader has it
    dropped = np.array([1_700_000, 1_800_000, 2_000_000], dtype=np.int64)
    assert frame_slots(dropped, t0, period, period, rule="at_or_before") == [0, 1, 1, 2]
    with pytest.raises(SlotMissing) as e:
        frame_slots(dropped, t0, period - us, period, rule="at_or_before")
    assert e.value.missing == [(1, period)]
    with pytest.raises(SlotMissing) as e:  # nothing at or before the oldest slot
        frame_slots(times[1:], t0, period, period, rule="at_or_before")
    assert e.value.missing == [(3, None)]
