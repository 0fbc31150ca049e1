"""The runner's driver boundary: one AlpaSim egodriver session (`egodriver.EgodriverService`), typed.

Frames: `local` is the simulation's fixed world frame (x east, y north, z up, metres); `rig` is the ego rig at
a pose's time (x forward, y left, z up; origin at the rear axle on the ground). Times are the scene clock in
microseconds. A `Driver` is what the rollout talks to; the runner answers it with
the AlpaSim gRPC service of `bridges.alpasim` through its client (`GrpcDriver`).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from bridges.alpasim.client import AlpasimDriverClient, EgoDynamics, EgoPose, trajectory_arrays


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


class GrpcDriver:
    """A `Driver` over the wire: the AlpaSim egodriver service (`bridges.alpasim.service`) through the
    project's client (`bridges.alpasim.client.AlpasimDriverClient`). `size` (height, width) is the camera
    resolution the session announces."""

    def __init__(self, client: AlpasimDriverClient, size: tuple[int, int]):
        self.client = client
        self.size = size

    def start_session(self, session_id: str, seed: int, cameras: Sequence[str]) -> None:
        self.client.start_session(session_id, cameras, seed, scene_id=session_id, resolution_hw=self.size)

    def submit_image(
        self, session_id: str, logical_id: str, frame_start_us: int, frame_end_us: int, image: bytes
    ) -> None:
        self.client.submit_image(session_id, logical_id, image, frame_start_us, frame_end_us)

    def submit_egomotion(self, session_id: str, egomotion: Egomotion) -> None:
        e = egomotion
        poses = [
            EgoPose(int(t), tuple(p), (q[3], q[0], q[1], q[2]))
            for t, p, q in zip(e.timestamps_us, e.xyz.tolist(), e.quat_xyzw.tolist(), strict=True)
        ]
        dynamics = [
            EgoDynamics(tuple(v), tuple(a))
            for v, a in zip(e.velocity.tolist(), e.acceleration.tolist(), strict=True)
        ]
        self.client.submit_egomotion(session_id, poses, dynamics)

    def submit_route(self, session_id: str, timestamp_us: int, waypoints_rig: np.ndarray) -> None:
        self.client.submit_route(session_id, timestamp_us, waypoints_rig)

    def drive(self, session_id: str, time_now_us: int, time_query_us: int) -> DrivePlan:
        response = self.client.drive(session_id, time_now_us, time_query_us)
        t_us, xyz, wxyz = trajectory_arrays(response.trajectory)
        if len(t_us) == 0:
            return DrivePlan(t_us, xyz, wxyz)
        samples = np.stack([trajectory_arrays(t)[1] for t in response.debug_info.sampled_trajectories])
        # The debug bytes come from the project's own service on this machine (pickled, as NVIDIA's driver).
        debug = pickle.loads(response.debug_info.unstructured_debug_info)
        return DrivePlan(t_us, xyz, wxyz[:, [1, 2, 3, 0]], samples, debug["reasoning_text"])

    def close_session(self, session_id: str) -> None:
        self.client.close_session(session_id)
