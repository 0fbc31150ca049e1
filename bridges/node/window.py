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

Selecting a window and committing it are two steps (`select`, `commit`; `take_window` does both), so the
node can decode the selected JPEG frames in between without holding the lock that intake needs.

Clock rules (docs/protocol.md): a message further ahead of the other streams than `max_future_ms` is
rejected as `future` and leaves its stream's clock alone; a frame_id step above `max_frame_id_jump` counts as
an id-sequence restart, not as lost frames; `backwards_restart_after` consecutive `backwards` messages on a
fresh stream restart it (the last one is accepted as its first message).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

from alpamayo.input_window import HistoryUnavailable, PoseTrack, SlotMissing, frame_slots
from alpamayo.prediction import FRAMES_PER_CAMERA, HISTORY_STEPS, EgoHistory
from bridges.node.config import TimingSection
from bridges.wire.protocol import CameraTable, CameraWindow, EgoPose, ProtocolError, WireFrame

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
    restarts: int = 0  # the stream resumed after being stale, its clock went back, or it changed resolution
    id_restarts: int = 0  # frame_id jumped by more than timing.max_frame_id_jump (cameras only)
    decode_failures: int = 0  # JPEG frames found undecodable when a window needed them (moved to rejected)


@dataclass
class StoredFrame:
    frame: WireFrame
    recv_ns: int
    decode_ms: float  # node time spent decoding it: header and validation at intake, plus the JPEG decode
    used: bool = False


@dataclass
class Track:
    """What every stream has: its clock (newest accepted time, arrival), the run of `backwards` messages and
    the last `future` rejection (arrival, reason) that status and stale outputs report."""

    name: str
    last_t_ns: int | None = None
    last_recv_ns: int | None = None
    backwards_run: int = 0
    future: tuple[int, str] | None = None
    counters: StreamCounters = field(default_factory=StreamCounters)
    # How messages name the stream: "camera 'front'" or "ego". Set once: intake names streams per message.
    label: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.label = f"camera {self.name!r}"


@dataclass
class CameraTrack(Track):
    ring: deque[StoredFrame] = field(default_factory=deque)
    last_frame_id: int | None = None

    @property
    def ring_bytes(self) -> int:
        return sum(s.frame.held_bytes for s in self.ring)

    def holds(self, stored: StoredFrame) -> bool:
        """True while `stored` is in the ring (by identity: frames compare by value, pixels included)."""
        return any(s is stored for s in self.ring)


@dataclass
class EgoTrack(Track):
    poses: deque[EgoPose] = field(default_factory=lambda: deque(maxlen=EGO_MAX_POSES))

    def __post_init__(self) -> None:
        self.label = self.name


