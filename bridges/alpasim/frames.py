"""One camera's frames in an AlpaSim session, and the model's 4 of them at a drive.

Intake, as NVIDIA's driver keeps frames (`alpasim_driver/frame_cache.py`): in time order of `frame_end_us`. A
frame may arrive in any order within the camera's window and is inserted where it belongs: AlpaSim's runtime
fires a step's observations as concurrent tasks, so a camera faster than the policy has several frames in flight
at once. Refused, with the reason: a time already held or being decoded (ALREADY_EXISTS `duplicate_frame`, where
NVIDIA raises "Frame T already exists in cache"), and a frame older than the window, KEEP_US behind the
camera's newest (OUT_OF_RANGE `stale_frame`: no later drive could use it).

Check, decode and insert are atomic per camera without holding a lock while decoding: `reserve` claims the
time under the camera's lock (a concurrent frame of the same time is refused from then on), the caller decodes
with no lock held, then `insert` stores the pixels, or `release` gives the time back when decoding failed. No
other camera or session waits on a decode.

The window (`window`), NVIDIA's `inference.subsample_factor` derived from the frame times: the anchor is the
newest frame at or before the drive's `time_now_us`, then the frames nearest anchor - 0.1, -0.2, -0.3 s, each
within SLOT_TOLERANCE_US (`alpamayo.input_window.frame_slots`, the slot rule of the node's window). A 20 Hz camera
gives every 2nd frame, 30 Hz every 3rd, 40 Hz every 4th, as subsample_factor 2, 3, 4 would, with no setting to
match to the camera. NVIDIA counts frames back from the newest in the cache; here times count back from the
newest at or before the query, so a frame after the query or one missing from the stream does not shift the
window. A camera whose rate is not a multiple of 10 Hz (15 Hz: frames 66.7 ms apart) or is below 10 Hz has no
frame within the tolerance of some slot: the drive is refused naming the camera and its frame spacing
(FAILED_PRECONDITION `frame_spacing`); the model was trained on frames 0.1 s apart and would read others wrongly.
"""

from __future__ import annotations

import bisect
import threading

import grpc
import numpy as np

from alpamayo.input_window import SlotMissing, frame_slots
from alpamayo.prediction import FRAMES_PER_CAMERA, PERIOD_US
from bridges.alpasim.status import InputRejected

WINDOW_US = (FRAMES_PER_CAMERA - 1) * PERIOD_US  # the 4 frames span 0.3 s
# Simulated frame times are exact: 30 Hz frames are 33_333 us apart, 3 of them 1 us short of 0.1 s. Rates that
# are not a multiple of 10 Hz miss a slot by far more (15 Hz: 33 ms; 25 Hz: 20 ms; 95 Hz: 5.3 ms).
SLOT_TOLERANCE_US = 5_000
# Frames kept behind the camera's newest: the window's 0.3 s and one model period for a frame newer than the
# next drive's query.
KEEP_US = WINDOW_US + PERIOD_US


