"""Per-camera frame rings, the ego track, and the 10 Hz input window the node predicts on.

Clocks: frame and pose times (`t_sof_ns`, `t_ns`) are the sensors' clock and are only compared with each
other; arrival times (`recv_ns`) are the node's `time.perf_counter_ns()` and are what freshness and frame
age are measured with, because the sensors' clock may be another host's (or a recording's, in replay).

Window at t0 (the newest time every camera has a frame for: the minimum over cameras of their newest
`t_sof_ns`): per camera the frames nearest t0 - 0.3, -0.2, -0.1, 0 s (at `rate_hz`), each within
`sync_tolerance_ms`; and 16 ego poses at t0 - 1.5 .. 0 s, interpolated (linear xyz, slerp orientation) and
extrapolated by at most `max_ego_extrapolation_ms` past the newest pose. A new window is taken only when t0
has advanced by a period (less `cadence_tolerance_ms`); windows in between are skipped and counted as dropped
ticks (newest wins: nothing is queued).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

from alpamayo.prediction import FRAMES_PER_CAMERA, HISTORY_STEPS, EgoHistory
from bridges.config import TimingSection
from bridges.protocol import CameraFrame, CameraTable, CameraWindow, EgoPose, ProtocolError

DROP_WINDOW_NS = (
    10_000_000_000  # frame_drop_perc covers windows taken in the last 10 s (openpilot's filter RC)
)
EGO_KEEP_NS = 3_000_000_000  # poses kept behind the newest: the 1.5 s history plus slack for lagging cameras
EGO_MAX_POSES = 4096  # bounds memory for high-rate pose sources (1 kHz keeps 3 s)


@dataclass
class StreamCounters:
    """Cumulative per-stream counts. Frames: accepted = used + dropped + (frames still in the ring, unused)."""

    accepted: int = 0
    lost: int = 0  # frame_id gaps: frames the node never received
    dropped: int = 0  # accepted frames evicted without being used in any window (newest wins)
    used: int = 0
    restarts: int = 0  # the stream resumed after being stale, or changed resolution


@dataclass
class StoredFrame:
    frame: CameraFrame
    recv_ns: int
    decode_ms: float
    used: bool = False


@dataclass
class CameraTrack:
    name: str
    ring: deque[StoredFrame] = field(default_factory=deque)
    last_frame_id: int | None = None
    last_t_sof_ns: int | None = None
    last_recv_ns: int | None = None
    counters: StreamCounters = field(default_factory=StreamCounters)


@dataclass
class EgoTrack:
    poses: deque[EgoPose] = field(default_factory=lambda: deque(maxlen=EGO_MAX_POSES))
    last_recv_ns: int | None = None
    counters: StreamCounters = field(default_factory=StreamCounters)


@dataclass
class Window:
    """One prediction's inputs, in the Predictor's layout (camera index -> 4 frames, oldest first)."""

    t0_ns: int
    frames: dict[int, list[np.ndarray]]
    frame_times_ns: dict[int, list[int]]
    cameras: list[CameraWindow]
    ego: EgoHistory
    recv_ns: int  # arrival of the earliest-arriving t0 frame (frame age is measured from it)
    ticks_dropped: int  # 10 Hz slots skipped since the previous window
    decode_ms: float  # node time spent decoding this window's newest frames
    epoch: int  # InputState.epoch when taken: a change means the streams restarted since the last window


class InputState:
    """All input state of the node, shared by the intake thread (`accept`) and the predict thread
    (`take_window`, `stale_reasons`); every public method holds one lock."""

    def __init__(self, cameras: CameraTable, timing: TimingSection, ring_frames: int):
        self.cameras = cameras
        self.ring_frames = ring_frames
        self.period_ns = round(1e9 / timing.rate_hz)
        self.sync_ns = round(timing.sync_tolerance_ms * 1e6)
        self.cadence_ns = round(timing.cadence_tolerance_ms * 1e6)
        self.stale_ns = round(timing.stale_after_ms * 1e6)
        self.extrapolation_ns = round(timing.max_ego_extrapolation_ms * 1e6)
        self._lock = threading.Lock()
        self._tracks = {i: CameraTrack(n) for n, i in cameras.indices.items()}
        self._ego = EgoTrack()
        self._last_t0: int | None = None
        self._drops: deque[tuple[int, int]] = deque()  # (taken at, ticks dropped before it), DROP_WINDOW_NS
        self.ticks_dropped = 0
        self.waiting_for = "no frames yet"  # why take_window last returned None
        self.epoch = 0  # incremented when any stream restarts or on reset(): frame times may repeat after it

    # ------------------------------------------------------------------------------------------ intake
    def accept(self, message: CameraFrame | EgoPose, recv_ns: int, decode_ms: float = 0.0) -> None:
        """Add a decoded message; raises ProtocolError (duplicate/backwards) for out-of-order streams."""
        with self._lock:
            if isinstance(message, CameraFrame):
                self._accept_frame(message, recv_ns, decode_ms)
            else:
                self._accept_pose(message, recv_ns)

    def _accept_frame(self, frame: CameraFrame, recv_ns: int, decode_ms: float) -> None:
        track = self._tracks[frame.camera]
        if track.last_frame_id is not None:
            resized = track.ring and track.ring[-1].frame.image.shape != frame.image.shape
            if self._is_stale(track.last_recv_ns, recv_ns) or resized:
                self._restart_camera(track)
            else:
                _check_order(
                    f"camera {track.name!r}",
                    (
                        ("frame_id", frame.frame_id, track.last_frame_id),
                        ("t_sof_ns", frame.t_sof_ns, track.last_t_sof_ns),
                    ),
                )
                track.counters.lost += frame.frame_id - track.last_frame_id - 1
        track.last_frame_id, track.last_t_sof_ns, track.last_recv_ns = frame.frame_id, frame.t_sof_ns, recv_ns
        track.counters.accepted += 1
        track.ring.append(StoredFrame(frame, recv_ns, decode_ms))
        self._evict(track)

    def _accept_pose(self, pose: EgoPose, recv_ns: int) -> None:
        ego = self._ego
        if ego.poses:
            if self._is_stale(ego.last_recv_ns, recv_ns):
                ego.poses.clear()
                ego.counters.restarts += 1
                self._last_t0 = None
                self.epoch += 1
            else:
                _check_order("ego", (("t_ns", pose.t_ns, ego.poses[-1].t_ns),))
        ego.poses.append(pose)
        ego.last_recv_ns = recv_ns
        ego.counters.accepted += 1
        while ego.poses[0].t_ns < pose.t_ns - EGO_KEEP_NS:
            ego.poses.popleft()

    def _is_stale(self, last_recv_ns: int | None, now_ns: int) -> bool:
        return last_recv_ns is None or now_ns - last_recv_ns > self.stale_ns

    def _restart_camera(self, track: CameraTrack) -> None:
        while track.ring:
            self._drop(track, track.ring.popleft())
        track.counters.restarts += 1
        self._last_t0 = None  # the restarted stream's clock may have been reset: windows start afresh
        self.epoch += 1

    def _evict(self, track: CameraTrack) -> None:
        """Frames beyond the ring size, or too old for any window after the last one taken, are dropped.

        The next window has t0 >= last t0 + period - cadence tolerance, so its oldest slot takes no frame
        earlier than that minus (FRAMES_PER_CAMERA - 1) periods and the sync tolerance."""
        oldest_useful = (
            None
            if self._last_t0 is None
            else self._last_t0 - (FRAMES_PER_CAMERA - 2) * self.period_ns - self.cadence_ns - self.sync_ns
        )
        while len(track.ring) > self.ring_frames or (
            oldest_useful is not None and track.ring and track.ring[0].frame.t_sof_ns < oldest_useful
        ):
            self._drop(track, track.ring.popleft())

    @staticmethod
    def _drop(track: CameraTrack, stored: StoredFrame) -> None:
        if not stored.used:
            track.counters.dropped += 1

    # ------------------------------------------------------------------------------------------ windows
    def take_window(self, now_ns: int) -> Window | None:
        """The newest complete window if t0 advanced by a period since the last one, else None (and
        `waiting_for` says what is missing)."""
        with self._lock:
            empty = [t.name for t in self._tracks.values() if not t.ring]
            if empty:
                self.waiting_for = f"no frames from camera(s) {', '.join(empty)}"
                return None
            t0 = min(t.ring[-1].frame.t_sof_ns for t in self._tracks.values())
            if self._last_t0 is not None and t0 < self._last_t0 + self.period_ns - self.cadence_ns:
                self.waiting_for = "no newer frame from every camera since the last window"
                return None
            slots = {}
            for i, track in self._tracks.items():
                slots[i] = self._slots(track, t0)
                if slots[i] is None:
                    self.waiting_for = (
                        f"camera {track.name!r} has no frame within {self.sync_ns / 1e6:g} ms of each of "
                        f"t0 - {FRAMES_PER_CAMERA - 1}..0 periods"
                    )
                    return None
            ego = self._ego_history(t0)
            if ego is None:
                self.waiting_for = "ego poses do not cover the 1.6 s history ending at t0"
                return None
            self.waiting_for = ""
            return self._commit(t0, slots, ego, now_ns)

    def _slots(self, track: CameraTrack, t0: int) -> list[StoredFrame] | None:
        times = np.array([s.frame.t_sof_ns for s in track.ring], dtype=np.int64)
        picked = window_slots(times, t0, self.period_ns, self.sync_ns)
        return None if picked is None else [track.ring[j] for j in picked]

    def _commit(self, t0: int, slots: dict[int, list[StoredFrame]], ego: EgoHistory, now_ns: int) -> Window:
        ticks = 0 if self._last_t0 is None else max(0, round((t0 - self._last_t0) / self.period_ns) - 1)
        self._last_t0 = t0
        self.ticks_dropped += ticks
        self._drops.append((now_ns, ticks))
        while self._drops[0][0] < now_ns - DROP_WINDOW_NS:
            self._drops.popleft()
        for i, stored in slots.items():
            for s in stored:
                if not s.used:
                    s.used = True
                    self._tracks[i].counters.used += 1
            self._evict(self._tracks[i])
        return Window(
            t0_ns=t0,
            frames={i: [s.frame.image for s in stored] for i, stored in slots.items()},
            frame_times_ns={i: [s.frame.t_sof_ns for s in stored] for i, stored in slots.items()},
            cameras=[
                CameraWindow(
                    self._tracks[i].name,
                    i,
                    [s.frame.frame_id for s in stored],
                    [s.frame.t_sof_ns for s in stored],
                )
                for i, stored in sorted(slots.items())
            ],
            ego=ego,
            recv_ns=min(stored[-1].recv_ns for stored in slots.values()),
            ticks_dropped=ticks,
            decode_ms=sum(stored[-1].decode_ms for stored in slots.values()),
            epoch=self.epoch,
        )

    def _ego_history(self, t0: int) -> EgoHistory | None:
        poses = self._ego.poses
        if not poses:
            return None
        times = np.array([p.t_ns for p in poses], dtype=np.int64)
        targets = t0 - self.period_ns * np.arange(HISTORY_STEPS - 1, -1, -1, dtype=np.int64)
        xyz, quat = np.empty((HISTORY_STEPS, 3)), np.empty((HISTORY_STEPS, 4))
        for n, t in enumerate(targets):
            j = int(np.searchsorted(times, t))
            if j < len(times) and times[j] == t:
                xyz[n], quat[n] = poses[j].xyz, poses[j].quat_xyzw
            elif 0 < j < len(times):
                if times[j] - times[j - 1] > self.stale_ns:
                    return None  # a gap in the pose stream: interpolating across it would invent motion
                xyz[n], quat[n] = _interpolate(poses[j - 1], poses[j], t)
            elif j == len(times) and t - times[-1] <= self.extrapolation_ns:
                pose = _extrapolate(poses, t, self.stale_ns)
                if pose is None:
                    return None
                xyz[n], quat[n] = pose
            else:
                return None
        return EgoHistory(xyz=xyz, quat_xyzw=quat, t_ns=targets)

    # ------------------------------------------------------------------------------------------ health
    def stale_reasons(self, now_ns: int) -> list[str]:
        """Why the inputs are not fresh at `now_ns` (empty when every camera and the ego stream are fresh)."""
        with self._lock:
            streams = [(f"camera {t.name!r}", t.last_recv_ns) for t in self._tracks.values()]
            streams.append(("ego", self._ego.last_recv_ns))
        limit = self.stale_ns / 1e6
        reasons = []
        for name, last in streams:
            if last is None:
                reasons.append(f"{name}: nothing received yet")
            elif now_ns - last > self.stale_ns:
                reasons.append(
                    f"{name}: stale, last message {(now_ns - last) / 1e6:.0f} ms ago (limit {limit:.0f} ms)"
                )
        return reasons

    def frame_drop_perc(self) -> float:
        """Percentage of 10 Hz slots not predicted over the last 10 s: 100 * dropped / (dropped + predicted)."""
        with self._lock:
            dropped = sum(d for _, d in self._drops)
            return 100.0 * dropped / (dropped + len(self._drops)) if self._drops else 0.0

    def reset(self) -> None:
        """Forget every frame, pose and the last t0 (counters are kept); streams may restart at any frame_id."""
        with self._lock:
            for track in self._tracks.values():
                while track.ring:
                    self._drop(track, track.ring.popleft())
                track.last_frame_id = track.last_t_sof_ns = track.last_recv_ns = None
            self._ego.poses.clear()
            self._ego.last_recv_ns = None
            self._last_t0 = None
            self._drops.clear()
            self.epoch += 1

    def snapshot(self, now_ns: int) -> dict[str, dict]:
        """Per-stream counters and freshness for `status`."""
        with self._lock:
            out = {}
            for i, t in self._tracks.items():
                out[t.name] = {
                    "index": i,
                    **asdict(t.counters),
                    "last_frame_id": t.last_frame_id,
                    "age_ms": None if t.last_recv_ns is None else (now_ns - t.last_recv_ns) / 1e6,
                    "buffered": len(t.ring),
                    "pending": sum(not s.used for s in t.ring),  # accepted = used + dropped + pending
                }
            ego = self._ego
            out["ego"] = {
                "accepted": ego.counters.accepted,
                "restarts": ego.counters.restarts,
                "age_ms": None if ego.last_recv_ns is None else (now_ns - ego.last_recv_ns) / 1e6,
                "buffered": len(ego.poses),
            }
            return out


def _check_order(stream: str, fields: tuple[tuple[str, int, int | None], ...]) -> None:
    for name, value, last in fields:
        if last is not None and value == last:
            raise ProtocolError("duplicate", f"{stream}: {name} {value} repeats the last accepted one")
    for name, value, last in fields:
        if last is not None and value < last:
            raise ProtocolError(
                "backwards", f"{stream}: {name} {value} is older than the last accepted {last}"
            )


def _interpolate(a: EgoPose, b: EgoPose, t: int) -> tuple[np.ndarray, np.ndarray]:
    u = (t - a.t_ns) / (b.t_ns - a.t_ns)
    return a.xyz + u * (b.xyz - a.xyz), slerp(a.quat_xyzw, b.quat_xyzw, u)


def _extrapolate(poses: deque[EgoPose], t: int, max_gap_ns: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Pose at t past the newest of `poses`: position from its velocity if sent, else the last two poses'
    motion continued; orientation continued from the last two poses, else held."""
    b = poses[-1]
    a = poses[-2] if len(poses) >= 2 and b.t_ns - poses[-2].t_ns <= max_gap_ns else None
    if a is None and b.velocity is None:
        return None
    xyz, quat = _interpolate(a, b, t) if a is not None else (b.xyz, b.quat_xyzw)
    if b.velocity is not None:
        xyz = b.xyz + b.velocity * (t - b.t_ns) / 1e9
    return xyz, quat


