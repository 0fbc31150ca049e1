"""Synthetic multi-camera frames and ego poses, published at a fixed rate (`alpamayo camera-sim`).

The ego drives at constant speed and yaw rate; the world frame is the ego frame at t = 0 (x forward, y left,
z up, metres). Each camera sees a road scene in perspective (sky, grass, road, white edge lines and a dashed
centre line whose dashes scroll with the distance driven); the vanishing point and tint depend on the camera
index so the cameras' images differ. The dash phase is quantised to PHASES steps so JPEG frames are encoded
once per (camera, phase) and reused: encoding 1080p at 40 frames/s would not fit on a small CPU otherwise.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass

import numpy as np
from PIL import Image

from alpamayo.rotations import yaw_to_quat
from bridges.wire.client import FramePublisher
from bridges.wire.protocol import ENCODINGS, encode_ego, encode_frame

DASH_PERIOD_M = 6.0  # a 3 m dash and a 3 m gap
PHASES = 10  # dash phases rendered per camera
CAMERA_HEIGHT_M = 1.5
EXPOSURE_NS = 1_000_000  # t_eof - t_sof of a synthetic frame


@dataclass(frozen=True)
class SyntheticDrive:
    """Constant speed (m/s) and yaw rate (rad/s, counter-clockwise) from the origin, heading +x."""

    speed_mps: float = 10.0
    yaw_rate_rps: float = 0.02

    def pose(self, t_s: float) -> tuple[list[float], list[float], list[float]]:
        """(xyz m, quat_xyzw ego->world, velocity m/s in the world frame) at t_s seconds."""
        v, w = self.speed_mps, self.yaw_rate_rps
        yaw = w * t_s
        if abs(w) < 1e-9:
            x, y = v * t_s, 0.0
        else:
            x, y = v / w * np.sin(yaw), v / w * (1.0 - np.cos(yaw))
        quat = yaw_to_quat(yaw).tolist()
        return [float(x), float(y), 0.0], quat, [v * float(np.cos(yaw)), v * float(np.sin(yaw)), 0.0]

    def distance(self, t_s: float) -> float:
        return self.speed_mps * t_s


class SyntheticCamera:
    """Road scene frames [height, width, 3] uint8 RGB for one camera index."""

    def __init__(self, index: int, width: int, height: int):
        self.width, self.height = width, height
        rows = np.arange(height, dtype=np.float64)[:, None]
        cols = np.arange(width, dtype=np.float64)[None, :]
        horizon = 0.45 * height
        below = np.maximum(rows - horizon, 0.0)
        vanish_x = width * (0.5 + 0.12 * ((index % 4) - 1.5))
        half_road = below * (0.9 * width / max(height - horizon, 1.0))
        line = np.maximum(below * 0.012 * width / max(height, 1), 1.0)
        dx = np.abs(cols - vanish_x)
        road = (rows > horizon) & (dx < half_road)
        tint = np.array([index * 9 % 30, index * 17 % 30, index * 5 % 30], dtype=np.int16)
        img = np.empty((height, width, 3), np.int16)
        sky = (rows < horizon)[:, :, None]
        gradient = (rows / max(horizon, 1.0))[:, :, None]
        img[:] = np.where(sky, np.array([110, 160, 225]) - 60 * gradient, np.array([70, 120, 60]))
        img[road] = (90, 90, 96)
        img[road & (np.abs(dx - half_road) < 3 * line)] = (235, 235, 235)
        self.base = np.clip(img + tint, 0, 255).astype(np.uint8)
        # Distance along the road seen by each row (flat ground, focal length ~ width / 2).
        depth = (CAMERA_HEIGHT_M * 0.5 * width / np.maximum(below, 1.0))[:, 0]
        centre = road & (dx < line)
        self._dash_pixels = [
            np.flatnonzero(centre & ((depth + p * DASH_PERIOD_M / PHASES) % DASH_PERIOD_M < 3.0)[:, None])
            for p in range(PHASES)
        ]

    def render(self, distance_m: float, out: np.ndarray | None = None) -> np.ndarray:
        """The frame after `distance_m` metres driven (into `out` if given)."""
        if out is None:
            out = self.base.copy()
        else:
            np.copyto(out, self.base)
        out.reshape(-1, 3)[self._dash_pixels[phase_index(distance_m)]] = 250
        return out


def phase_index(distance_m: float) -> int:
    """Which of the PHASES pre-rendered dash positions shows `distance_m` metres driven."""
    return int(distance_m % DASH_PERIOD_M / DASH_PERIOD_M * PHASES) % PHASES


def jpeg_bytes(image: np.ndarray, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


@dataclass
class SimStats:
    ticks: int = 0
    frames: int = 0
    bytes: int = 0
    seconds: float = 0.0
    late_ticks: int = 0  # ticks sent more than one period after their scheduled time

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


class CameraSim:
    """Publishes, per tick at `rate_hz`: one ego pose, then one frame per camera, all stamped with the tick's
    sensor time (frame_id = first_frame_id + tick). Sensor time is the start time (this host's monotonic
    clock unless given) plus tick / rate_hz; with `speedup` > 1 ticks are sent that many times faster than
    sensor time advances (a recording replayed fast, or a camera outpacing the model)."""

    def __init__(
        self,
        publisher: FramePublisher,
        cameras: list[str | int],
        width: int,
        height: int,
        rate_hz: float = 10.0,
        encoding: str = "rgb8",
        drive: SyntheticDrive | None = None,
        jpeg_quality: int = 90,
        first_frame_id: int = 0,
        speedup: float = 1.0,
    ):
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
        if not 0 < rate_hz <= 1000:
            raise ValueError(f"rate_hz {rate_hz} is outside (0, 1000]")
        if not 0 < speedup <= 1000:
            raise ValueError(f"speedup {speedup} is outside (0, 1000]")
        self.publisher = publisher
        self.cameras = list(cameras)
        self.rate_hz, self.encoding, self.jpeg_quality = rate_hz, encoding, jpeg_quality
        self.drive = drive or SyntheticDrive()
        self.first_frame_id = first_frame_id
        self.speedup = speedup
        self._scenes = [SyntheticCamera(i, width, height) for i in range(len(self.cameras))]
        self._buffer = np.empty((height, width, 3), np.uint8)
        self._jpegs: dict[tuple[int, int], bytes] = {}

    def run(
        self, ticks: int | None = None, stop: threading.Event | None = None, t_start_ns: int | None = None
    ) -> SimStats:
        """Publish `ticks` ticks (forever if None) or until `stop` is set; returns what was sent. Sensor time
        starts at t_start_ns (default: now on this host's monotonic clock)."""
        stats = SimStats()
        sensor_period_ns = round(1e9 / self.rate_hz)
        wall_period_ns = round(sensor_period_ns / self.speedup)
        start = time.monotonic_ns()
        sensor_start = start if t_start_ns is None else t_start_ns
        tick = 0
        while (ticks is None or tick < ticks) and not (stop is not None and stop.is_set()):
            delay = start + tick * wall_period_ns - time.monotonic_ns()
            if delay > 0:
                time.sleep(delay / 1e9)
            elif -delay > wall_period_ns:
                stats.late_ticks += 1
            stats.bytes += self.send_tick(tick, sensor_start + tick * sensor_period_ns)
            stats.frames += len(self.cameras)
            tick += 1
        stats.ticks = tick
        stats.seconds = (time.monotonic_ns() - start) / 1e9
        return stats

    def send_tick(self, tick: int, t_ns: int) -> int:
        """Send tick `tick`'s ego pose and frames stamped t_ns; returns the bytes sent."""
        t_s = tick / self.rate_hz
        xyz, quat, velocity = self.drive.pose(t_s)
        self.publisher.send(encode_ego(t_ns, xyz, quat, velocity))
        distance = self.drive.distance(t_s)
        sent = 0
        for i, camera in enumerate(self.cameras):
            frame_id = (self.first_frame_id + tick) % 2**32
            scene = self._scenes[i]
            payload: np.ndarray | bytes
            width: int | None
            height: int | None
            if self.encoding == "jpeg":
                key = (i, phase_index(distance))
                if key not in self._jpegs:
                    self._jpegs[key] = jpeg_bytes(scene.render(distance), self.jpeg_quality)
                payload, width, height = self._jpegs[key], scene.width, scene.height
            else:
                image = scene.render(distance, self._buffer)
                payload, width, height = (image if self.encoding == "rgb8" else image[:, :, ::-1]), None, None
            sent += self.publisher.send(
                encode_frame(
                    camera, frame_id, t_ns, t_ns + EXPOSURE_NS, payload, self.encoding, width, height
                )
            )
        return sent
