"""Typed client of the AlpaSim egodriver service, one method per RPC.

Poses are AlpaSim's: ``local->rig`` transforms as translation ``xyz`` (metres, local frame) and rotation
quaternion ``wxyz``; timestamps are integer microseconds. The rig frame is x forward, y left, z up.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from bridges.alpasim.v0 import (
    common_pb2,
    driver_admin_pb2_grpc,
    egodriver_pb2,
    egodriver_pb2_grpc,
    sensorsim_pb2,
)


@dataclass(frozen=True)
class EgoPose:
    """One ego pose: ``local->rig`` at ``timestamp_us``; ``xyz`` metres, ``quat_wxyz`` unit quaternion."""

    timestamp_us: int
    xyz: tuple[float, float, float]
    quat_wxyz: tuple[float, float, float, float]


@dataclass(frozen=True)
class EgoDynamics:
    """Rig-frame dynamic state: linear velocity (m/s), linear acceleration (m/s^2), angular velocity (rad/s)."""

    linear_velocity: tuple[float, float, float]
    linear_acceleration: tuple[float, float, float] = (0.0, 0.0, 0.0)
    angular_velocity: tuple[float, float, float] = (0.0, 0.0, 0.0)


def _vec3(v: Sequence[float]) -> common_pb2.Vec3:
    return common_pb2.Vec3(x=float(v[0]), y=float(v[1]), z=float(v[2]))


def pose_at_time(pose: EgoPose) -> common_pb2.PoseAtTime:
    """The wire message of one ego pose."""
    w, x, y, z = (float(c) for c in pose.quat_wxyz)
    return common_pb2.PoseAtTime(
        pose=common_pb2.Pose(vec=_vec3(pose.xyz), quat=common_pb2.Quat(w=w, x=x, y=y, z=z)),
        timestamp_us=int(pose.timestamp_us),
    )


def trajectory_arrays(trajectory: common_pb2.Trajectory) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(timestamps_us [N] int64, xyz [N,3] float64, quat_wxyz [N,4] float64)`` of a wire trajectory."""
    poses = trajectory.poses
    ts = np.array([p.timestamp_us for p in poses], dtype=np.int64)
    xyz = np.array([[p.pose.vec.x, p.pose.vec.y, p.pose.vec.z] for p in poses], dtype=np.float64).reshape(
        -1, 3
    )
    q = np.array(
        [[p.pose.quat.w, p.pose.quat.x, p.pose.quat.y, p.pose.quat.z] for p in poses], dtype=np.float64
    ).reshape(-1, 4)
    return ts, xyz, q


