"""One known drive written in each real recording layout, with the formats' own libraries.

* Foxglove MCAP (`bridges.drives.mcap_writer`, the project's writer);
* rosbag2 MCAP: CDR messages written by `mcap-ros2-support` with the ROS 2 definitions rosbag2 embeds;
* a PhysicalAI-AV tree: H.264 MP4s encoded by PyAV, timestamp and egomotion parquets (pyarrow), in chunk zips,
  with `clip_index.parquet`, `features.csv` and the metadata parquets the `physical-ai-av` devkit reads.

The ego moves on a known circle (speed `SPEED`, yaw rate `YAW_RATE`); cameras fire at 10 Hz on a 0.1 s grid
(camera k of the rig k x 1.5 ms before the grid, so "nearest" and "at or before" pick the same frame), poses at
20 Hz on the same clock, so every history and future time is a recorded pose. Times are µs from the clip start
(PAI) and the same instants in ns (MCAP). The MCAP drives carry the MP4-decoded frames, so all three give the
same pixels.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import pandas as pd
from mcap_ros2.writer import Writer as Ros2Writer
from PIL import Image

from alpamayo.rotations import yaw_to_quat
from bridges.drives.mcap_messages import pose, timestamp
from bridges.drives.mcap_writer import RecordingWriter
from bridges.drives.recording import LAYOUT_METADATA, default_layout
from bridges.drives.ros2_messages import definition, stamp
from bridges.wire.protocol import ALPAMAYO_CAMERAS

SPEED = 10.0  # m/s
YAW_RATE = 0.2  # rad/s
START_US = 100_000
FRAME_PERIOD_US = 100_000
POSE_PERIOD_US = 50_000
SKEW_US = 1_500
FUTURE_US = 6_400_000
RIG = (1, 0, 2, 6)  # MCAP layout order, the tick reference first
AUTOWARE_TOPICS = {1: "camera1", 0: "camera3", 2: "camera4", 6: "camera2"}  # bridges.drives.rosbag2's default
CLIP = "0a1b2c3d-known-curve"
CHUNK = 7
MAP_TO_ODOM = ([5.0, -3.0, 0.5], yaw_to_quat(np.array([0.3]))[0])  # a /tf_static link above odom


def ego_pose(t_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The known curve: xyz [N, 3] m and quat_xyzw [N, 4] at times t_us [N] (µs from the clip start)."""
    t = (t_us - START_US) / 1e6
    yaw = YAW_RATE * t
    radius = SPEED / YAW_RATE
    xyz = np.stack([radius * np.sin(yaw), radius * (1 - np.cos(yaw)), np.zeros_like(yaw)], axis=1)
    return xyz, yaw_to_quat(yaw)


@functools.lru_cache(maxsize=8)
def _gradient(camera: int, size: tuple[int, int]) -> np.ndarray:
    h, w = size
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), np.full_like(x, 40 * camera)], 2)
    return img.astype(np.uint8)


