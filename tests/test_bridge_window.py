"""The node's input window: frame selection at the model's 10 Hz cadence, ego history, drops and restarts."""

from __future__ import annotations

import numpy as np
import pytest

from alpamayo.rotations import slerp
from bridges.camera_sim import SyntheticDrive
from bridges.node.config import TimingSection
from bridges.node.window import InputState
from bridges.wire.protocol import CameraTable, EgoPose, ProtocolError, WireFrame

CAMERAS = CameraTable({"left": 0, "front": 1})
MS = 1_000_000
T_BASE = 5_000 * MS  # sensor clock origin: any value works, the node only compares sensor times to each other
DRIVE = SyntheticDrive(speed_mps=12.0, yaw_rate_rps=0.3)


def state(**timing) -> InputState:
    return InputState(CAMERAS, TimingSection(**timing), ring_frames=16)


def frame(camera: int, frame_id: int, t_ns: int, size: int = 2) -> WireFrame:
    image = np.full((size, size, 3), frame_id % 256, np.uint8)
    return WireFrame(camera, frame_id, t_ns, t_ns + MS, "rgb8", image, image.nbytes)


def pose(t_ns: int, velocity: bool = True) -> EgoPose:
    xyz, quat, vel = DRIVE.pose((t_ns - T_BASE) / 1e9)
    return EgoPose(t_ns, np.array(xyz), np.array(quat), np.array(vel) if velocity else None)


def feed(
    s: InputState,
    seconds: float,
    camera_hz: float = 10.0,
    ego_hz: float = 10.0,
    offsets=(0, 0),
    start: int = 0,
    first_id: int = 0,
    ego_seconds: float | None = None,
    recv_shift: int = 0,
):
    """Camera frames (ids from first_id) and ego poses for `seconds` (ego: ego_seconds) from T_BASE + start,
    in time order; each arrives at its sensor time + recv_shift on the node's clock."""
    events = []
    for cam, offset in zip(CAMERAS.indices.values(), offsets, strict=True):
        n = round(seconds * camera_hz)
        events += [
            (T_BASE + start + round(k * 1e9 / camera_hz) + offset, cam, first_id + k) for k in range(n)
        ]
    n_ego = round((seconds if ego_seconds is None else ego_seconds) * ego_hz)
    events += [(T_BASE + start + round(k * 1e9 / ego_hz), None, k) for k in range(n_ego)]
    for t, cam, k in sorted(events, key=lambda e: (e[0], e[1] is not None)):
        s.accept(pose(t) if cam is None else frame(cam, k, t), recv_ns=t + recv_shift)


def test_window_has_four_frames_per_camera_at_10hz_and_the_ego_history_ending_at_t0():
    s = state()
    feed(s, 1.6)
    w = s.take_window(now_ns=T_BASE + 1600 * MS)
    assert w is not None
    assert w.t0_ns == T_BASE + 1500 * MS
    assert [c.frame_ids for c in w.cameras] == [[12, 13, 14, 15]] * 2
    assert w.frame_times_ns[1] == [T_BASE + k * 100 * MS for k in (12, 13, 14, 15)]
    assert [f[0, 0, 0] for f in w.frames[0]] == [12, 13, 14, 15]
    np.testing.assert_array_equal(w.ego.t_ns, T_BASE + 100 * MS * np.arange(16))
    expected = [pose(int(t)) for t in w.ego.t_ns]
    np.testing.assert_allclose(w.ego.xyz, [p.xyz for p in expected], atol=1e-12)
    np.testing.assert_allclose(w.ego.quat_xyzw, [p.quat_xyzw for p in expected], atol=1e-12)
    assert s.take_window(now_ns=T_BASE + 1600 * MS) is None
    assert s.waiting_for == (
        "camera 'left': no frame for the next window (a period after the last t0) in 100 ms; "
        "camera 'front': no frame for the next window (a period after the last t0) in 100 ms"
    )


