"""Synthetic recorded drives: rendered multi-camera road scenes and the ego trajectory, written as MCAP.

`make_demo_drive` writes, byte-for-byte deterministic for a seed (and library versions):
  * one `foxglove.CompressedImage` (JPEG) or `foxglove.RawImage` (rgb8) topic per camera at 10 Hz;
  * `/ego/pose` `foxglove.PoseInFrame` at 20 Hz in the `world` frame, running 6.4 s past the last camera frame
    so every tick has its recorded future (ADE/FDE);
  * metadata `alpamayo.layout` (the topic-to-camera mapping replay uses) and `alpamayo.drive` (generator
    settings).
Camera k of the rig fires k x 1.5 ms after the first one, as unsynchronised cameras do (replay pairs frames by
nearest time).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from alpamayo.demo_drive.render import RIG, Renderer
from alpamayo.demo_drive.world import World
from alpamayo.prediction import PERIOD_NS
from alpamayo.rotations import yaw_to_quat
from bridges.drives.mcap_messages import ENCODINGS, pose, timestamp
from bridges.drives.mcap_writer import RecordingWriter
from bridges.drives.recording import LAYOUT_METADATA, default_layout

START_NS = 1_700_000_000_000_000_000  # recording clock origin (a plausible unix time, ns)
CAMERA_PERIOD_NS = PERIOD_NS  # 10 Hz, the model's frame rate
POSE_PERIOD_NS = 50_000_000  # 20 Hz
CAMERA_SKEW_NS = 1_500_000
FUTURE_NS = 6_400_000_000
CAMERA_ORDER = (
    1,
    0,
    2,
    6,
    3,
    5,
    4,
)  # `cameras=N` takes the first N: front wide, cross left/right, tele, rear
IMAGE_FORMATS = ("jpeg", "raw")
JPEG_QUALITY = 90
MAX_SECONDS = 600.0
SIZE_RANGE = (32, 2160)


@dataclass(frozen=True)
class DemoDrive:
    """What was written: path, camera indices, frame size (height, width), message counts and file size."""

    path: Path
    cameras: tuple[int, ...]
    size: tuple[int, int]
    camera_frames: int
    poses: int
    bytes: int


def make_demo_drive(
    out: str | Path,
    seconds: float = 10.0,
    cameras: int = 4,
    seed: int = 0,
    size: tuple[int, int] = (1080, 1920),
    encoding: str = "protobuf",
    image_format: str = "jpeg",
    progress: Callable[[int], None] | None = None,
) -> DemoDrive:
    """Render and write a drive of `seconds` with `cameras` cameras of `size` (height, width) pixels.

    `progress(n)` is called after each camera frame written.
    """
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must be in (0, {MAX_SECONDS:g}], got {seconds}")
    if not 1 <= cameras <= len(CAMERA_ORDER):
        raise ValueError(f"cameras must be in 1..{len(CAMERA_ORDER)}, got {cameras}")
    if not all(SIZE_RANGE[0] <= n <= SIZE_RANGE[1] for n in size):
        raise ValueError(f"frame size {size[0]}x{size[1]} outside {SIZE_RANGE[0]}..{SIZE_RANGE[1]} per side")
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding {encoding!r} unknown; allowed: {list(ENCODINGS)}")
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image format {image_format!r} unknown; allowed: {list(IMAGE_FORMATS)}")
    rig = CAMERA_ORDER[:cameras]
    layout = default_layout(rig, "compressed" if image_format == "jpeg" else "image")
    world = World(seed, seconds + FUTURE_NS / 1e9)
    renderer = Renderer(world, *size)
    n_frames = round(seconds * 1e9 / CAMERA_PERIOD_NS)
    pose_t_ns = np.arange(0, n_frames * CAMERA_PERIOD_NS + FUTURE_NS + 1, POSE_PERIOD_NS)
    pose_xyz, pose_yaw = world.ego_pose(pose_t_ns / 1e9)
    pose_quat = yaw_to_quat(pose_yaw)
    settings = {
        "generator": "alpamayo make-demo-drive",
        "seed": str(seed),
        "seconds": f"{seconds:g}",
        "cameras": ",".join(map(str, rig)),
        "size": f"{size[0]}x{size[1]}",
        "encoding": encoding,
        "image_format": image_format,
    }
    out = Path(out)
    next_pose = 0
    # JPEG payloads do not compress; lz4 keeps the (small) pose and metadata records compact at no cost.
    with RecordingWriter(out, compression="lz4", chunk_size=4 << 20) as writer:
        writer.metadata(LAYOUT_METADATA, {"json": json.dumps(layout.to_dict(), sort_keys=True)})
        writer.metadata("alpamayo.drive", settings)
        for i in range(n_frames):
            for k, topic in enumerate(layout.cameras):
                t_ns = i * CAMERA_PERIOD_NS + k * CAMERA_SKEW_NS
                while next_pose < len(pose_t_ns) and pose_t_ns[next_pose] <= t_ns:
                    _write_pose(
                        writer,
                        layout.ego_pose_topic,
                        pose_t_ns[next_pose],
                        pose_xyz,
                        pose_quat,
                        next_pose,
                        encoding,
                    )
                    next_pose += 1
                image = renderer.render(RIG[topic.camera], t_ns / 1e9)
                writer.write(
                    topic.topic,
                    *_image_message(image, topic.name, START_NS + t_ns, image_format),
                    START_NS + t_ns,
                    encoding,
                )
                if progress is not None:
                    progress(1)
        for j in range(next_pose, len(pose_t_ns)):
            _write_pose(writer, layout.ego_pose_topic, pose_t_ns[j], pose_xyz, pose_quat, j, encoding)
    return DemoDrive(out, rig, size, n_frames * len(rig), len(pose_t_ns), out.stat().st_size)


def _write_pose(
    writer: RecordingWriter, topic: str, t_ns: int, xyz: np.ndarray, quat: np.ndarray, j: int, encoding: str
) -> None:
    message = {
        "timestamp": timestamp(START_NS + int(t_ns)),
        "frame_id": "world",
        "pose": pose(xyz[j], quat[j]),
    }
    writer.write(topic, "foxglove.PoseInFrame", message, START_NS + int(t_ns), encoding)


def _image_message(image: Image.Image, frame_id: str, t_ns: int, image_format: str) -> tuple[str, dict]:
    if image_format == "jpeg":
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=JPEG_QUALITY)
        return "foxglove.CompressedImage", {
            "timestamp": timestamp(t_ns),
            "frame_id": frame_id,
            "data": buf.getvalue(),
            "format": "jpeg",
        }
    return "foxglove.RawImage", {
        "timestamp": timestamp(t_ns),
        "frame_id": frame_id,
        "width": image.width,
        "height": image.height,
        "encoding": "rgb8",
        "step": 3 * image.width,
        "data": image.tobytes(),
    }