def window_slots(times_ns: np.ndarray, t0_ns: int, period_ns: int, tolerance_ns: int) -> list[int] | None:
    """Indices into `times_ns` of the frames nearest t0 - 3, -2, -1, 0 periods (oldest first), each within
    `tolerance_ns`; None when a slot has no such frame or two slots would share one."""
    picked: list[int] = []
    for k in range(FRAMES_PER_CAMERA - 1, -1, -1):
        if len(times_ns) == 0:
            return None
        err = np.abs(times_ns - (t0_ns - k * period_ns))
        j = int(np.argmin(err))
        if err[j] > tolerance_ns or (picked and picked[-1] == j):
            return None
        picked.append(j)
    return picked


def slerp(q0: np.ndarray, q1: np.ndarray, u: float) -> np.ndarray:
    """Spherical interpolation of unit quaternions (x, y, z, w) along the short arc; u outside [0, 1]
    extrapolates along the same great circle."""
    if np.dot(q0, q1) < 0.0:
        q1 = -q1
    # The angle between the unit vectors via atan2 stays accurate near 0, where arccos(dot) loses half the digits.
    theta = 2.0 * np.arctan2(np.linalg.norm(q0 - q1), np.linalg.norm(q0 + q1))
    if theta < 1e-12:
        return q0.copy()
    q = (np.sin((1 - u) * theta) * q0 + np.sin(u * theta) * q1) / np.sin(theta)
    return q / np.linalg.norm(q)