def test_ego_between_samples_is_interpolated_and_slightly_ahead_of_the_newest_extrapolated():
    s = state()
    feed(s, 1.6, ego_hz=7.0, ego_seconds=1.8)  # ego samples fall between the 10 Hz targets
    w = s.take_window(now_ns=0)
    assert w is not None
    expected = [pose(int(t)) for t in w.ego.t_ns]
    # linear interpolation of a 12 m/s, 0.3 rad/s arc sampled at 7 Hz: chord error <= v*w*dt^2/8 = 9 mm
    assert np.abs(w.ego.xyz - [p.xyz for p in expected]).max() < 0.01
    np.testing.assert_allclose(w.ego.quat_xyzw, [p.quat_xyzw for p in expected], atol=1e-12)  # slerp is exact


@pytest.mark.parametrize(
    ("lag_ms", "velocity", "complete"), [(30, True, True), (30, False, True), (60, True, False)]
)
def test_ego_may_lag_t0_by_the_extrapolation_limit(lag_ms, velocity, complete):
    s = state(max_ego_extrapolation_ms=50)
    t0 = T_BASE + 1500 * MS
    for t in range(T_BASE, t0 - lag_ms * MS + 1, 20 * MS):
        s.accept(pose(t, velocity), recv_ns=t)
    for k in range(16):
        for cam in (0, 1):
            s.accept(frame(cam, k, T_BASE + k * 100 * MS), recv_ns=t0)
    w = s.take_window(now_ns=t0)
    assert (w is not None) == complete
    if complete:
        np.testing.assert_allclose(w.ego.xyz[-1], pose(t0).xyz, atol=0.02)
    else:
        assert s.waiting_for == "ego: no pose within 50 ms of t0 (newest 0.06 s before it)"


def test_30hz_cameras_contribute_every_third_frame_and_the_others_are_dropped():
    s = state()
    feed(s, 1.6, camera_hz=30.0, ego_seconds=1.7)
    w = s.take_window(now_ns=0)
    assert w.t0_ns == T_BASE + round(47 * 1e9 / 30)
    assert [c.frame_ids for c in w.cameras] == [[38, 41, 44, 47]] * 2
    snap = s.snapshot(now_ns=w.t0_ns)
    for cam in ("left", "front"):
        c = snap[cam]
        assert c["accepted"] == 48 and c["used"] == 4 and c["lost"] == 0
        assert c["accepted"] == c["used"] + c["dropped"] + c["pending"]
        assert c["dropped"] >= 48 - 16  # the ring holds 16; everything older was dropped unused


def test_cameras_out_of_phase_within_the_sync_tolerance_form_a_window():
    s = state(sync_tolerance_ms=50)
    feed(s, 1.6, offsets=(0, 40 * MS))
    w = s.take_window(now_ns=0)
    assert w.t0_ns == T_BASE + 1500 * MS  # the lagging camera's newest frame is 40 ms after it
    assert [c.frame_ids for c in w.cameras] == [[12, 13, 14, 15]] * 2
    s = state(sync_tolerance_ms=30)
    feed(s, 1.6, offsets=(0, 40 * MS))
    assert s.take_window(now_ns=0) is None
    assert s.waiting_for == "camera 'front': no frame within 30 ms of t0 - 300 ms (nearest 40 ms off)"


def test_slow_consumer_skips_to_the_newest_window_and_counts_dropped_ticks():
    s = state()
    feed(s, 1.6)
    assert s.take_window(now_ns=0).t0_ns == T_BASE + 1500 * MS
    feed(s, 0.5, start=1600 * MS, first_id=16)  # 5 more frames arrive while "the model runs"
    w = s.take_window(now_ns=1)
    assert w.t0_ns == T_BASE + 2000 * MS and w.ticks_dropped == 4
    assert [c.frame_ids for c in w.cameras] == [[17, 18, 19, 20]] * 2
    assert s.ticks_dropped == 4
    assert s.frame_drop_perc() == pytest.approx(100 * 4 / (4 + 2))


