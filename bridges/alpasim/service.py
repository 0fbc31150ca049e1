"""The AlpaSim policy service (`egodriver.EgodriverService`) backed by any `alpamayo.prediction` predictor.

A session is what NVIDIA's driver (`alpasim_driver/main.py`) makes of one: the cameras it asked for, each
camera's frames in time order (`bridges.alpasim.frames`: frames may arrive in any order and concurrently), the
ego poses (``local->rig_est``) and dynamic states, the route as navigation text. ``drive`` answers an empty
trajectory until every camera's frames reach 0.3 s back and a pose exists (the simulator then holds the ego);
it feeds the model 4 frames per camera 0.1 s apart ending at the newest at or before ``time_now_us``; an ego
history that does not cover the model's 1.5 s before t0 answers FAILED_PRECONDITION; every other bad input a
precise status that leaves the session as it was. Sessions share one model, served in the order their
``drive`` calls take its lock.
"""

from __future__ import annotations

import io
import json
import pickle
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
import numpy as np
from PIL import Image

from alpamayo.input_window import PoseTrack
from alpamayo.prediction import FRAMES_PER_CAMERA, HISTORY_STEPS, PERIOD_US, EgoHistory, Prediction, Predictor
from alpamayo.rotations import compose, from_frame, to_frame, yaw_to_quat
from bridges.alpasim.frames import CameraFrames
from bridges.alpasim.selection import select_sample
from bridges.alpasim.status import InputRejected
from bridges.alpasim.v0 import (
    ALPASIM_GRPC_VERSION,
    common_pb2,
    driver_admin_pb2,
    driver_admin_pb2_grpc,
    egodriver_pb2,
    egodriver_pb2_grpc,
)
from bridges.wire.protocol import ALPAMAYO_CAMERAS
from planner.navigation import route_to_nav_text

T = TypeVar("T")  # what a servicer call's body returns

# NVIDIA's driver maps AlpaSim logical ids to Alpamayo camera indices this way (alpamayo_base.py).
CAMERA_INDEX = {name: index for index, name in ALPAMAYO_CAMERAS.items()}
# The 4 cameras Alpamayo 1.5 is trained on (the driver's default `use_cameras`).
DEFAULT_CAMERAS = (
    "camera_cross_left_120fov",
    "camera_front_wide_120fov",
    "camera_cross_right_120fov",
    "camera_front_tele_30fov",
)
# The service's own version, reported as get_version's version_id (the API version is the protos').
VERSION = "alpamayo-tt-alpasim-driver-0.2.0"


@dataclass
class Limits:
    """Bounds of the service: open sessions, frames kept per camera (0.4 s of frames at most: 17 at 40 Hz,
    25 at 60 Hz), poses kept, image bytes and pixels."""

    max_sessions: int = 8
    frames_per_camera: int = 32
    max_poses: int = 256
    max_image_bytes: int = 16 << 20
    max_image_pixels: int = 3840 * 2160


@dataclass
class Session:
    uuid: str
    seed: int
    cameras: tuple[str, ...]
    frames: dict[str, CameraFrames] = field(default_factory=dict)  # logical id -> its frames
    poses: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)  # (t_us, xyz, quat_xyzw)
    # egomotion merges are read-modify-write: two in flight at once must not lose poses
    poses_lock: threading.Lock = field(default_factory=threading.Lock)
    route: str | None = None
    last_query_us: int = -1
    previous_plan: tuple[np.ndarray, np.ndarray] | None = None  # (t_us [T], xyz_local [T,3])
    drives: int = 0


def _status(code: grpc.StatusCode, reason: str, message: str) -> InputRejected:
    return InputRejected(code, reason, message)


