"""Model inputs from a recorded drive (any `bridges.drives.DriveSource`), one tick per 10 Hz reference-camera
frame, or at the source's own tick times (PhysicalAI-AV clips: `tick_times_ns`).

At tick t0 (a frame of the layout's first camera, at least one period after the previous tick) each camera
contributes its frames nearest t0 - 0.3, -0.2, -0.1, 0 s, each within FRAME_TOLERANCE_NS; the ego history is
the 16 recorded poses interpolated at t0 - 1.5 .. 0 s; the recorded future is the poses at t0 + 0.1 .. 6.4 s
in the t0 ego frame (None when the recording ends sooner). Ticks before the recording has 4 frames per camera
and 1.5 s of poses are not ticks; later ticks that lack a frame or a pose are skipped with a warning.
A source with fixed tick times picks each tick's frames itself (`window_frames`), and the ego history and
future come from its own pose track the same way.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from alpamayo.input_window import (
    FRAME_OFFSETS_NS,
    FUTURE_OFFSETS_NS,
    HISTORY_OFFSETS_NS,
    MAX_POSE_GAP_NS,
    HistoryUnavailable,
    PoseTrack,
    SlotMissing,
    frame_slots,
)
from alpamayo.prediction import FRAMES_PER_CAMERA, PERIOD_NS, EgoHistory
from alpamayo.rotations import heading, to_frame
from bridges.drives.recording import FrameError, RecordedFrame, RecordingError, Warn

FRAME_TOLERANCE_NS = PERIOD_NS // 2  # nearest frame within half a period: never the neighbouring slot's frame
TICK_JITTER_NS = 10_000_000  # a reference frame up to 10 ms early still starts the next tick


@dataclass
class Tick:
    """One prediction's inputs. frames: camera index -> 4 frames oldest first; future: the recorded
    (xyz [64, 3] metres, heading [64] rad) in the t0 ego frame, or None when the recording ends sooner."""

    index: int
    t0_ns: int
    frames: dict[int, list[RecordedFrame]]
    ego_history: EgoHistory
    future: tuple[np.ndarray, np.ndarray] | None

    @property
    def frame_times_ns(self) -> dict[int, list[int]]:
        return {c: [f.t_ns for f in frames] for c, frames in self.frames.items()}


def recorded_history(poses: PoseTrack, t0_ns: int) -> EgoHistory | None:
    """The recorded ego poses at t0 - 1.5 .. 0 s (world frame); None when the recording does not cover them
    or has a pose gap over `alpamayo.input_window.MAX_POSE_GAP_NS` among them."""
    try:
        return poses.history_at(t0_ns)
    except HistoryUnavailable:
        return None


def recorded_future(poses: PoseTrack, t0_ns: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The recorded ego poses at t0 + 0.1 .. 6.4 s in the t0 ego frame: xyz [64, 3] metres and heading [64]
    rad; None when the recording does not cover them."""
    return poses_in_t0_frame(poses, t0_ns, t0_ns + FUTURE_OFFSETS_NS)