class CameraFrames:
    """One camera's frames of one session, oldest first: `frame_end_us` and HxWx3 uint8 pixels, at most
    `capacity` of them and none more than KEEP_US older than the newest. Thread-safe."""

    def __init__(self, camera: str, capacity: int) -> None:
        self.camera = camera
        self.capacity = capacity
        self._lock = threading.Lock()
        self._times: list[int] = []
        self._images: list[np.ndarray] = []
        self._pending: set[int] = set()  # times reserved by a frame being decoded

    def __len__(self) -> int:
        with self._lock:
            return len(self._times)

    def reserve(self, t_us: int) -> None:
        """Claim `t_us` for a frame about to be decoded; InputRejected if it is a duplicate or too old."""
        with self._lock:
            j = bisect.bisect_left(self._times, t_us)
            if t_us in self._pending or (j < len(self._times) and self._times[j] == t_us):
                raise InputRejected(
                    grpc.StatusCode.ALREADY_EXISTS,
                    "duplicate_frame",
                    f"camera {self.camera}: a frame ending at {t_us} us is already held (duplicate frame)",
                )
            if self._times and (
                t_us < self._times[-1] - KEEP_US or (len(self._times) >= self.capacity and j == 0)
            ):
                raise InputRejected(
                    grpc.StatusCode.OUT_OF_RANGE,
                    "stale_frame",
                    f"camera {self.camera}: frame_end_us={t_us} is older than the camera's window (frames "
                    f"{self._times[0]}..{self._times[-1]} us, kept {KEEP_US / 1e3:g} ms behind the newest, at "
                    f"most {self.capacity}): it arrives too late to be used",
                )
            self._pending.add(t_us)

    def release(self, t_us: int) -> None:
        """Give back a reserved time whose frame could not be decoded."""
        with self._lock:
            self._pending.discard(t_us)

    def insert(self, t_us: int, image: np.ndarray) -> None:
        """Store the decoded frame of a reserved time in time order; drop frames older than the window."""
        with self._lock:
            self._pending.discard(t_us)
            j = bisect.bisect_left(self._times, t_us)
            self._times.insert(j, t_us)
            self._images.insert(j, image)
            drop = bisect.bisect_left(self._times, self._times[-1] - KEEP_US)
            drop = max(drop, len(self._times) - self.capacity)
            del self._times[:drop], self._images[:drop]

    def window(self, query_us: int) -> list[tuple[int, np.ndarray]] | None:
        """The model's FRAMES_PER_CAMERA frames (time, pixels), oldest first, ending at the newest frame at or
        before `query_us` (see the module docstring); None while the frames do not reach back WINDOW_US from
        it (the session is still filling). InputRejected (FAILED_PRECONDITION) when no frame is at or before
        the query, when the capacity cannot hold 0.3 s of this camera, or when the frames are not 0.1 s apart."""
        with self._lock:
            times, images = list(self._times), list(self._images)
        if not times:
            return None
        n = bisect.bisect_right(times, query_us)
        if n == 0:
            raise InputRejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                "no_frame_before_t0",
                f"camera {self.camera}: no frame at or before time_now_us={query_us}: its oldest frame ends at "
                f"{times[0]}",
            )
        anchor = times[n - 1]
        if times[0] > anchor - WINDOW_US + SLOT_TOLERANCE_US:
            if len(times) >= self.capacity:
                raise InputRejected(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "frames_per_camera",
                    f"camera {self.camera}: {len(times)} frames span {(anchor - times[0]) / 1e3:g} ms, the model "
                    f"needs {WINDOW_US / 1e3:g} ms: --frames-per-camera {self.capacity} is too few for its "
                    f"{_rate(times)}",
                )
            return None
        held = np.array(times[:n], dtype=np.int64)
        try:
            picked = frame_slots(held, anchor, SLOT_TOLERANCE_US, PERIOD_US)
        except SlotMissing as e:
            # the newest slot without a frame (the tolerance is far below half a period: no frame serves two)
            k, err = e.missing[-1]
            if err is None:  # the nearest rule over a non-empty list has a nearest frame for every slot
                raise RuntimeError(f"camera {self.camera}: slot {k} missed with no nearest frame") from None
            raise InputRejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                "frame_spacing",
                self._spacing_message(held, anchor, k, err),
            ) from None
        return [(times[j], images[j]) for j in picked]

    def _spacing_message(self, times: np.ndarray, anchor: int, k: int, err: int) -> str:
        return (
            f"camera {self.camera}: no frame within {SLOT_TOLERANCE_US / 1e3:g} ms of t0 - {k * PERIOD_US / 1e3:g} ms "
            f"(nearest {err / 1e3:.3g} ms off) with t0 its newest frame at {anchor} us; {_rate(list(times))}. The "
            f"model takes frames {PERIOD_US / 1e3:g} ms apart: a camera rate that is not a multiple of "
            f"{1e6 / PERIOD_US:g} Hz cannot give them"
        )


def _rate(times: list[int]) -> str:
    """'frames 66.7 ms apart (15 Hz)': the median spacing of `times`, or 'one frame'."""
    if len(times) < 2:
        return "one frame"
    gap_us = float(np.median(np.diff(times)))
    return f"frames {gap_us / 1e3:.3g} ms apart ({1e6 / gap_us:.3g} Hz)"
