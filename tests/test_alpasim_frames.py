"""One camera's frames of an AlpaSim session (`bridges.alpasim.frames`): time order whatever the arrival order,
a duplicate refused even while the first is still being decoded, the window's frames 100 ms apart at any rate
that is a multiple of 10 Hz, and every refusal naming its reason."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from bridges.alpasim.frames import KEEP_US, CameraFrames
from bridges.alpasim.status import InputRejected

T0 = 2_000_000


def _add(frames: CameraFrames, times) -> None:
    for t in times:
        frames.reserve(t)
        frames.insert(t, np.full((2, 2, 3), t % 251, dtype=np.uint8))


def _refusal(fn) -> InputRejected:
    with pytest.raises(InputRejected) as e:
        fn()
    return e.value


@pytest.mark.parametrize("hz", [10, 20, 30, 40, 50, 60])
def test_the_window_is_four_frames_100_ms_apart_whatever_the_arrival_order(hz):
    times = [T0 - round(k * 1e6 / hz) for k in range(3 * hz // 10 + 1)]
    frames = CameraFrames("cam", capacity=32)
    _add(frames, np.random.default_rng(hz).permutation(times).tolist())
    _add(frames, [T0 + 10_000])  # after the query: kept for a later drive, not used by this one
    window = frames.window(T0)
    # every (hz / 10)-th frame back from t0, as NVIDIA's subsample_factor = hz / 10 (30 Hz: 1 us short of 0.1 s)
    assert [t for t, _ in window] == [T0 - round(k * (hz // 10) * 1e6 / hz) for k in (3, 2, 1, 0)]
    assert all(int(img[0, 0, 0]) == t % 251 for t, img in window)


def test_a_duplicate_is_refused_while_the_first_is_being_decoded_and_others_go_on():
    frames = CameraFrames("cam", capacity=8)
    frames.reserve(T0)  # being decoded: no lock is held meanwhile
    e = _refusal(lambda: frames.reserve(T0))
    assert (e.code, e.reason) == (grpc.StatusCode.ALREADY_EXISTS, "duplicate_frame")
    assert "a frame ending at 2000000 us is already held (duplicate frame)" in str(e)
    _add(frames, [T0 - 100_000, T0 + 100_000])  # other frames of the camera are not held up
    frames.release(T0)  # its decode failed: the time may come again
    _add(frames, [T0])
    assert len(frames) == 3
    e = _refusal(lambda: _add(frames, [T0]))
    assert e.reason == "duplicate_frame"


def test_frames_older_than_the_window_are_refused_and_pruned():
    frames = CameraFrames("cam", capacity=6)
    _add(frames, [T0])
    _add(frames, [T0 - KEEP_US])  # the window's edge is still inside
    e = _refusal(lambda: _add(frames, [T0 - KEEP_US - 1]))
    assert (e.code, e.reason) == (grpc.StatusCode.OUT_OF_RANGE, "stale_frame")
    assert "older than the camera's window" in str(e)
    _add(frames, [T0 + 50_000])  # the newest moves on: the oldest leaves the window
    assert len(frames) == 2
    # a full cache refuses a frame older than all it holds (it would be dropped at once)
    _add(frames, [T0 + 10_000 * k for k in range(1, 5)])
    assert len(frames) == 6
    assert _refusal(lambda: _add(frames, [T0 - 10_000])).reason == "stale_frame"


def test_the_window_waits_for_0_3_s_and_names_what_it_cannot_use():
    frames = CameraFrames("camera_front_wide_120fov", capacity=8)
    assert frames.window(T0) is None  # no frames yet
    _add(frames, [T0 - 200_000, T0 - 100_000, T0])
    assert frames.window(T0) is None  # 0.2 s: still filling
    e = _refusal(lambda: frames.window(T0 - 300_000))
    assert (e.code, e.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "no_frame_before_t0")
    # 8 frames of a 40 Hz camera span 175 ms: the capacity cannot ever hold the window
    fast = CameraFrames("cam", capacity=8)
    _add(fast, [T0 - 25_000 * k for k in range(8)])
    e = _refusal(lambda: fast.window(T0))
    assert e.reason == "frames_per_camera"
    assert "8 frames span 175 ms, the model needs 300 ms: --frames-per-camera 8 is too few" in str(e)
    assert "frames 25 ms apart (40 Hz)" in str(e)
    # a 5 Hz camera: frames 200 ms apart, none near t0 - 100 ms
    slow = CameraFrames("cam", capacity=8)
    _add(slow, [T0 - 200_000 * k for k in range(3)])
    e = _refusal(lambda: slow.window(T0))
    assert e.reason == "frame_spacing"
    assert "t0 - 100 ms (nearest 100 ms off)" in str(e) and "frames 200 ms apart (5 Hz)" in str(e)
    # a dropped frame at 20 Hz is named the same way
    gap = CameraFrames("cam", capacity=16)
    _add(gap, [T0 - 50_000 * k for k in range(7) if k != 4])
    e = _refusal(lambda: gap.window(T0))
    assert "t0 - 200 ms (nearest 50 ms off)" in str(e)