class EgodriverService(
    egodriver_pb2_grpc.EgodriverServiceServicer, driver_admin_pb2_grpc.DriverAdminServicer
):
    """Servicer of both services over one ``predictor`` (`alpamayo.runtime.AlpamayoVLA` or the ttnn one);
    ``num_samples`` K plans are sampled per drive, ``selection`` (`bridges.alpasim.selection`) picks the
    driven one; a drive's seed is the session's ``random_seed`` plus its drive count, as NVIDIA's driver."""

    def __init__(
        self,
        predictor: Predictor,
        model_line: str,
        num_samples: int = 1,
        selection: str = "ALWAYS_FIRST",
        cameras: tuple[str, ...] = DEFAULT_CAMERAS,
        limits: Limits | None = None,
    ) -> None:
        unknown = [c for c in cameras if c not in CAMERA_INDEX]
        if unknown:
            raise ValueError(f"cameras {unknown} are not Alpamayo cameras; known: {sorted(CAMERA_INDEX)}")
        self.limits = limits or Limits()
        if self.limits.frames_per_camera < FRAMES_PER_CAMERA:
            raise ValueError(
                f"frames_per_camera must be at least {FRAMES_PER_CAMERA} (the model's window), "
                f"got {self.limits.frames_per_camera}"
            )
        self._predictor = predictor
        self._last_session: str | None = None  # whose frames the predictor's feature cache holds
        self._model_line = model_line
        self._num_samples = num_samples
        self._selection = selection
        self._cameras = tuple(sorted(cameras, key=CAMERA_INDEX.__getitem__))
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()  # sessions and counters
        self._model_lock = threading.Lock()  # one model, one drive at a time
        self.counters: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.overhead_ms: deque[float] = deque(maxlen=1000)
        self.stop_requested = threading.Event()

    # -- plumbing ------------------------------------------------------------------------------------------
    def _call(self, name: str, context: grpc.ServicerContext, body: Callable[[], T]) -> T:
        try:
            out = body()
        except InputRejected as e:
            with self._lock:
                self.rejected[e.reason] += 1
            context.abort(e.code, str(e))
        except ValueError as e:  # the predictor refused its inputs: named, counted, the session kept
            with self._lock:
                self.rejected["model_input"] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {e}")
        with self._lock:
            self.counters[name] += 1
        return out

    def _session(self, uuid: str) -> Session:
        with self._lock:
            s = self._sessions.get(uuid)
        if s is None:
            raise _status(grpc.StatusCode.NOT_FOUND, "unknown_session", f"session {uuid!r} is not open")
        return s

    # -- EgodriverService ----------------------------------------------------------------------------------
    def start_session(
        self, request: egodriver_pb2.DriveSessionRequest, context: grpc.ServicerContext
    ) -> common_pb2.SessionRequestStatus:
        def body() -> common_pb2.SessionRequestStatus:
            uuid = request.session_uuid
            if not uuid:
                raise _status(grpc.StatusCode.INVALID_ARGUMENT, "bad_session", "session_uuid is empty")
            offered = {c.logical_id for c in request.rollout_spec.vehicle.available_cameras}
            missing = [c for c in self._cameras if c not in offered]
            if missing:
                raise _status(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "missing_cameras",
                    f"requested cameras {missing} are missing from the rollout spec (offered {sorted(offered)})",
                )
            with self._lock:
                if uuid in self._sessions:
                    raise _status(
                        grpc.StatusCode.ALREADY_EXISTS, "duplicate_session", f"Session {uuid} already exists."
                    )
                if len(self._sessions) >= self.limits.max_sessions:
                    raise _status(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "session_cap",
                        f"{len(self._sessions)} sessions are open, the cap is {self.limits.max_sessions}",
                    )
                self._sessions[uuid] = Session(
                    uuid,
                    int(request.random_seed),
                    self._cameras,
                    {c: CameraFrames(c, self.limits.frames_per_camera) for c in self._cameras},
                )
            return common_pb2.SessionRequestStatus()

        return self._call("start_session", context, body)

    def close_session(
        self, request: egodriver_pb2.DriveSessionCloseRequest, context: grpc.ServicerContext
    ) -> common_pb2.Empty:
        def body() -> common_pb2.Empty:
            with self._lock:
                if self._sessions.pop(request.session_uuid, None) is None:
                    raise _status(
                        grpc.StatusCode.NOT_FOUND,
                        "unknown_session",
                        f"session {request.session_uuid!r} is not open",
                    )
            return common_pb2.Empty()

        return self._call("close_session", context, body)

    def submit_image_observation(
        self, request: egodriver_pb2.RolloutCameraImage, context: grpc.ServicerContext
    ) -> common_pb2.Empty:
        def body() -> common_pb2.Empty:
            s = self._session(request.session_uuid)
            img = request.camera_image
            if img.logical_id not in s.frames:
                raise _status(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "unknown_camera",
                    f"camera {img.logical_id!r} is not one of the session's cameras {list(s.cameras)}",
                )
            if img.frame_end_us < img.frame_start_us:
                raise _status(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "bad_frame_time",
                    f"frame_end_us={img.frame_end_us} is before frame_start_us={img.frame_start_us}",
                )
            n = len(img.image_bytes)
            if n > self.limits.max_image_bytes:
                raise _status(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "image_too_large",
                    f"image of {n} bytes exceeds the limit of {self.limits.max_image_bytes} bytes",
                )
            frames, t_us = s.frames[img.logical_id], int(img.frame_end_us)
            frames.reserve(t_us)  # refuses a duplicate, or a frame older than the window
            try:
                rgb = self._decode(img.logical_id, img.image_bytes)  # no lock held: other frames go on
            except BaseException:
                frames.release(t_us)
                raise
            frames.insert(t_us, rgb)
            return common_pb2.Empty()

        return self._call("submit_image_observation", context, body)

    def _decode(self, camera: str, data: bytes) -> np.ndarray:
        try:
            im = Image.open(io.BytesIO(data))
            if im.format not in ("JPEG", "PNG"):
                raise ValueError(f"format {im.format}, expected JPEG or PNG")
            w, h = im.size
            if w * h > self.limits.max_image_pixels:
                raise _status(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "image_too_large",
                    f"camera {camera}: image {w}x{h} exceeds {self.limits.max_image_pixels} pixels",
                )
            return np.asarray(im.convert("RGB"))
        except InputRejected:
            raise
        except Exception as e:  # PIL raises several types for a corrupt stream
            raise _status(
                grpc.StatusCode.INVALID_ARGUMENT,
                "undecodable_image",
                f"camera {camera}: cannot decode the image: {e}",
            ) from None

    def submit_egomotion_observation(
        self, request: egodriver_pb2.RolloutEgoTrajectory, context: grpc.ServicerContext
    ) -> common_pb2.Empty:
        def body() -> common_pb2.Empty:
            s = self._session(request.session_uuid)
            poses = request.trajectory.poses
            if len(request.dynamic_states) != len(poses):
                raise _status(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "bad_egomotion",
                    f"{len(request.dynamic_states)} dynamic states for {len(poses)} poses (must be 1:1)",
                )
            new = []
            for p in poses:
                q = np.array([p.pose.quat.x, p.pose.quat.y, p.pose.quat.z, p.pose.quat.w], dtype=np.float64)
                norm = float(np.linalg.norm(q))
                if not np.isfinite(norm) or abs(norm - 1.0) > 1e-3:
                    raise _status(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "bad_egomotion",
                        f"pose at {p.timestamp_us} us: quaternion norm {norm:.6f}, expected 1",
                    )
                xyz = np.array([p.pose.vec.x, p.pose.vec.y, p.pose.vec.z], dtype=np.float64)
                new.append((int(p.timestamp_us), xyz, q / norm))
            with s.poses_lock:
                merged = {t: (t, x, q) for t, x, q in s.poses}
                merged.update({t: (t, x, q) for t, x, q in new})
                s.poses = sorted(merged.values(), key=lambda e: e[0])[-self.limits.max_poses :]
            return common_pb2.Empty()

        return self._call("submit_egomotion_observation", context, body)

    def submit_route(
        self, request: egodriver_pb2.RouteRequest, context: grpc.ServicerContext
    ) -> common_pb2.Empty:
        def body() -> common_pb2.Empty:
            s = self._session(request.session_uuid)
            wp = np.array([[w.x, w.y, w.z] for w in request.route.waypoints], dtype=np.float64).reshape(-1, 3)
            s.route = route_to_nav_text(wp) if len(wp) else None
            return common_pb2.Empty()

        return self._call("submit_route", context, body)

    def submit_recording_ground_truth(
        self, request: egodriver_pb2.GroundTruthRequest, context: grpc.ServicerContext
    ) -> common_pb2.Empty:
        def body() -> common_pb2.Empty:
            self._session(request.session_uuid)  # the driver does not use it, as NVIDIA's
            return common_pb2.Empty()

        return self._call("submit_recording_ground_truth", context, body)

    def get_version(self, request: common_pb2.Empty, context: grpc.ServicerContext) -> common_pb2.VersionId:
        major, minor, patch = ALPASIM_GRPC_VERSION
        return common_pb2.VersionId(
            version_id=f"{VERSION} {self._model_line}",
            git_hash="unknown",
            grpc_api_version=common_pb2.VersionId.APIVersion(major=major, minor=minor, patch=patch),
        )

    def drive(
        self, request: egodriver_pb2.DriveRequest, context: grpc.ServicerContext
    ) -> egodriver_pb2.DriveResponse:
        return self._call("drive", context, lambda: self._drive(request))

    def _drive(self, request: egodriver_pb2.DriveRequest) -> egodriver_pb2.DriveResponse:
        start = time.perf_counter()
        s = self._session(request.session_uuid)
        if request.time_query_us < request.time_now_us:
            raise _status(
                grpc.StatusCode.INVALID_ARGUMENT,
                "query_in_past",
                f"time_query_us={request.time_query_us} is before time_now_us={request.time_now_us}",
            )
        if request.time_now_us < s.last_query_us:
            raise _status(
                grpc.StatusCode.INVALID_ARGUMENT,
                "query_in_past",
                f"time_now_us={request.time_now_us} is before the previous drive's time_now_us={s.last_query_us}",
            )
        found = {c: s.frames[c].window(int(request.time_now_us)) for c in s.cameras}
        windows = {c: w for c, w in found.items() if w is not None}
        if len(windows) < len(found) or not s.poses:
            with self._lock:
                self.counters["drive_not_ready"] += 1
            s.last_query_us = int(request.time_now_us)
            return egodriver_pb2.DriveResponse(trajectory=common_pb2.Trajectory())
        frames = {CAMERA_INDEX[c]: [f for _, f in w] for c, w in windows.items()}
        times_us = {c: [t for t, _ in w] for c, w in windows.items()}
        t0 = max(ts[-1] for ts in times_us.values())
        ego = self._history(s, t0)
        seed = s.seed + s.drives
        prep_ms = (time.perf_counter() - start) * 1e3
        with self._model_lock:
            if self._last_session != s.uuid:
                # The feature cache is keyed by (camera, frame time): another session's clock may repeat times.
                self._predictor.reset()
                self._last_session = s.uuid
            pred = self._predictor.predict(
                frames,
                ego,
                route=s.route,
                num_samples=self._num_samples,
                seed=seed,
                frame_times_ns={CAMERA_INDEX[c]: [t * 1000 for t in v] for c, v in times_us.items()},
            )
        after = time.perf_counter()
        pred.timings_ms["service_predict"] = (after - start) * 1e3 - prep_ms
        response = self._response(s, pred, t0, ego, times_us)
        s.drives += 1
        s.last_query_us = int(request.time_now_us)
        self.overhead_ms.append(prep_ms + (time.perf_counter() - after) * 1e3)
        return response

    def _history(self, s: Session, t0: int) -> EgoHistory:
        """16 poses at 10 Hz ending at t0 (µs), interpolated (`alpamayo.input_window`) from the session's poses; raises
        FAILED_PRECONDITION with NVIDIA's wording when they do not cover [t0 - 1.5 s, t0]."""
        span_us = (HISTORY_STEPS - 1) * PERIOD_US
        with s.poses_lock:
            poses = list(s.poses)
        ts = np.array([p[0] for p in poses], dtype=np.int64)
        if len(ts) < 2:
            raise _status(
                grpc.StatusCode.FAILED_PRECONDITION,
                "ego_history_short",
                f"needs at least 2 ego poses spanning {span_us / 1e3:.1f}ms before latest_camera_frame_us={t0}, "
                f"got {len(ts)} pose(s).",
            )
        avail_ms = (ts[-1] - ts[0]) / 1e3
        if ts[-1] < t0:
            raise _status(
                grpc.StatusCode.FAILED_PRECONDITION,
                "ego_history_stale",
                f"ego pose history is stale: available_span={avail_ms:.1f}ms, required_span={span_us / 1e3:.1f}ms, "
                f"latest_available_us={ts[-1]}, latest_camera_frame_us={t0}.",
            )
        if ts[0] > t0 - span_us:
            raise _status(
                grpc.StatusCode.FAILED_PRECONDITION,
                "ego_history_short",
                f"ego pose history is too short: available_span={avail_ms:.1f}ms, required_span="
                f"{span_us / 1e3:.1f}ms, earliest_available_us={ts[0]}, earliest_required_us={t0 - span_us}, "
                f"latest_camera_frame_us={t0}.",
            )
        # covered as checked above: interpolated across any gap, as NVIDIA's driver does
        track = PoseTrack(ts * 1000, np.array([p[1] for p in poses]), np.array([p[2] for p in poses]))
        return track.history_at(t0 * 1000, max_gap_ns=None)

    def _response(
        self, s: Session, pred: Prediction, t0: int, ego: EgoHistory, frame_times_us: dict[str, list[int]]
    ) -> egodriver_pb2.DriveResponse:
        p0, q0 = ego.xyz[-1], ego.quat_xyzw[-1]
        t_us = t0 + PERIOD_US * np.arange(1, len(pred.t_s) + 1, dtype=np.int64)
        rig = [pred.waypoints(k) for k in range(len(pred.samples))]  # (xyz [64, 3], heading [64]) at t0
        cand = np.stack([xyz for xyz, _ in rig])  # [K, 64, 3]
        prev_t = prev_rig = None
        if s.previous_plan is not None:
            prev_t, prev_local = s.previous_plan
            prev_rig, _ = to_frame(p0, q0, prev_local)
        try:
            chosen = select_sample(self._selection, cand, t_us, prev_t, prev_rig)
        except ValueError:
            chosen = 0  # the previous plan has run out: nothing to stay consistent with, as on a first cycle

        def trajectory(k: int) -> common_pb2.Trajectory:
            xyz, heading = rig[k]
            local = from_frame(p0, q0, xyz)
            q = compose(q0, yaw_to_quat(heading))
            out = [_pose_at(t0, p0, q0)]
            out += [_pose_at(int(t), local[i], q[i]) for i, t in enumerate(t_us)]
            return common_pb2.Trajectory(poses=out)

        driven = trajectory(chosen)
        s.previous_plan = (t_us, from_frame(p0, q0, cand[chosen]))
        debug = {
            "reasoning_text": pred.samples[chosen].reasoning,
            "reasoning_all": [smp.reasoning for smp in pred.samples],
            "selected_index": chosen,
            "selection": self._selection,
            "navigation_text": s.route,
            "t0_us": int(t0),
            "frame_times_us": frame_times_us,
            "decoder": pred.decoder,
            "timings_ms": pred.timings_ms,
        }
        return egodriver_pb2.DriveResponse(
            trajectory=driven,
            debug_info=egodriver_pb2.DriveResponse.DebugInfo(
                unstructured_debug_info=pickle.dumps(debug),
                sampled_trajectories=[trajectory(k) for k in range(len(pred.samples))],
            ),
        )

    # -- DriverAdmin ---------------------------------------------------------------------------------------
    def get_status(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> driver_admin_pb2.StatusJson:
        with self._lock:
            sessions = {
                u: {
                    "frames": {c: len(q) for c, q in s.frames.items()},
                    "poses": len(s.poses),
                    "drives": s.drives,
                }
                for u, s in self._sessions.items()
            }
            doc = {
                "model": self._model_line,
                "calls": dict(self.counters),
                "rejected": dict(self.rejected),
                "sessions": sessions,
                "max_sessions": self.limits.max_sessions,
                "overhead_ms_median": float(np.median(self.overhead_ms)) if self.overhead_ms else None,
            }
        return driver_admin_pb2.StatusJson(json=json.dumps(doc))

    def shut_down(self, request: common_pb2.Empty, context: grpc.ServicerContext) -> common_pb2.Empty:
        self.stop_requested.set()
        return common_pb2.Empty()


def _pose_at(t_us: int, xyz: np.ndarray, quat_xyzw: np.ndarray) -> common_pb2.PoseAtTime:
    x, y, z, w = (float(c) for c in quat_xyzw)
    return common_pb2.PoseAtTime(
        pose=common_pb2.Pose(
            vec=common_pb2.Vec3(x=float(xyz[0]), y=float(xyz[1]), z=float(xyz[2])),
            quat=common_pb2.Quat(w=w, x=x, y=y, z=z),
        ),
        timestamp_us=int(t_us),
    )


def serve(service: EgodriverService, listen: str, workers: int = 16) -> tuple[grpc.Server, int]:
    """Start a gRPC server for ``service`` on ``listen`` (``HOST:PORT``, port 0 picks one, or ``unix:PATH``);
    returns the server and its bound port (0 for a unix socket)."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers),
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
    )
    egodriver_pb2_grpc.add_EgodriverServiceServicer_to_server(service, server)
    driver_admin_pb2_grpc.add_DriverAdminServicer_to_server(service, server)
    port = server.add_insecure_port(listen)
    if port == 0 and not listen.startswith("unix:"):
        raise OSError(f"cannot listen on {listen}")
    server.start()
    return server, port
