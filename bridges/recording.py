"""Recorded drives in MCAP: the topic layout, the camera and ego-pose streams, and writing predictions back.

A drive holds one image topic per camera (`foxglove.CompressedImage` JPEG/PNG or `foxglove.RawImage`) and one
ego-pose topic (`foxglove.PoseInFrame`, world frame), in JSON or protobuf encoding; `docs/recordings.md` lists the
fields. Times are the messages' own `timestamp` (acquisition time, integer ns); a zero timestamp falls back to the
MCAP log time. The topic-to-camera mapping is a `RecordingLayout` (YAML file, or the `alpamayo.layout` metadata
record that `make-demo-drive` writes).

Damaged recordings lose nothing that is readable: a truncated file (no footer) is read linearly up to the damage
with a warning; messages whose time goes backwards on their topic are skipped with a warning.
"""

from __future__ import annotations

import io
import json
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
import zstandard
from mcap.exceptions import InvalidMagic, McapError
from mcap.reader import NonSeekingReader, SeekingReader
from mcap.records import Channel, Message, Metadata, Schema
from mcap.stream_reader import StreamReader
from PIL import Image, UnidentifiedImageError

from alpamayo.rotations import slerp
from bridges.mcap_messages import MessageDecoder, MessageError, timestamp_ns
from bridges.protocol import ALPAMAYO_CAMERAS

IMAGE_SCHEMAS = ("foxglove.CompressedImage", "foxglove.RawImage")
POSE_SCHEMA = "foxglove.PoseInFrame"
LAYOUT_METADATA = "alpamayo.layout"
# Interpolating ego poses across a longer gap would bend a curved path into a chord (0.25 s at 20 m/s on a
# 100 m radius is a 3 cm sagitta; 1 s would be 50 cm, more than a history token's 8 mm bin).
MAX_POSE_GAP_NS = 250_000_000
RAW_ENCODINGS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}
# Bayer mosaics (ROS `sensor_msgs/Image` encodings): the colour of each pixel of a 2x2 cell, row by row.
BAYER_PATTERNS = {"bayer_rggb8": "RGGB", "bayer_bggr8": "BGGR", "bayer_gbrg8": "GBRG", "bayer_grbg8": "GRBG"}
# Everything the MCAP parser and its decompressors raise on a damaged file.
READ_ERRORS = (McapError, struct.error, EOFError, ValueError, RuntimeError, zstandard.ZstdError)

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
class CameraFrame:
    """One camera message: acquisition time `t_ns`, and the decoded Foxglove image message."""

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
    mistyped = {k: v for k, v in (("width", width), ("height", height), ("step", step)) if type(v) is not int}
    if mistyped:
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


def pose_brackets(t_ns: np.ndarray, times_ns: np.ndarray) -> np.ndarray | None:
    """Per time of `times_ns` [M] the index `hi` into a track's strictly increasing pose times `t_ns` [N] of the
    first pose at or after it (clipped to 1 .. N-1, so poses hi - 1 and hi enclose it), or None when a time lies
    outside the track or between two poses more than MAX_POSE_GAP_NS apart (no pose may be interpolated there)."""
    if times_ns.min() < t_ns[0] or times_ns.max() > t_ns[-1]:
        return None
    hi = np.clip(np.searchsorted(t_ns, times_ns, side="left"), 1, len(t_ns) - 1)
    if np.any(t_ns[hi] - t_ns[hi - 1] > MAX_POSE_GAP_NS):
        return None
    return hi


