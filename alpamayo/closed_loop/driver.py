"""The runner's driver boundary: one AlpaSim egodriver session (`egodriver.EgodriverService`), typed.

Frames: `local` is the simulation's fixed world frame (x east, y north, z up, metres); `rig` is the ego rig at
a pose's time (x forward, y left, z up; origin at the rear axle on the ground). Times are the scene clock in
microseconds. A `Driver` is what the rollout talks to; `InProcessDriver` answers with the project's runtime in
this process (the AlpaSim gRPC client of `bridges.alpasim` answers the same calls over the wire).
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from PIL import Image

from alpamayo.prediction import FRAMES_PER_CAMERA, EgoHistory
from alpamayo.rotations import yaw_to_quat
from alpamayo.runtime import AlpamayoVLA

# NVIDIA's driver maps AlpaSim's logical camera ids to Alpamayo's camera indices this way
# (alpasim_driver/models/alpamayo_base.py CAMERA_NAME_TO_INDEX).
CAMERA_INDEX = {
    "camera_cross_left_120fov": 0,
    "camera_front_wide_120fov": 1,
    "camera_cross_right_120fov": 2,
    "camera_rear_left_70fov": 3,
    "camera_rear_tele_30fov": 4,
    "camera_rear_right_70fov": 5,
    "camera_front_tele_30fov": 6,
}
HISTORY_POSES = 16


@dataclass(frozen=True)
class Egomotion:
    """Ego poses local->rig, oldest first: timestamps_us [N] int64, xyz [N, 3] metres, quat_xyzw [N, 4] (the
    rig->local rotation), and the dynamic state in the rig frame: velocity [N, 3] m/s, acceleration [N, 3]
    m/s^2."""

    timestamps_us: np.ndarray
    xyz: np.ndarray
    quat_xyzw: np.ndarray
    velocity: np.ndarray
    acceleration: np.ndarray


@dataclass(frozen=True)
class DrivePlan:
    """A `drive` answer: the selected trajectory as local->rig poses at timestamps_us [T] (xyz [T, 3] metres,
    quat_xyzw [T, 4]), the K sampled trajectories' positions samples_xyz [K, T, 3] (local), and the reasoning.
    T = 0: the driver holds no plan yet (too little history), and the simulator holds the ego."""

    timestamps_us: np.ndarray
    xyz: np.ndarray
    quat_xyzw: np.ndarray
    samples_xyz: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 3)))
    reasoning: str = ""

    @property
    def empty(self) -> bool:
        return len(self.timestamps_us) == 0


def rig_to_local(xyz: np.ndarray, origin: np.ndarray, yaw: float) -> np.ndarray:
    """Points xyz [..., 3] of the rig at local position `origin` [3] and yaw `yaw` rad -> local [..., 3].
    Written out rather than a matmul: BLAS picks kernels by thread count, and a Ray worker (one thread) must
    write the in-process run's bytes."""
    c, s = np.cos(yaw), np.sin(yaw)
    x, y = xyz[..., 0], xyz[..., 1]
    return np.stack([c * x - s * y + origin[0], s * x + c * y + origin[1], xyz[..., 2] + origin[2]], axis=-1)


class Driver(Protocol):
    """An egodriver session, in the order AlpaSim calls it: start, then each tick images, egomotion, route and
    drive; close at the end."""

    def start_session(self, session_id: str, seed: int, cameras: Sequence[str]) -> None: ...

    def submit_image(
        self, session_id: str, logical_id: str, frame_start_us: int, frame_end_us: int, image: bytes
    ) -> None: ...

    def submit_egomotion(self, session_id: str, egomotion: Egomotion) -> None: ...

    def submit_route(self, session_id: str, timestamp_us: int, waypoints_rig: np.ndarray) -> None: ...

    def drive(self, session_id: str, time_now_us: int, time_query_us: int) -> DrivePlan: ...

    def close_session(self, session_id: str) -> None: ...