def pattern(camera: int, k: int, size: tuple[int, int]) -> np.ndarray:
    """A frame H x W x 3 uint8 that differs per camera and frame (gradients and moving bars)."""
    img = _gradient(camera, size).copy()
    bar = (np.arange(size[1]) // 8 + k) % 12 == 0
    img[:, bar] = [255, 255 - 20 * camera, 30 * (k % 8)]
    return img


@dataclass
class KnownDrive:
    """The drive's frames (per camera, decoded from its MP4), frame and pose times (µs), and the MP4 bytes."""

    size: tuple[int, int] = (64, 96)
    frames: int = 20
    cameras: tuple[int, ...] = RIG
    gop: int = 5
    faststart: bool = False
    fps: int = 10
    preset: str = "medium"  # libx264's speed/size trade-off (the benchmark's 1080p clip uses veryfast)
    keep_decoded: bool = True  # the MP4-decoded frames (the MCAP writers need them; a benchmark does not)
    mp4: dict[int, bytes] = field(default_factory=dict)
    decoded: dict[int, list[np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for camera in self.cameras:
            self.mp4[camera] = encode_mp4(
                (pattern(camera, k, self.size) for k in range(self.frames)),
                self.fps,
                self.gop,
                self.faststart,
                self.preset,
            )
            if not self.keep_decoded:
                continue
            with av.open(io.BytesIO(self.mp4[camera])) as container:
                self.decoded[camera] = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]

    def frame_times_us(self, camera: int) -> np.ndarray:
        period = round(1e6 / self.fps)
        return (
            START_US + period * np.arange(self.frames, dtype=np.int64) - SKEW_US * self.cameras.index(camera)
        )

    @property
    def pose_times_us(self) -> np.ndarray:
        last = START_US + (self.frames - 1) * round(1e6 / self.fps) + FUTURE_US
        return np.arange(START_US, last + 1, POSE_PERIOD_US, dtype=np.int64)


def encode_mp4(
    images: Iterable[np.ndarray], fps: int, gop: int, faststart: bool = False, preset: str = "medium"
) -> bytes:
    """H.264 (libx264, yuv420p) MP4 of `images` at `fps`, a keyframe every `gop` frames; with `faststart` the
    index (moov) comes first, so a truncated file still opens."""
    options = {"movflags": "faststart"} if faststart else {}
    # faststart rewrites the file in a second pass, which needs a real file rather than a buffer.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "video.mp4"
        _encode_to(path, images, fps, gop, options, preset)
        return path.read_bytes()


def _encode_to(
    path: Path, images: Iterable[np.ndarray], fps: int, gop: int, options: dict[str, str], preset: str
) -> None:
    images = iter(images)
    first = next(images)
    with av.open(str(path), "w", format="mp4", options=options) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = first.shape[:2]
        stream.pix_fmt = "yuv420p"
        stream.options = {"g": str(gop), "crf": "18", "preset": preset}
        for image in itertools.chain([first], images):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())


def jpeg(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def write_foxglove(path: Path, drive: KnownDrive, image_format: str = "raw") -> Path:
    """Foxglove MCAP: RawImage rgb8 (or CompressedImage JPEG) per camera and PoseInFrame, with the layout."""
    layout = default_layout(drive.cameras, "image" if image_format == "raw" else "compressed")
    xyz, quat = ego_pose(drive.pose_times_us)
    with RecordingWriter(path) as writer:
        writer.metadata(LAYOUT_METADATA, {"json": json.dumps(layout.to_dict(), sort_keys=True)})
        for t_us, p, q in zip(drive.pose_times_us, xyz, quat, strict=True):
            message = {"timestamp": timestamp(int(t_us) * 1000), "frame_id": "world", "pose": pose(p, q)}
            writer.write(layout.ego_pose_topic, "foxglove.PoseInFrame", message, int(t_us) * 1000)
        for topic in layout.cameras:
            for t_us, image in zip(
                drive.frame_times_us(topic.camera), drive.decoded[topic.camera], strict=True
            ):
                t_ns = int(t_us) * 1000
                if image_format == "raw":
                    h, w = image.shape[:2]
                    fields = {
                        "width": w,
                        "height": h,
                        "encoding": "rgb8",
                        "step": 3 * w,
                        "data": image.tobytes(),
                    }
                    schema = "foxglove.RawImage"
                else:
                    fields, schema = {"format": "jpeg", "data": jpeg(image)}, "foxglove.CompressedImage"
                message = {"timestamp": timestamp(t_ns), "frame_id": topic.name, **fields}
                writer.write(topic.topic, schema, message, t_ns)
    return path


def _ros_pose(p: np.ndarray, q: np.ndarray) -> dict:
    return {
        "position": dict(zip("xyz", map(float, p), strict=True)),
        "orientation": dict(zip("xyzw", map(float, q), strict=True)),
    }


def _transform(parent: str, child: str, t_ns: int, p, q) -> dict:
    return {
        "header": {"stamp": stamp(t_ns), "frame_id": parent},
        "child_frame_id": child,
        "transform": {
            "translation": dict(zip("xyz", map(float, p), strict=True)),
            "rotation": dict(zip("xyzw", map(float, q), strict=True)),
        },
    }


def write_rosbag2(
    path: Path,
    drive: KnownDrive,
    image_format: str = "raw",
    ego: str = "odometry",
    topics: dict[int, str] | None = None,
    tf_static: bool = True,
) -> Path:
    """rosbag2 MCAP with Autoware's topic names: sensor_msgs Image rgb8 (or CompressedImage JPEG) per camera;
    ego as nav_msgs Odometry on /localization/kinematic_state (map -> base_link), or (ego="tf") /tf odom ->
    base_link below a /tf_static map -> odom (left out with tf_static=False). `topics`: camera -> raw image topic
    (the compressed one gets /compressed appended)."""
    names = topics or {c: f"/sensing/camera/{AUTOWARE_TOPICS[c]}/image_raw" for c in drive.cameras}
    xyz, quat = ego_pose(drive.pose_times_us)
    with open(path, "wb") as f:
        writer = Ros2Writer(f)
        schemas = {}

        def schema(name: str):
            if name not in schemas:
                schemas[name] = writer.register_msgdef(name, definition(name))
            return schemas[name]

        if ego == "odometry":
            for t_us, p, q in zip(drive.pose_times_us, xyz, quat, strict=True):
                t_ns = int(t_us) * 1000
                message = {
                    "header": {"stamp": stamp(t_ns), "frame_id": "map"},
                    "child_frame_id": "base_link",
                    "pose": {"pose": _ros_pose(p, q), "covariance": [0.0] * 36},
                    "twist": {
                        "twist": {
                            "linear": {"x": SPEED, "y": 0.0, "z": 0.0},
                            "angular": {"x": 0.0, "y": 0.0, "z": YAW_RATE},
                        },
                        "covariance": [0.0] * 36,
                    },
                }
                writer.write_message(
                    "/localization/kinematic_state", schema("nav_msgs/msg/Odometry"), message, t_ns, t_ns
                )
        else:
            from scipy.spatial.transform import Rotation

            to_odom = Rotation.from_quat(MAP_TO_ODOM[1]).inv()
            start = int(drive.pose_times_us[0]) * 1000
            static = {"transforms": [_transform("map", "odom", start, *MAP_TO_ODOM)]}
            if tf_static:
                writer.write_message("/tf_static", schema("tf2_msgs/msg/TFMessage"), static, start, start)
            for t_us, p, q in zip(drive.pose_times_us, xyz, quat, strict=True):
                t_ns = int(t_us) * 1000
                local_p = to_odom.apply(p - np.asarray(MAP_TO_ODOM[0]))
                local_q = (to_odom * Rotation.from_quat(q)).as_quat()
                message = {"transforms": [_transform("odom", "base_link", t_ns, local_p, local_q)]}
                writer.write_message("/tf", schema("tf2_msgs/msg/TFMessage"), message, t_ns, t_ns)
        for camera in drive.cameras:
            for t_us, image in zip(drive.frame_times_us(camera), drive.decoded[camera], strict=True):
                t_ns = int(t_us) * 1000
                header = {"stamp": stamp(t_ns), "frame_id": ALPAMAYO_CAMERAS[camera]}
                if image_format == "raw":
                    h, w = image.shape[:2]
                    message = {
                        "header": header,
                        "height": h,
                        "width": w,
                        "encoding": "rgb8",
                        "is_bigendian": 0,
                        "step": 3 * w,
                        "data": image.tobytes(),
                    }
                    writer.write_message(names[camera], schema("sensor_msgs/msg/Image"), message, t_ns, t_ns)
                else:
                    message = {"header": header, "format": "jpeg", "data": jpeg(image)}
                    writer.write_message(
                        names[camera] + "/compressed",
                        schema("sensor_msgs/msg/CompressedImage"),
                        message,
                        t_ns,
                        t_ns,
                    )
        writer.finish()
    return path


def _zip(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def _parquet(frame: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf)
    return buf.getvalue()


def write_pai(
    root: Path,
    drive: KnownDrive,
    clip: str = CLIP,
    chunk: int = CHUNK,
    pose_gap_us: tuple[int, int] | None = None,
) -> Path:
    """A PhysicalAI-AV tree holding `clip` in `chunk`: one zip per camera of the drive, the egomotion zip, and
    the index files; features.csv lists all seven cameras (the ones not written are missing files).
    `pose_gap_us` (start, end): egomotion samples strictly inside are left out."""
    features = []
    for name in ALPAMAYO_CAMERAS.values():
        members = {
            "video": f"{{clip_id}}.{name}.mp4",
            "frame_timestamps": f"{{clip_id}}.{name}.timestamps.parquet",
        }
        features.append(
            (name, "camera", f"camera/{name}/{name}.chunk_{{chunk_id:04d}}.zip", json.dumps(members))
        )
    ego_members = {"egomotion": "{clip_id}.egomotion.parquet"}
    features.append(
        (
            "egomotion",
            "labels",
            "labels/egomotion/egomotion.chunk_{chunk_id:04d}.zip",
            json.dumps(ego_members),
        )
    )
    root.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(features, columns=["feature", "directory", "chunk_path", "clip_files_in_zip"]).to_csv(
        root / "features.csv", index=False
    )
    pd.DataFrame({"chunk": [chunk]}, index=pd.Index([clip], name="clip_id")).to_parquet(
        root / "clip_index.parquet"
    )
    (root / "metadata").mkdir(exist_ok=True)
    presence = {name: [c in drive.cameras] for c, name in ALPAMAYO_CAMERAS.items()} | {"egomotion": [True]}
    pd.DataFrame(presence, index=pd.Index([clip], name="clip_id")).to_parquet(
        root / "metadata/feature_presence.parquet"
    )
    pd.DataFrame({"country": ["US"]}, index=pd.Index([clip], name="clip_id")).to_parquet(
        root / "metadata/data_collection.parquet"
    )
    for camera in drive.cameras:
        name = ALPAMAYO_CAMERAS[camera]
        stamps = pd.DataFrame({"timestamp": drive.frame_times_us(camera)})
        _zip(
            root / f"camera/{name}/{name}.chunk_{chunk:04d}.zip",
            {f"{clip}.{name}.mp4": drive.mp4[camera], f"{clip}.{name}.timestamps.parquet": _parquet(stamps)},
        )
    t = drive.pose_times_us
    if pose_gap_us is not None:
        t = t[(t <= pose_gap_us[0]) | (t >= pose_gap_us[1])]
    xyz, quat = ego_pose(t)
    zeros = np.zeros(len(t))
    ego = pd.DataFrame(
        {
            "timestamp": t,
            **{k: xyz[:, i] for i, k in enumerate("xyz")},
            **{k: quat[:, i] for i, k in enumerate(("qx", "qy", "qz", "qw"))},
            "vx": np.full(len(t), SPEED), "vy": zeros, "vz": zeros,
            "ax": zeros, "ay": zeros, "az": zeros,
            "curvature": np.full(len(t), YAW_RATE / SPEED),
        }
    )  # fmt: skip
    _zip(
        root / f"labels/egomotion/egomotion.chunk_{chunk:04d}.zip",
        {f"{clip}.egomotion.parquet": _parquet(ego)},
    )
    return root