@dataclass(frozen=True)
class PoseTrack:
    """The recorded ego poses: t_ns [N] strictly increasing, xyz [N, 3] metres, quat_xyzw [N, 4] ego->world."""

    t_ns: np.ndarray
    xyz: np.ndarray
    quat_xyzw: np.ndarray

    def interpolate(self, times_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Poses at `times_ns` [M]: (xyz [M, 3] linear, quat_xyzw [M, 4] slerp), or None when a time lies
        outside the track or between two poses more than MAX_POSE_GAP_NS apart."""
        times_ns = np.asarray(times_ns, dtype=np.int64)
        hi = pose_brackets(self.t_ns, times_ns)
        if hi is None:
            return None
        lo = hi - 1
        span = self.t_ns[hi] - self.t_ns[lo]
        w = (times_ns - self.t_ns[lo]) / span
        xyz = self.xyz[lo] + w[:, None] * (self.xyz[hi] - self.xyz[lo])
        return xyz, slerp(self.quat_xyzw[lo], self.quat_xyzw[hi], w)


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


@dataclass
class DriveInfo:
    """What `Drive.open` found: the layout in use and where it came from, each layout topic's message count,
    whether the file is indexed (log-time order) or read linearly, and its metadata records."""

    layout: RecordingLayout
    layout_source: str
    message_counts: dict[str, int]
    indexed: bool
    metadata: dict[str, dict[str, str]]


class Drive:
    """A recorded drive (Foxglove MCAP) opened for replay. Poses are loaded at open; camera frames stream in time
    order. A `bridges.drives.DriveSource`: ticks follow the reference camera (`tick_times_ns` None); `skipped`
    counts the messages skipped while reading, by reason (each message once, however often it is read)."""

    kind = "foxglove"
    tick_times_ns = None

    def __init__(self, path: Path, info: DriveInfo, warn: Warn):
        self.path = path
        self.spec = str(path)
        self.info = info
        self._warn = warn
        self._skipped: dict[str, set[tuple[str, int]]] = {}
        self.poses = self._load_poses()

    @property
    def skipped(self) -> Counter:
        return Counter({reason: len(keys) for reason, keys in self._skipped.items()})

    def _skip_message(self, reason: str, detail: str, topic: str, log_time: int) -> None:
        """Warn of a skipped message and count it once under `reason` (a message is read again when several
        passes read the file)."""
        seen = self._skipped.setdefault(reason, set())
        if (topic, log_time) not in seen:
            seen.add((topic, log_time))
            self._warn(detail)

    @property
    def layout(self) -> RecordingLayout:
        return self.info.layout

    @classmethod
    def open(cls, path: str | Path, layout: RecordingLayout | None = None, warn: Warn = print) -> Drive:
        """Open and validate `path`: an MCAP file holding every topic of `layout` (default: the file's
        `alpamayo.layout` metadata, else `default_layout()`) with the right schemas, and at least two usable
        ego poses."""
        path = require_recording_file(path)
        found = scan(path, warn)
        source = "--layout"
        if layout is None and LAYOUT_METADATA in found.metadata:
            text = found.metadata[LAYOUT_METADATA].get("json", "null")
            layout = RecordingLayout.from_dict(json.loads(text), f"{path} metadata {LAYOUT_METADATA}")
            source = f"{LAYOUT_METADATA} metadata"
        elif layout is None:
            layout = default_layout()
            source = "default layout"
        missing = [t for t in layout.topics if t not in found.schemas]
        if missing:
            raise RecordingError(
                f"recording {path} lacks topic(s) {missing} required by the {source}; "
                f"topics present: {sorted(found.schemas)}"
            )
        for topic in layout.topics:
            allowed = (POSE_SCHEMA,) if topic == layout.ego_pose_topic else IMAGE_SCHEMAS
            if found.schemas[topic] not in allowed:
                raise RecordingError(
                    f"recording {path}: topic {topic} has schema {found.schemas[topic]!r}; allowed: {list(allowed)}"
                )
        counts = {t: found.counts.get(t, 0) for t in layout.topics}
        return cls(path, DriveInfo(layout, source, counts, found.indexed, found.metadata), warn)

    def _messages(
        self, topics: list[str], start_ns: int | None = None, end_ns: int | None = None
    ) -> Iterator[tuple[str, int, dict[str, Any], str]]:
        """(topic, time ns, decoded message, schema name) with start_ns <= time < end_ns; log-time ordered when
        indexed, file order otherwise. Undecodable messages and times that do not increase on their topic are
        skipped with a warning."""
        decoder = self._new_decoder()
        last: dict[str, int] = {}
        for schema, channel, message in iter_messages(self.path, self.info.indexed, topics, self._warn):
            topic, log_time = channel.topic, message.log_time
            try:
                decoded = self._decode(decoder, schema, channel, message)
            except MessageError as e:
                self._skip_message(
                    f"a {topic} message does not decode",
                    f"{topic}: skipped the message at log time {log_time} ns: {e}",
                    topic,
                    log_time,
                )
                continue
            try:  # JSON messages are not checked against their schema when read
                t_ns = timestamp_ns(decoded.get("timestamp") or {}) or log_time
            except (AttributeError, TypeError, ValueError) as e:
                self._skip_message(
                    f"a {topic} message has a bad timestamp",
                    f"{topic}: skipped the message at log time {log_time} ns: its timestamp "
                    f"{decoded.get('timestamp')!r} is not {{sec, nsec}} integers ({e})",
                    topic,
                    log_time,
                )
                continue
            if t_ns <= last.get(topic, -1):
                self._skip_message(
                    f"a {topic} message is not after the previous one",
                    f"{topic}: skipped the message at {t_ns} ns, not after the previous one at "
                    f"{last[topic]} ns (times must increase)",
                    topic,
                    log_time,
                )
                continue
            last[topic] = t_ns
            if (start_ns is None or t_ns >= start_ns) and (end_ns is None or t_ns < end_ns):
                yield topic, t_ns, decoded, self._schema_name(schema)

    def _new_decoder(self) -> Any:
        return MessageDecoder()

    def _decode(
        self, decoder: Any, schema: Schema | None, channel: Channel, message: Message
    ) -> dict[str, Any]:
        """One message as a Foxglove-layout dict (subclasses read other encodings); MessageError when not."""
        return decoder.decode(schema, channel.message_encoding, message.data)

    def _schema_name(self, schema: Schema) -> str:
        """The Foxglove schema a decoded message is laid out as."""
        return schema.name

    def _load_poses(self) -> PoseTrack:
        t, xyz, quat = [], [], []
        for topic, t_ns, msg, _ in self._messages([self.layout.ego_pose_topic]):
            try:  # JSON messages are not checked against their schema when read
                pose = msg.get("pose") or {}
                position = [float((pose.get("position") or {}).get(k, 0.0)) for k in "xyz"]
                orientation = np.array([float((pose.get("orientation") or {}).get(k, 0.0)) for k in "xyzw"])
            except (AttributeError, TypeError, ValueError) as e:
                self._warn(f"{topic}: skipped the pose at {t_ns} ns: its fields are not numbers ({e})")
                continue
            norm = float(np.linalg.norm(orientation))
            if not (np.all(np.isfinite(position)) and abs(norm - 1) < 1e-3):
                self._warn(
                    f"{topic}: skipped the pose at {t_ns} ns: position {position} must be finite and the "
                    f"quaternion a unit one (norm {norm:.6g}, allowed 1 +- 1e-3)"
                )
                continue
            t.append(t_ns)
            xyz.append(position)
            quat.append(orientation / norm)
        if len(t) < 2:
            raise RecordingError(
                f"recording {self.path}: ego pose topic {self.layout.ego_pose_topic} has {len(t)} usable "
                "pose(s); at least 2 are needed"
            )
        return PoseTrack(np.array(t, np.int64), np.array(xyz), np.array(quat))

    def raw_messages(self, start_ns: int, end_ns: int) -> Iterator[tuple[Schema, Channel, Message]]:
        """The layout topics' messages logged in [start_ns, end_ns), undecoded (for copying into outputs)."""
        for schema, channel, message in iter_messages(
            self.path, self.info.indexed, self.layout.topics, self._warn
        ):
            if start_ns <= message.log_time < end_ns:
                yield schema, channel, message

    def frames(self, start_ns: int | None = None, end_ns: int | None = None) -> Iterator[CameraFrame]:
        """Camera frames of every layout camera with start_ns <= t_ns < end_ns."""
        cameras = {c.topic: c.camera for c in self.layout.cameras}
        for topic, t_ns, msg, schema in self._messages(list(cameras), start_ns, end_ns):
            yield CameraFrame(cameras[topic], t_ns, schema, msg)

    def frame_size(self, start_ns: int | None = None, end_ns: int | None = None) -> tuple[int, int] | None:
        """(height, width) of the first frame in [start_ns, end_ns) that decodes (None: none does). A frame that
        does not is passed over here; replay skips it with a warning when it reaches it."""
        for frame in self.frames(start_ns, end_ns):
            try:
                return frame.rgb().shape[:2]
            except FrameError:
                continue
        return None

    def window_frames(self, t0_ns: int) -> dict[int, list[CameraFrame]]:
        raise NotImplementedError("an MCAP drive's ticks follow its reference camera (tick_times_ns is None)")

    def ego_source(self) -> str:
        """How `describe` names the ego pose stream."""
        return f"{self.layout.ego_pose_topic} ({POSE_SCHEMA})"

    def describe(self) -> Any:
        """What the drive holds (`bridges.drives.DriveDescription`); reads the camera topics once, no image is
        decoded."""
        from bridges.drives.description import DriveDescription, camera_descriptions, ego_fields

        spans: dict[int, list[int]] = {c.camera: [] for c in self.layout.cameras}
        details: dict[int, str] = {}
        for frame in self.frames():
            spans[frame.camera].append(frame.t_ns)
            details.setdefault(frame.camera, frame.schema_name)
        cameras = camera_descriptions(
            [(c.camera, c.name, c.topic, details.get(c.camera, "")) for c in self.layout.cameras], spans
        )
        return DriveDescription(
            kind=self.kind,
            spec=self.spec,
            cameras=cameras,
            ego_source=self.ego_source(),
            **ego_fields(self.poses.t_ns),
            extra={
                "layout": self.info.layout_source,
                "indexed": self.info.indexed,
                "skipped": dict(self.skipped),
            },
        )

    def close(self) -> None:
        """Nothing is held open between reads."""


@dataclass
class Scan:
    """An MCAP file's channels: schema name per topic, message counts, metadata records."""

    schemas: dict[str, str | None]  # topic -> schema name
    counts: dict[str, int]  # topic -> messages
    metadata: dict[str, dict[str, str]]
    indexed: bool


def scan(path: Path, warn: Warn) -> Scan:
    """Topics, message counts and metadata: from the summary when the file has one with a chunk index,
    otherwise from a linear read up to the end or the damage."""
    with open(path, "rb") as f:
        try:
            reader = SeekingReader(f)
        except InvalidMagic as e:
            raise RecordingError(f"recording {path} is not an MCAP file ({e})") from e
        except READ_ERRORS as e:
            raise RecordingError(f"recording {path} is not a readable MCAP file: {e}") from e
        try:
            summary = reader.get_summary()
            metadata = {m.name: dict(m.metadata) for m in reader.iter_metadata()}
        except READ_ERRORS as e:
            warn(
                f"recording {path} has no readable footer or summary ({type(e).__name__}: {e}); it is probably "
                "truncated: reading it linearly up to the damage"
            )
            summary = None
    if summary is not None and summary.chunk_indexes:
        names = {sid: s.name for sid, s in summary.schemas.items()}
        schemas = {c.topic: names.get(c.schema_id) for c in summary.channels.values()}
        counts = dict.fromkeys(schemas, 0)
        if summary.statistics is not None:
            for cid, n in summary.statistics.channel_message_counts.items():
                counts[summary.channels[cid].topic] = n
        return Scan(schemas, counts, metadata, True)
    result = Scan({}, {}, {}, False)
    names, topics = {}, {}
    with open(path, "rb") as f:
        try:
            for record in StreamReader(f).records:
                if isinstance(record, Schema):
                    names[record.id] = record.name
                elif isinstance(record, Channel):
                    topics[record.id] = record.topic
                    result.schemas[record.topic] = names.get(record.schema_id)
                elif isinstance(record, Message) and record.channel_id in topics:
                    topic = topics[record.channel_id]
                    result.counts[topic] = result.counts.get(topic, 0) + 1
                elif isinstance(record, Metadata):
                    result.metadata[record.name] = dict(record.metadata)
        except READ_ERRORS:
            pass  # the damage point: `iter_messages` warns when replay reaches it
    return result


def iter_messages(
    path: Path, indexed: bool, topics: list[str], warn: Warn
) -> Iterator[tuple[Schema, Channel, Message]]:
    with open(path, "rb") as f:
        reader = SeekingReader(f) if indexed else NonSeekingReader(f)
        read = 0
        try:
            for item in reader.iter_messages(topics=topics, log_time_order=indexed):
                read += 1
                yield item
        except READ_ERRORS as e:
            warn(
                f"recording {path} is damaged after {read} message(s) on {topics}: {type(e).__name__}: {e}; "
                "using the messages before the damage"
            )