@dataclass
class Selection:
    """A window chosen by `InputState.select`, not yet committed: per camera index the 4 stored frames."""

    t0_ns: int
    slots: dict[int, list[StoredFrame]]
    ego: EgoHistory
    epoch: int

    def undecoded(self) -> list[StoredFrame]:
        """The JPEG frames of the window still to decode (each once, though windows share frames)."""
        return [s for stored in self.slots.values() for s in stored if s.frame.image is None]


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

    def __init__(
        self, cameras: CameraTable, timing: TimingSection, ring_frames: int, ring_bytes: int | None = None
    ):
        """ring_bytes: memory of all rings together (None: unbounded), shared equally by the cameras."""
        self.cameras = cameras
        self.ring_frames = ring_frames
        self.ring_bytes_per_camera = None if ring_bytes is None else ring_bytes // len(cameras.indices)
        self.future_ns = round(timing.max_future_ms * 1e6)
        self.max_id_jump = timing.max_frame_id_jump
        self.backwards_restart_after = timing.backwards_restart_after
        self.period_ns = round(1e9 / timing.rate_hz)
        self.sync_ns = round(timing.sync_tolerance_ms * 1e6)
        self.cadence_ns = round(timing.cadence_tolerance_ms * 1e6)
        self.stale_ns = round(timing.stale_after_ms * 1e6)
        self.extrapolation_ns = round(timing.max_ego_extrapolation_ms * 1e6)
        self._lock = threading.Lock()
        self._tracks = {i: CameraTrack(n) for n, i in cameras.indices.items()}
        self._ego = EgoTrack("ego")
        self._last_t0: int | None = None
        self._drops: deque[tuple[int, int]] = deque()  # (taken at, ticks dropped before it), DROP_WINDOW_NS
        self.ticks_dropped = 0
        self.waiting_for = "no frames yet"  # why take_window last returned None
        self.epoch = 0  # incremented when any stream restarts or on reset(): frame times may repeat after it

    # ------------------------------------------------------------------------------------------ intake
    def accept(self, message: WireFrame | EgoPose, recv_ns: int, decode_ms: float = 0.0) -> None:
        """Add a decoded message; raises ProtocolError (duplicate/backwards) for out-of-order streams."""
        with self._lock:
            if isinstance(message, WireFrame):
                self._accept_frame(message, recv_ns, decode_ms)
            else:
                self._accept_pose(message, recv_ns)

    def _accept_frame(self, frame: WireFrame, recv_ns: int, decode_ms: float) -> None:
        track = self._tracks[frame.camera]
        self._check_future(track, frame.t_sof_ns, recv_ns)
        if track.last_frame_id is not None:
            newest = track.ring[-1].frame if track.ring else None
            resized = newest is not None and (newest.width, newest.height) != (frame.width, frame.height)
            if self._is_stale(track.last_recv_ns, recv_ns) or resized:
                self._restart_camera(track)
            elif self._in_order(
                track,
                (
                    ("frame_id", frame.frame_id, track.last_frame_id),
                    ("t_sof_ns", frame.t_sof_ns, track.last_t_ns),
                ),
            ):
                gap = frame.frame_id - track.last_frame_id - 1
                if gap > self.max_id_jump:
                    track.counters.id_restarts += 1
                else:
                    track.counters.lost += gap
            else:
                self._restart_camera(track)
        track.last_frame_id, track.last_t_ns, track.last_recv_ns = frame.frame_id, frame.t_sof_ns, recv_ns
        track.counters.accepted += 1
        track.ring.append(StoredFrame(frame, recv_ns, decode_ms))
        self._evict(track)

    def _accept_pose(self, pose: EgoPose, recv_ns: int) -> None:
        ego = self._ego
        self._check_future(ego, pose.t_ns, recv_ns)
        restart = ego.last_t_ns is not None and (
            self._is_stale(ego.last_recv_ns, recv_ns)
            or not self._in_order(ego, (("t_ns", pose.t_ns, ego.last_t_ns),))
        )
        if restart:
            ego.poses.clear()
            ego.counters.restarts += 1
            self._last_t0 = None
            self.epoch += 1
        ego.poses.append(pose)
        ego.last_t_ns, ego.last_recv_ns = pose.t_ns, recv_ns
        ego.counters.accepted += 1
        while ego.poses[0].t_ns < pose.t_ns - EGO_KEEP_NS:
            ego.poses.popleft()

    def _in_order(self, track: Track, fields: tuple[tuple[str, int, int | None], ...]) -> bool:
        """True if the message follows the stream's last one; False if it is the `backwards_restart_after`-th
        `backwards` in a row (the stream's clock was reset: restart it); raises duplicate / backwards."""
        try:
            _check_order(track.label, fields)
        except ProtocolError as e:
            if e.reason != "backwards":
                raise
            track.backwards_run += 1
            if track.backwards_run < self.backwards_restart_after:
                raise
            track.backwards_run = 0
            return False
        track.backwards_run = 0
        return True

    def _check_future(self, track: Track, t_ns: int, recv_ns: int) -> None:
        """Reject a time further ahead than `future_ns` of every other fresh stream's clock, each advanced by
        the node time since its newest message (so a pause of the other streams is not mistaken for it)."""
        others = [
            (t.last_t_ns + (recv_ns - t.last_recv_ns), t.label)
            for t in (*self._tracks.values(), self._ego)
            if t is not track
            and t.last_t_ns is not None
            and t.last_recv_ns is not None
            and not self._is_stale(t.last_recv_ns, recv_ns)
        ]
        if not others:
            return
        ref, name = max(others)
        ahead = t_ns - ref
        if ahead > self.future_ns:
            message = (
                f"{track.label}: newest message {ahead / 1e9:.1f} s ahead of {name} "
                f"(limit {self.future_ns / 1e9:g} s); rejected as future"
            )
            track.future = (recv_ns, message)
            raise ProtocolError("future", message)

    def _is_stale(self, last_recv_ns: int | None, now_ns: int) -> bool:
        return last_recv_ns is None or now_ns - last_recv_ns > self.stale_ns

    def _restart_camera(self, track: CameraTrack) -> None:
        self._empty_ring(track)
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
        while track.ring and (
            len(track.ring) > self.ring_frames
            or (self.ring_bytes_per_camera is not None and track.ring_bytes > self.ring_bytes_per_camera)
            or (oldest_useful is not None and track.ring[0].frame.t_sof_ns < oldest_useful)
        ):
            self._drop(track, track.ring.popleft())

    def _empty_ring(self, track: CameraTrack) -> None:
        """Drop every frame in the ring (a restart or a reset); the unused ones count as dropped."""
        while track.ring:
            self._drop(track, track.ring.popleft())

    @staticmethod
    def _drop(track: CameraTrack, stored: StoredFrame) -> None:
        if not stored.used:
            track.counters.dropped += 1

    # ------------------------------------------------------------------------------------------ windows
    def take_window(self, now_ns: int) -> Window | None:
        """The newest complete window if t0 advanced by a period since the last one, else None (and
        `waiting_for` says what is missing). Frames must be decoded (rgb8/bgr8, or JPEGs decoded already)."""
        selection = self.select(now_ns)
        return None if selection is None else self.commit(selection, now_ns)

    def select(self, now_ns: int) -> Selection | None:
        """The newest complete window, not yet committed (its JPEG frames may still need decoding), or None
        with `waiting_for` saying precisely what is missing."""
        with self._lock:
            found = self._select(now_ns)
            self.waiting_for = found if isinstance(found, str) else ""
            return None if isinstance(found, str) else found

    def _select(self, now_ns: int) -> Selection | str:
        tracks = self._tracks.values()
        empty = [t.label for t in tracks if not t.ring]
        if empty:
            return f"{', '.join(empty)}: no frame buffered"
        t0 = min(t.ring[-1].frame.t_sof_ns for t in tracks)
        if self._last_t0 is not None and t0 < self._last_t0 + self.period_ns - self.cadence_ns:
            behind = [t for t in tracks if t.ring[-1].frame.t_sof_ns == t0]
            return "; ".join(
                f"{t.label}: no frame for the next window (a period after the last t0) in "
                f"{(now_ns - _received_ns(t)) / 1e6:.0f} ms"
                for t in behind
            )
        slots = {}
        for i, track in self._tracks.items():
            found = self._slots(track, t0)
            if isinstance(found, str):
                return found
            slots[i] = found
        ego = self._ego_history(t0)
        if isinstance(ego, str):
            return ego
        return Selection(t0, slots, ego, self.epoch)

    def _slots(self, track: CameraTrack, t0: int) -> list[StoredFrame] | str:
        times = np.array([s.frame.t_sof_ns for s in track.ring], dtype=np.int64)
        try:
            return [track.ring[j] for j in frame_slots(times, t0, self.sync_ns, self.period_ns)]
        except SlotMissing as e:
            missing = e
        if times[0] > t0 + self.sync_ns:
            first = next(t for t in self._tracks.values() if t.ring[-1].frame.t_sof_ns == t0)
            return (
                f"{track.label}: oldest buffered frame {(times[0] - t0) / 1e9:.1f} s ahead of "
                f"{first.label}'s newest"
            )
        if missing.shared:
            return f"{track.label}: two window slots would take the same frame"
        k, err = missing.missing[0]
        if err is None:  # the nearest rule over a non-empty ring has a nearest frame for every slot
            raise RuntimeError(f"{track.label}: slot {k} missed with no nearest frame")
        return (
            f"{track.label}: no frame within {self.sync_ns / 1e6:g} ms of {_slot(k * self.period_ns)} "
            f"(nearest {err / 1e6:.0f} ms off)"
        )

    def commit(self, selection: Selection, now_ns: int) -> Window | None:
        """Take a selected window (its frames decoded): mark its frames used, count the skipped ticks. None
        (and `waiting_for` says why) if a stream restarted or a frame left its ring since `select`."""
        with self._lock:
            if selection.epoch != self.epoch:
                self.waiting_for = "streams restarted while the window was being decoded"
                return None
            for i, stored in selection.slots.items():
                track = self._tracks[i]
                if not all(track.holds(s) for s in stored):
                    self.waiting_for = f"{track.label}: frames left the ring while being decoded"
                    return None
            return self._commit(selection.t0_ns, selection.slots, selection.ego, now_ns)

    def discard(self, stored: StoredFrame) -> bool:
        """Take out a frame found undecodable: it leaves its ring and its stream's `accepted` count (the node
        counts the message as rejected instead). False if it had left the ring already (counted dropped)."""
        with self._lock:
            track = self._tracks[stored.frame.camera]
            if not track.holds(stored):
                return False
            track.ring = deque(s for s in track.ring if s is not stored)
            track.counters.accepted -= 1
            track.counters.decode_failures += 1
            return True

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
            frames={i: [_decoded(s.frame) for s in stored] for i, stored in slots.items()},
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

    def _ego_history(self, t0: int) -> EgoHistory | str:
        """The 16 poses at t0 - 15..0 periods (`alpamayo.input_window`: interpolated, and extrapolated by at most
        `extrapolation_ns` past the newest pose; no interpolation across a gap over `stale_ns`, which would
        invent motion), or why they cannot be had."""
        poses = self._ego.poses
        if not poses:
            return "ego: no pose buffered"
        times = np.array([p.t_ns for p in poses], dtype=np.int64)
        # only the poses from the one before the oldest slot on take part
        first = max(int(np.searchsorted(times, t0 - (HISTORY_STEPS - 1) * self.period_ns)) - 1, 0)
        used = [poses[j] for j in range(first, len(poses))]
        track = PoseTrack(
            times[first:],
            np.array([p.xyz for p in used]),
            np.array([p.quat_xyzw for p in used]),
            used[-1].velocity,
        )
        try:
            return track.history_at(
                t0, self.period_ns, max_gap_ns=self.stale_ns, extrapolate_ns=self.extrapolation_ns
            )
        except HistoryUnavailable as e:
            if e.reason == "after":
                return (
                    f"ego: no pose within {self.extrapolation_ns / 1e6:g} ms of t0 "
                    f"(newest {(t0 - times[-1]) / 1e9:.2f} s before it)"
                )
            if e.reason == "no_velocity":
                return "ego: one pose without velocity cannot be extrapolated to t0"
            if e.t is None:  # only "empty" names no time, and poses are buffered
                raise RuntimeError(f"ego: history unavailable without a time: {e}") from e
            if e.reason == "gap":
                if e.gap is None:  # a "gap" always names its length
                    raise RuntimeError(f"ego: history unavailable without its gap: {e}") from e
                return f"ego: a gap of {e.gap / 1e6:.0f} ms between poses at {_slot(t0 - e.t)}"
            return (
                f"ego: poses start {(times[0] - t0) / 1e9:+.2f} s from t0, the history needs "
                f"{(e.t - t0) / 1e9:+.2f} s"
            )

    # ------------------------------------------------------------------------------------------ health
    def stale_reasons(self, now_ns: int) -> list[str]:
        """Why the inputs are not fresh at `now_ns` (empty when every camera and the ego stream are fresh). A
        stream whose messages are being rejected as `future` says so instead."""
        with self._lock:
            streams = [(t.label, t.last_recv_ns, t.future) for t in (*self._tracks.values(), self._ego)]
        limit = self.stale_ns / 1e6
        reasons = []
        for name, last, future in streams:
            if last is not None and now_ns - last <= self.stale_ns:
                continue
            if future is not None and now_ns - future[0] <= self.stale_ns:
                reasons.append(future[1])
            elif last is None:
                reasons.append(f"{name}: nothing received yet")
            else:
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
                self._empty_ring(track)
                track.last_frame_id = None
            for stream in (*self._tracks.values(), self._ego):
                stream.last_t_ns = stream.last_recv_ns = stream.future = None
                stream.backwards_run = 0
            self._ego.poses.clear()
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
                    "ring_bytes": t.ring_bytes,
                }
            ego = self._ego
            out["ego"] = {
                "accepted": ego.counters.accepted,
                "restarts": ego.counters.restarts,
                "age_ms": None if ego.last_recv_ns is None else (now_ns - ego.last_recv_ns) / 1e6,
                "buffered": len(ego.poses),
            }
            return out

    def memory(self) -> dict[str, int | None]:
        """Bytes held by all frame rings now, and their limit (None: unbounded)."""
        with self._lock:
            held = sum(t.ring_bytes for t in self._tracks.values())
        per = self.ring_bytes_per_camera
        return {"ring_bytes": held, "ring_limit_bytes": None if per is None else per * len(self._tracks)}