def test_duplicate_and_backwards_frames_and_poses_are_rejected():
    s = state()
    s.accept(frame(0, 10, T_BASE), recv_ns=T_BASE)
    cases = [
        (frame(0, 10, T_BASE + MS), "duplicate", "camera 'left': frame_id 10 repeats the last accepted one"),
        (frame(0, 11, T_BASE), "duplicate", "camera 'left': t_sof_ns 5000000000 repeats"),
        (
            frame(0, 9, T_BASE + MS),
            "backwards",
            "camera 'left': frame_id 9 is older than the last accepted 10",
        ),
        (
            frame(0, 12, T_BASE - MS),
            "backwards",
            "t_sof_ns 4999000000 is older than the last accepted 5000000000",
        ),
    ]
    s.accept(pose(T_BASE), recv_ns=T_BASE)
    cases += [
        (pose(T_BASE), "duplicate", "ego: t_ns 5000000000 repeats the last accepted one"),
        (pose(T_BASE - MS), "backwards", "ego: t_ns 4999000000 is older than the last accepted 5000000000"),
    ]
    for message, reason, text in cases:
        with pytest.raises(ProtocolError) as info:
            s.accept(message, recv_ns=T_BASE + MS)
        assert (info.value.reason, text in str(info.value)) == (reason, True), str(info.value)
    s.accept(frame(0, 15, T_BASE + 100 * MS), recv_ns=T_BASE + 100 * MS)
    assert s.snapshot(0)["left"]["lost"] == 4


def test_a_camera_that_stops_and_restarts_is_recovered_and_staleness_is_reported():
    s = state(stale_after_ms=300)
    feed(s, 1.6)
    assert s.take_window(now_ns=T_BASE + 1500 * MS) is not None
    assert s.stale_reasons(T_BASE + 1700 * MS) == []
    reasons = s.stale_reasons(T_BASE + 2000 * MS)
    assert reasons[0] == "camera 'left': stale, last message 500 ms ago (limit 300 ms)"
    assert len(reasons) == 3  # both cameras and ego
    # The rig restarts 1 s later with frame ids and the sensor clock reset: accepted as a restart.
    feed(s, 1.6, start=-T_BASE + 1, recv_shift=T_BASE + 2600 * MS)
    restarted = s.snapshot(0)
    assert restarted["left"]["restarts"] == 1 and restarted["ego"]["restarts"] == 1
    assert s.epoch == 3  # two cameras and the ego stream restarted
    w = s.take_window(now_ns=0)
    assert w is not None and w.t0_ns == 1 + 1500 * MS and w.ticks_dropped == 0


def test_resolution_change_restarts_the_camera_ring():
    s = state()
    s.accept(frame(0, 1, T_BASE), recv_ns=T_BASE)
    s.accept(frame(0, 2, T_BASE + 100 * MS, size=4), recv_ns=T_BASE + MS)
    snap = s.snapshot(0)["left"]
    assert (snap["restarts"], snap["dropped"], snap["buffered"]) == (1, 1, 1)


def test_reset_forgets_frames_and_poses_but_keeps_counts():
    s = state()
    feed(s, 1.0)
    s.reset()
    snap = s.snapshot(0)
    assert snap["left"]["buffered"] == 0 and snap["left"]["accepted"] == 10 and snap["ego"]["buffered"] == 0
    assert s.stale_reasons(0)[0] == "camera 'left': nothing received yet"
    assert s.epoch == 1
    feed(s, 1.6)  # same frame ids and times again: accepted after a reset
    assert s.take_window(now_ns=0) is not None


def test_slerp_follows_the_short_arc_and_extrapolates():
    def yaw(a):
        return np.array([0.0, 0.0, np.sin(a / 2), np.cos(a / 2)])

    np.testing.assert_allclose(slerp(yaw(0.2), yaw(0.6), 0.25), yaw(0.3), atol=1e-12)
    np.testing.assert_allclose(slerp(yaw(0.2), yaw(0.6), 1.5), yaw(0.8), atol=1e-12)
    q = slerp(yaw(0.1), -yaw(0.3), 0.5)  # -q is the same rotation: interpolate through 0.2, not the long way
    assert abs(abs(np.dot(q, yaw(0.2))) - 1) < 1e-12