def poses_in_t0_frame(
    poses: PoseTrack, t0_ns: int, times_ns: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """The recorded ego poses at `times_ns` [M] in the ego frame at t0: xyz [M, 3] metres and heading [M] rad;
    None when the recording does not cover t0 and every time."""
    try:
        (xyz0,), (quat0,) = poses.at(np.array([t0_ns]))
        at = poses.at(times_ns)
    except HistoryUnavailable:
        return None
    xyz, rot = to_frame(xyz0, quat0, at[0], at[1])
    return xyz, heading(rot)


@dataclass
class TickAssembler:
    """Iterates the ticks of `drive` (a `bridges.drives.DriveSource`) with t0 in [first reference frame (or first
    fixed tick) + start_s, ... + duration_s).

    `skipped` counts ticks skipped mid-drive by reason; `not_ready` the ticks before inputs were complete.
    """

    drive: Any
    start_s: float = 0.0
    duration_s: float | None = None
    warn: Warn = print
    skipped: Counter = field(default_factory=Counter)
    not_ready: int = 0

    def __post_init__(self) -> None:
        if self.start_s < 0:
            raise ValueError(f"start must be >= 0 s, got {self.start_s}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration must be > 0 s, got {self.duration_s}")

    def __iter__(self) -> Iterator[Tick]:
        if self.drive.tick_times_ns is not None:
            yield from self._fixed_ticks(np.asarray(self.drive.tick_times_ns, dtype=np.int64))
            return
        cameras = [c.camera for c in self.drive.layout.cameras]
        reference = cameras[0]
        buffers: dict[int, deque[RecordedFrame]] = {c: deque() for c in cameras}
        first_seen: dict[int, int] = {}
        pending: deque[int] = deque()
        window: tuple[int, int | None] | None = None
        last_tick: int | None = None
        index = 0
        for frame in self.drive.frames():
            buffers[frame.camera].append(frame)
            first_seen.setdefault(frame.camera, frame.t_ns)
            if frame.camera == reference:
                if window is None:
                    begin = frame.t_ns + round(self.start_s * 1e9)
                    window = (
                        begin,
                        None if self.duration_s is None else begin + round(self.duration_s * 1e9),
                    )
                in_window = frame.t_ns >= window[0] and (window[1] is None or frame.t_ns < window[1])
                if in_window and (last_tick is None or frame.t_ns - last_tick >= PERIOD_NS - TICK_JITTER_NS):
                    pending.append(frame.t_ns)
                    last_tick = frame.t_ns
            while pending and all(
                buffers[c] and buffers[c][-1].t_ns > pending[0] + FRAME_TOLERANCE_NS for c in cameras
            ):
                tick = self._assemble(index, pending.popleft(), buffers, first_seen)
                if tick is not None:
                    index += 1
                    yield tick
            oldest = (
                (pending[0] if pending else last_tick or frame.t_ns)
                + FRAME_OFFSETS_NS[0]
                - FRAME_TOLERANCE_NS
            )
            for buffer in buffers.values():
                while buffer and buffer[0].t_ns < oldest:
                    buffer.popleft()
            if window is not None and window[1] is not None and not pending and frame.t_ns >= window[1]:
                break
        for t0 in pending:
            tick = self._assemble(index, t0, buffers, first_seen)
            if tick is not None:
                index += 1
                yield tick

    def _fixed_ticks(self, times: np.ndarray) -> Iterator[Tick]:
        """The source's own tick times in the window; each tick's frames from `window_frames`."""
        if len(times) == 0:
            return
        begin = int(times[0]) + round(self.start_s * 1e9)
        end = None if self.duration_s is None else begin + round(self.duration_s * 1e9)
        index = 0
        for t0 in (int(t) for t in times):
            if t0 < begin or (end is not None and t0 >= end):
                continue
            try:
                frames = self.drive.window_frames(t0)
            except FrameError as e:
                self._skip(t0, "a camera frame is missing or does not decode", str(e))
                continue
            tick = self._with_ego(index, t0, frames)
            if tick is not None:
                index += 1
                yield tick

    def _with_ego(self, index: int, t0: int, frames: dict[int, list[RecordedFrame]]) -> Tick | None:
        ego = recorded_history(self.drive.poses, t0)
        if ego is None:
            if t0 + HISTORY_OFFSETS_NS[0] < self.drive.poses.t_ns[0]:
                self.not_ready += 1
                return None
            return self._skip(
                t0, f"the ego poses have a gap over {MAX_POSE_GAP_NS / 1e9:g} s in the 1.5 s history"
            )
        return Tick(index, t0, frames, ego, recorded_future(self.drive.poses, t0))

    def _assemble(
        self, index: int, t0: int, buffers: dict[int, deque[RecordedFrame]], first_seen: dict[int, int]
    ) -> Tick | None:
        frames = {}
        for camera, buffer in buffers.items():
            times = np.array([f.t_ns for f in buffer], dtype=np.int64)
            try:
                picked = frame_slots(times, t0, FRAME_TOLERANCE_NS)
            except SlotMissing:
                if t0 + FRAME_OFFSETS_NS[0] + FRAME_TOLERANCE_NS < first_seen.get(camera, t0 + 1):
                    self.not_ready += 1
                    return None
                return self._skip(
                    t0,
                    f"camera {camera} lacks a frame within {FRAME_TOLERANCE_NS / 1e6:g} ms of one of "
                    f"t0 {FRAME_OFFSETS_NS[0] / 1e9:+.1f} .. 0 s",
                )
            frames[camera] = [buffer[j] for j in picked]
        return self._with_ego(index, t0, frames)

    def no_ticks_error(self) -> RecordingError:
        """The error for a window that held no tick, naming the window and what a tick needs."""
        end = "the end" if self.duration_s is None else f"{self.start_s + self.duration_s:g} s"
        return RecordingError(
            f"drive {self.drive.spec} has no tick between {self.start_s:g} s and {end} after its first "
            f"frame (the first tick needs {-HISTORY_OFFSETS_NS[0] / 1e9:g} s of ego poses and "
            f"{FRAMES_PER_CAMERA} frames per camera; {sum(self.skipped.values())} tick(s) were skipped)"
        )

    def _skip(self, t0: int, reason: str, detail: str | None = None) -> None:
        """Count a skipped tick under `reason` and warn with `detail` (default: the reason)."""
        self.skipped[reason] += 1
        self.warn(f"skipped the tick at t0 = {t0} ns: {detail or reason}")
        return None
