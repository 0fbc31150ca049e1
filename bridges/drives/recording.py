"""What every drive reader shares: the topic layout, recorded camera frames, the ego-pose track and the errors.

The readers themselves live in `bridges.drives` (Foxglove MCAP in `bridges.drives.mcap`, rosbag2, PhysicalAI-AV).
The topic-to-camera mapping is a `RecordingLayout` (YAML file, or the `alpamayo.layout` metadata record that
`make-demo-drive` writes); a frame keeps its message undecoded until `rgb()` (`foxglove.CompressedImage` JPEG/PNG or
`foxglove.RawImage`, raw and Bayer encodings). A reader's ego poses (world frame) are an
`alpamayo.input_window.PoseTrack`, which interpolates them and refuses gaps over MAX_POSE_GAP_NS.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from PIL import Image, UnidentifiedImageError

from bridges.wire.protocol import ALPAMAYO_CAMERAS

LAYOUT_METADATA = "alpamayo.layout"
RAW_ENCODINGS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}
# Bayer mosaics (ROS `sensor_msgs/Image` encodings): the colour of each pixel of a 2x2 cell, row by row.
BAYER_PATTERNS = {"bayer_rggb8": "RGGB", "bayer_bggr8": "BGGR", "bayer_gbrg8": "GBRG", "bayer_grbg8": "GRBG"}

Warn = Callable[[str], None]


class RecordingError(ValueError):
    """A recording cannot be replayed: not an MCAP file, a missing topic, a bad layout, no usable data."""


class FrameError(ValueError):
    """One camera message cannot be turned into an RGB frame (corrupt JPEG, inconsistent raw size)."""


@dataclass(frozen=True)
class CameraTopic:
    """One camera stream: its MCAP topic, Alpamayo camera index (0..6) and display name."""

    topic: str
    camera: int
    name: str


@dataclass(frozen=True)
class RecordingLayout:
    """Which topics hold which camera and the ego pose. The first camera is the tick reference (10 Hz)."""

    cameras: tuple[CameraTopic, ...]
    ego_pose_topic: str = "/ego/pose"

    def __post_init__(self) -> None:
        if not self.cameras:
            raise RecordingError("layout has no cameras; at least one camera topic is required")
        indices = [c.camera for c in self.cameras]
        for c in self.cameras:
            if c.camera not in ALPAMAYO_CAMERAS:
                raise RecordingError(
                    f"layout camera {c.name!r} has index {c.camera}; allowed: {sorted(ALPAMAYO_CAMERAS)}"
                )
        if len(set(indices)) != len(indices):
            raise RecordingError(f"layout camera indices repeat: {indices}")
        if len(set(self.topics)) != len(self.topics):
            raise RecordingError(f"layout topics repeat: {self.topics}")

    @property
    def topics(self) -> list[str]:
        return [c.topic for c in self.cameras] + [self.ego_pose_topic]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ego_pose_topic": self.ego_pose_topic,
            "cameras": [{"topic": c.topic, "camera": c.camera, "name": c.name} for c in self.cameras],
        }

    @classmethod
    def from_dict(cls, data: Any, source: str) -> RecordingLayout:
        """Parse `{"ego_pose_topic": str, "cameras": [{"topic", "camera", "name"?}, ...]}` read from `source`."""
        if not isinstance(data, dict) or not isinstance(data.get("cameras"), list):
            raise RecordingError(f"{source}: expected a mapping with a 'cameras' list, got {data!r:.200}")
        unknown = set(data) - {"ego_pose_topic", "cameras"}
        if unknown:
            raise RecordingError(
                f"{source}: unknown keys {sorted(unknown)}; allowed: cameras, ego_pose_topic"
            )
        cameras = []
        for i, entry in enumerate(data["cameras"]):
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("topic"), str)
                or type(entry.get("camera")) is not int
            ):
                raise RecordingError(
                    f"{source}: cameras[{i}] needs 'topic' (string) and 'camera' (int): {entry!r}"
                )
            name = entry.get("name", ALPAMAYO_CAMERAS.get(entry["camera"], ""))
            cameras.append(CameraTopic(entry["topic"], entry["camera"], str(name)))
        pose_topic = data.get("ego_pose_topic", "/ego/pose")
        if not isinstance(pose_topic, str):
            raise RecordingError(f"{source}: ego_pose_topic must be a string, got {pose_topic!r}")
        return cls(tuple(cameras), pose_topic)

    @classmethod
    def load(cls, path: str | Path) -> RecordingLayout:
        """Read a YAML (or JSON) layout file."""
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise RecordingError(f"layout file {path}: {e}") from e
        return cls.from_dict(data, str(path))


def default_layout(cameras: tuple[int, ...] = (1, 0, 2, 6), kind: str = "compressed") -> RecordingLayout:
    """Image topics `/cameras/<name>/<kind>` for the given camera indices (kind "compressed" for
    CompressedImage, "image" for RawImage), poses on `/ego/pose`."""
    return RecordingLayout(
        tuple(CameraTopic(f"/cameras/{ALPAMAYO_CAMERAS[i]}/{kind}", i, ALPAMAYO_CAMERAS[i]) for i in cameras)
    )


@dataclass
class RecordedFrame:
    """One camera message read from a recorded drive: acquisition time `t_ns`, and the decoded Foxglove image
    message (its pixels are decoded by `rgb()`)."""

    camera: int
    t_ns: int
    schema_name: str
    image: dict[str, Any]

    _rgb: np.ndarray | None = field(default=None, repr=False)

    @property
    def decoded(self) -> bool:
        return self._rgb is not None

    def rgb(self) -> np.ndarray:
        """The frame as HxWx3 uint8 RGB, decoded once (a frame serves 4 consecutive ticks); raises FrameError
        naming the camera and time."""
        if self._rgb is None:
            self._rgb = self._decode()
        return self._rgb

    @property
    def where(self) -> str:
        """How errors name this frame."""
        return f"camera {self.camera} frame at {self.t_ns} ns"

    def jpeg_size(self) -> tuple[int, int] | None:
        """(width, height) of a JPEG `CompressedImage` read from its header alone (None for other images);
        raises FrameError naming the frame when the header does not parse."""
        if self.schema_name != "foxglove.CompressedImage" or self.image.get("format") != "jpeg":
            return None
        try:
            with Image.open(io.BytesIO(self.image.get("data", b""))) as img:
                return img.size
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            raise FrameError(f"{self.where}: jpeg header does not decode: {e}") from e

    def _decode(self) -> np.ndarray:
        where = self.where
        if self.schema_name == "foxglove.CompressedImage":
            try:
                with Image.open(io.BytesIO(self.image.get("data", b""))) as img:
                    return np.asarray(img.convert("RGB"))
            except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
                raise FrameError(
                    f"{where}: {self.image.get('format', '?')} image does not decode: {e}"
                ) from e
        return _raw_to_rgb(self.image, where)


def _raw_to_rgb(image: dict[str, Any], where: str) -> np.ndarray:
    encoding, width, height, step = (image.get(k) for k in ("encoding", "width", "height", "step"))
    data = image.get("data", b"")
    # JSON messages are not checked against their schema when read: a field may be absent or mistyped.
    if type(width) is not int or type(height) is not int or type(step) is not int:
        mistyped = {
            k: v for k, v in (("width", width), ("height", height), ("step", step)) if type(v) is not int
        }
        raise FrameError(f"{where}: raw image field(s) {mistyped} must be integers")
    allowed = {**RAW_ENCODINGS, **dict.fromkeys(BAYER_PATTERNS, 1)}
    if not isinstance(encoding, str) or encoding not in allowed:
        raise FrameError(f"{where}: raw encoding {encoding!r} unsupported; allowed: {sorted(allowed)}")
    channels = allowed[encoding]
    if not (0 < width <= 8192 and 0 < height <= 8192):
        raise FrameError(f"{where}: raw size {width}x{height} outside 1..8192")
    if step < width * channels or len(data) < step * height:
        raise FrameError(
            f"{where}: raw {encoding} {width}x{height} needs step >= {width * channels} and "
            f"{step * height} bytes, got step {step} and {len(data)} bytes"
        )
    rows = np.frombuffer(data, np.uint8, count=step * height).reshape(height, step)
    pixels = rows[:, : width * channels].reshape(height, width, channels)
    if encoding in BAYER_PATTERNS:
        return _demosaic(pixels[:, :, 0], BAYER_PATTERNS[encoding], where)
    if channels == 1:
        return np.ascontiguousarray(np.repeat(pixels, 3, axis=2))
    order = [2, 1, 0] if encoding.startswith("bgr") else [0, 1, 2]
    return np.ascontiguousarray(pixels[:, :, order])


def _demosaic(mosaic: np.ndarray, pattern: str, where: str) -> np.ndarray:
    """HxW Bayer mosaic -> HxWx3 RGB: each 2x2 cell's red, mean green and blue fill the cell (half the
    resolution in colour, which the model's resize to at most 576 px wide loses anyway at 1080p)."""
    height, width = mosaic.shape
    if height % 2 or width % 2:
        raise FrameError(f"{where}: a Bayer image needs an even width and height, got {width}x{height}")
    cells = {pattern[2 * r + c]: mosaic[r::2, c::2].astype(np.uint16) for r in (0, 1) for c in (0, 1)}
    greens = [
        mosaic[r::2, c::2].astype(np.uint16) for r in (0, 1) for c in (0, 1) if pattern[2 * r + c] == "G"
    ]
    rgb = np.stack([cells["R"], (greens[0] + greens[1] + 1) // 2, cells["B"]], axis=2).astype(np.uint8)
    return np.ascontiguousarray(rgb.repeat(2, axis=0).repeat(2, axis=1))


def require_recording_file(path: str | Path) -> Path:
    """`path` when it is a file; RecordingError otherwise, naming the MCAP files inside a directory (a rosbag2
    bag is a directory around its .mcap file)."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.mcap"))
        hint = f"give one of its .mcap files: {', '.join(inside[:5])}" if inside else "it holds no .mcap file"
        raise RecordingError(f"recording {path} is a directory, not an MCAP file; {hint}")
    raise RecordingError(f"recording {path} does not exist")