def test_consecutive_backwards_messages_on_a_fresh_stream_restart_it_at_once():
    s = state()  # backwards_restart_after = 3
    for k in range(5):
        t = T_BASE + k * 100 * MS
        s.accept(frame(0, 100 + k, t), recv_ns=t)
        s.accept(pose(t), recv_ns=t)
    # the rig's clock and ids are reset while it keeps sending (never stale)
    recv = T_BASE + 500 * MS
    for k in range(3):
        t = 1_000 * MS + k * 100 * MS
        messages = [frame(0, k, t), pose(t)]
        for message in messages:
            if k < 2:
                with pytest.raises(ProtocolError, match="is older than the last accepted") as info:
                    s.accept(message, recv_ns=recv + k * 100 * MS)
                assert info.value.reason == "backwards"
            else:
                s.accept(message, recv_ns=recv + k * 100 * MS)
    snap = s.snapshot(0)
    assert (snap["left"]["restarts"], snap["left"]["accepted"], snap["left"]["buffered"]) == (1, 6, 1)
    assert (snap["ego"]["restarts"], snap["ego"]["buffered"]) == (1, 1)
    s.accept(frame(0, 3, 1_300 * MS), recv_ns=recv + 300 * MS)  # the new stream carries on
    assert s.snapshot(0)["left"]["lost"] == 0


def test_a_time_ahead_of_the_other_streams_is_rejected_as_future_and_moves_no_clock():
    s = state(max_future_ms=2000)
    s.accept(pose(T_BASE), recv_ns=T_BASE)
    s.accept(frame(0, 0, T_BASE), recv_ns=T_BASE)
    with pytest.raises(ProtocolError) as info:  # 2.1 s ahead of the ego pose and the left camera
        s.accept(frame(1, 0, T_BASE + 2100 * MS), recv_ns=T_BASE)
    assert (info.value.reason, str(info.value)) == (
        "future",
        "camera 'front': newest message 2.1 s ahead of ego (limit 2 s); rejected as future",
    )
    # the others' clocks advance with the node's: 1.5 s later the same time is within the bound
    s.accept(frame(1, 0, T_BASE + 2100 * MS), recv_ns=T_BASE + 1500 * MS)
    with pytest.raises(ProtocolError, match="ahead of camera 'front'") as info:
        s.accept(frame(0, 1, T_BASE + 3_600_000 * MS), recv_ns=T_BASE + 1500 * MS)
    s.accept(frame(0, 1, T_BASE + 100 * MS), recv_ns=T_BASE + 1500 * MS)  # left's clock did not move
    # a camera sending only future frames is named so in the stale reasons
    late = T_BASE + 2000 * MS  # ego is stale by now, the front camera is not
    with pytest.raises(ProtocolError, match="ahead of camera 'front'"):
        s.accept(frame(0, 2, T_BASE + 9_000 * MS), recv_ns=late)
    reasons = s.stale_reasons(late + 600 * MS)
    assert reasons[0].startswith("camera 'left': newest message") and reasons[0].endswith(
        "rejected as future"
    )
    # with every other stream stale there is no clock to compare with: accepted
    s.accept(frame(0, 3, T_BASE + 9_000 * MS), recv_ns=late + 1001 * MS)


def test_a_frame_id_jump_is_an_id_sequence_restart_not_lost_frames():
    s = state(max_frame_id_jump=1000)
    s.accept(frame(0, 5, T_BASE), recv_ns=T_BASE)
    s.accept(frame(0, 1006, T_BASE + 100 * MS), recv_ns=T_BASE + 100 * MS)  # 1000 lost: within the bound
    s.accept(frame(0, 2**32 - 1, T_BASE + 200 * MS), recv_ns=T_BASE + 200 * MS)
    snap = s.snapshot(0)["left"]
    assert (snap["lost"], snap["id_restarts"], snap["restarts"], snap["accepted"]) == (1000, 1, 0, 3)