@dataclass
class _Session:
    cameras: tuple[str, ...]
    seed: int
    frames: dict[int, deque] = field(default_factory=dict)  # camera index -> (frame_end_us, rgb [H, W, 3])
    egomotion: Egomotion | None = None


class InProcessDriver:
    """A `Driver` answered by `predictor` in this process: the last 4 frames per camera (at or before the
    query time) and the last 16 ego poses go into one prediction per `drive`; K samples, the first selected.
    The route is accepted and not used (the demo checkpoints take no navigation text)."""

    def __init__(self, predictor: AlpamayoVLA, num_samples: int = 1):
        self.predictor = predictor
        self.num_samples = num_samples
        self.sessions: dict[str, _Session] = {}

    def start_session(self, session_id: str, seed: int, cameras: Sequence[str]) -> None:
        unknown = [c for c in cameras if c not in CAMERA_INDEX]
        if unknown:
            raise ValueError(f"unknown camera(s) {unknown}; allowed: {list(CAMERA_INDEX)}")
        self.sessions[session_id] = _Session(tuple(cameras), seed)
        # Features cached by frame time must not carry over from another scene on the same clock.
        self.predictor.reset()

    def submit_image(
        self, session_id: str, logical_id: str, frame_start_us: int, frame_end_us: int, image: bytes
    ) -> None:
        session = self._session(session_id)
        if logical_id not in session.cameras:
            raise ValueError(f"camera {logical_id!r} is not one of the session's {list(session.cameras)}")
        rgb = np.asarray(Image.open(io.BytesIO(image)).convert("RGB"))
        frames = session.frames.setdefault(CAMERA_INDEX[logical_id], deque(maxlen=FRAMES_PER_CAMERA))
        frames.append((frame_end_us, rgb))

    def submit_egomotion(self, session_id: str, egomotion: Egomotion) -> None:
        self._session(session_id).egomotion = egomotion

    def submit_route(self, session_id: str, timestamp_us: int, waypoints_rig: np.ndarray) -> None:
        self._session(session_id)

    def drive(self, session_id: str, time_now_us: int, time_query_us: int) -> DrivePlan:
        session = self._session(session_id)
        ego = session.egomotion
        ready = ego is not None and len(ego.timestamps_us) >= HISTORY_POSES
        ready = ready and all(
            len(session.frames.get(CAMERA_INDEX[c], ())) == FRAMES_PER_CAMERA for c in session.cameras
        )
        if not ready:
            return DrivePlan(np.zeros(0, np.int64), np.zeros((0, 3)), np.zeros((0, 4)))
        cams = sorted(session.frames)
        history = EgoHistory(
            ego.xyz[-HISTORY_POSES:],
            ego.quat_xyzw[-HISTORY_POSES:],
            ego.timestamps_us[-HISTORY_POSES:].astype(np.int64) * 1000,
        )
        prediction = self.predictor.predict(
            {c: [rgb for _, rgb in session.frames[c]] for c in cams},
            history,
            num_samples=self.num_samples,
            seed=session.seed,
            frame_times_ns={c: [t * 1000 for t, _ in session.frames[c]] for c in cams},
        )
        # The t0 ego frame is the rig at the last pose: local = R(yaw0) rig + p0.
        p0, q0 = ego.xyz[-1], ego.quat_xyzw[-1]
        yaw0 = 2 * np.arctan2(q0[2], q0[3])
        samples = np.stack([rig_to_local(s.xyz, p0, yaw0) for s in prediction.samples])
        best = prediction.best
        t_us = int(ego.timestamps_us[-1]) + np.round(prediction.t_s * 1e6).astype(np.int64)
        return DrivePlan(t_us, samples[0], yaw_to_quat(best.heading + yaw0), samples, best.reasoning)

    def close_session(self, session_id: str) -> None:
        self._session(session_id)
        del self.sessions[session_id]

    def _session(self, session_id: str) -> _Session:
        if session_id not in self.sessions:
            raise ValueError(f"session {session_id!r} is not open; open: {sorted(self.sessions)}")
        return self.sessions[session_id]