class AlpasimDriverClient:
    """Blocking client of ``egodriver.EgodriverService`` (and the project's ``DriverAdmin``) at ``target``.

    ``target`` is a gRPC address: ``HOST:PORT`` or ``unix:PATH``. Errors surface as ``grpc.RpcError`` with the
    service's status code and message. ``timeout_s`` bounds each call.
    """

    def __init__(self, target: str, timeout_s: float = 120.0) -> None:
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", 64 << 20),
                ("grpc.max_receive_message_length", 64 << 20),
            ],
        )
        self._stub = egodriver_pb2_grpc.EgodriverServiceStub(self._channel)
        self._admin = driver_admin_pb2_grpc.DriverAdminStub(self._channel)
        self._timeout_s = timeout_s

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AlpasimDriverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the channel connects (raises ``grpc.FutureTimeoutError`` after ``timeout_s``)."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout_s)

    def start_session(
        self,
        session_uuid: str,
        camera_ids: Sequence[str],
        random_seed: int = 0,
        scene_id: str | None = None,
        resolution_hw: tuple[int, int] = (1080, 1920),
    ) -> None:
        """Open a session whose vehicle carries ``camera_ids`` (AlpaSim logical ids) at ``resolution_hw``."""
        cameras = [
            sensorsim_pb2.AvailableCamerasReturn.AvailableCamera(
                logical_id=cam,
                intrinsics=sensorsim_pb2.CameraSpec(
                    logical_id=cam, resolution_h=resolution_hw[0], resolution_w=resolution_hw[1]
                ),
            )
            for cam in camera_ids
        ]
        request = egodriver_pb2.DriveSessionRequest(
            session_uuid=session_uuid,
            random_seed=random_seed,
            rollout_spec=egodriver_pb2.DriveSessionRequest.RolloutSpec(
                vehicle=egodriver_pb2.DriveSessionRequest.RolloutSpec.VehicleDefinition(
                    available_cameras=cameras
                )
            ),
        )
        if scene_id is not None:
            request.debug_info.scene_id = scene_id
        self._stub.start_session(request, timeout=self._timeout_s)

    def close_session(self, session_uuid: str) -> None:
        self._stub.close_session(
            egodriver_pb2.DriveSessionCloseRequest(session_uuid=session_uuid), timeout=self._timeout_s
        )

    def submit_image(
        self, session_uuid: str, logical_id: str, image_bytes: bytes, frame_start_us: int, frame_end_us: int
    ) -> None:
        """Send one encoded (JPEG/PNG) camera frame exposed from ``frame_start_us`` to ``frame_end_us``."""
        image = egodriver_pb2.RolloutCameraImage.CameraImage(
            frame_start_us=int(frame_start_us),
            frame_end_us=int(frame_end_us),
            image_bytes=image_bytes,
            logical_id=logical_id,
        )
        self._stub.submit_image_observation(
            egodriver_pb2.RolloutCameraImage(session_uuid=session_uuid, camera_image=image),
            timeout=self._timeout_s,
        )

    def submit_egomotion(
        self, session_uuid: str, poses: Sequence[EgoPose], dynamics: Sequence[EgoDynamics]
    ) -> None:
        """Send ego poses (``local->rig_est``) with one rig-frame dynamic state per pose."""
        states = [
            common_pb2.DynamicState(
                linear_velocity=_vec3(d.linear_velocity),
                linear_acceleration=_vec3(d.linear_acceleration),
                angular_velocity=_vec3(d.angular_velocity),
                angular_acceleration=_vec3((0.0, 0.0, 0.0)),
            )
            for d in dynamics
        ]
        request = egodriver_pb2.RolloutEgoTrajectory(
            session_uuid=session_uuid,
            trajectory=common_pb2.Trajectory(poses=[pose_at_time(p) for p in poses]),
            dynamic_states=states,
        )
        self._stub.submit_egomotion_observation(request, timeout=self._timeout_s)

    def submit_route(self, session_uuid: str, timestamp_us: int, waypoints_in_rig: np.ndarray) -> None:
        """Send route waypoints ``[N,3]`` metres in the rig frame at ``timestamp_us``."""
        route = egodriver_pb2.Route(
            timestamp_us=int(timestamp_us),
            waypoints=[_vec3(w) for w in np.asarray(waypoints_in_rig, dtype=float)],
        )
        self._stub.submit_route(
            egodriver_pb2.RouteRequest(session_uuid=session_uuid, route=route), timeout=self._timeout_s
        )

    def submit_ground_truth(
        self, session_uuid: str, timestamp_us: int, poses_in_rig: Sequence[EgoPose]
    ) -> None:
        """Send the recorded future, each pose in the rig frame at ``timestamp_us``."""
        gt = egodriver_pb2.GroundTruth(
            timestamp_us=int(timestamp_us),
            trajectory=common_pb2.Trajectory(poses=[pose_at_time(p) for p in poses_in_rig]),
        )
        self._stub.submit_recording_ground_truth(
            egodriver_pb2.GroundTruthRequest(session_uuid=session_uuid, ground_truth=gt),
            timeout=self._timeout_s,
        )

    def drive(self, session_uuid: str, time_now_us: int, time_query_us: int) -> egodriver_pb2.DriveResponse:
        """The plan at ``time_query_us``: ``response.trajectory`` holds ``local->rig_est`` poses (empty while the
        session lacks history); ``response.debug_info.sampled_trajectories`` the K samples; see
        :func:`trajectory_arrays`."""
        request = egodriver_pb2.DriveRequest(
            session_uuid=session_uuid, time_now_us=int(time_now_us), time_query_us=int(time_query_us)
        )
        return self._stub.drive(request, timeout=self._timeout_s)

    def get_version(self) -> common_pb2.VersionId:
        return self._stub.get_version(common_pb2.Empty(), timeout=self._timeout_s)

    def get_status(self) -> dict:
        """The service's counters and open sessions (``DriverAdmin.get_status``)."""
        return json.loads(self._admin.get_status(common_pb2.Empty(), timeout=self._timeout_s).json)

    def shut_down(self) -> None:
        """Ask the server to stop (``DriverAdmin.shut_down``)."""
        self._admin.shut_down(common_pb2.Empty(), timeout=self._timeout_s)