def _received_ns(track: Track) -> int:
    """Arrival of the stream's newest accepted message; RuntimeError on a stream with frames buffered but
    nothing received (a bug)."""
    if track.last_recv_ns is None:
        raise RuntimeError(f"{track.label}: frames buffered but no arrival recorded")
    return track.last_recv_ns


def _decoded(frame: WireFrame) -> np.ndarray:
    """A window frame's pixels; RuntimeError if still undecoded (windows are committed once decoded)."""
    if frame.image is None:
        raise RuntimeError(f"camera {frame.camera} frame {frame.frame_id}: committed to a window undecoded")
    return frame.image


def _slot(before_t0_ns: int) -> str:
    """A window slot's time in reasons: "t0" or "t0 - 300 ms"."""
    return "t0" if before_t0_ns == 0 else f"t0 - {before_t0_ns / 1e6:g} ms"


def _check_order(stream: str, fields: tuple[tuple[str, int, int | None], ...]) -> None:
    for name, value, last in fields:
        if last is not None and value == last:
            raise ProtocolError("duplicate", f"{stream}: {name} {value} repeats the last accepted one")
    for name, value, last in fields:
        if last is not None and value < last:
            raise ProtocolError(
                "backwards", f"{stream}: {name} {value} is older than the last accepted {last}"
            )
