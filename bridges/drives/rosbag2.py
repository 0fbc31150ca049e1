"""ROS 2 bags recorded in MCAP (rosbag2's default storage): CDR messages with `ros2msg` schemas, no ROS needed.

Cameras: `sensor_msgs/msg/CompressedImage` (jpeg, png) or `sensor_msgs/msg/Image` (rgb8, bgr8, rgba8, bgra8,
mono8, bayer_rggb8/bggr8/gbrg8/grbg8), the frame time being `header.stamp` (acquisition time; a zero stamp
falls back to the log time). Ego: `nav_msgs/msg/Odometry` (`header.frame_id` is the world frame, the pose is
`child_frame_id`'s, base_link on Autoware) or `tf2_msgs/msg/TFMessage` on `/tf` (and `/tf_static`), the chain
of transforms from the layout's world frame (default `map`) to `base_link` composed at each time the last link
(the one into base_link) was recorded; the other links take their latest transform at or before that time.

Without a layout, topics follow Autoware's names as the open Alpamayo ROS node maps them
(autowarefoundation/alpamayo-autoware `alpamayo.launch.py`): `/sensing/camera/camera1` -> 1 (front wide, the tick
reference), `camera3` -> 0, `camera4` -> 2, `camera2` -> 6, each `.../image_raw/compressed` or `.../image_raw`;
ego `/localization/kinematic_state` (Odometry), else `/tf`.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from mcap.reader import SeekingReader
from mcap.records import Channel, Message, Schema
from mcap.stream_reader import StreamReader
from mcap_ros2.decoder import DecoderFactory

from alpamayo.input_window import PoseTrack
from alpamayo.rotations import compose, from_frame
from bridges.drives.mcap import READ_ERRORS, Drive, DriveInfo, scan
from bridges.drives.mcap_messages import MessageError, pose, timestamp
from bridges.drives.recording import CameraTopic, RecordingError, RecordingLayout, Warn
from bridges.drives.ros2_messages import SCHEMA_ENCODING, stamp_ns, type_name

EGO_FRAME = "base_link"
COMPRESSED = "sensor_msgs/CompressedImage"
RAW = "sensor_msgs/Image"
ODOMETRY = "nav_msgs/Odometry"
TF = "tf2_msgs/TFMessage"
CAMERA_TYPES = (COMPRESSED, RAW)
EGO_TYPES = (ODOMETRY, TF)
TF_STATIC = "/tf_static"
# Autoware camera topic -> Alpamayo camera index, in tick-reference-first order (alpamayo-autoware's launch file).
AUTOWARE_CAMERAS = (("camera1", 1), ("camera3", 0), ("camera4", 2), ("camera2", 6))
AUTOWARE_ODOMETRY = "/localization/kinematic_state"
AUTOWARE_TF = "/tf"


def is_rosbag2(path: Path) -> bool:
    """Whether an MCAP file's schemas are ROS 2 message definitions (False for other files, or no schema)."""
    try:
        with open(path, "rb") as f:
            try:
                summary = SeekingReader(f).get_summary()
                if summary is not None and summary.schemas:
                    return any(s.encoding == SCHEMA_ENCODING for s in summary.schemas.values())
            except READ_ERRORS:
                pass  # no footer: look for the first schema record
            f.seek(0)
            for record in StreamReader(f).records:
                if isinstance(record, Schema):
                    return record.encoding == SCHEMA_ENCODING
    except (OSError, *READ_ERRORS):
        return False
    return False


def autoware_layout(types: dict[str, str]) -> RecordingLayout:
    """The default layout for a bag whose topics have `types` (topic -> `pkg/Type`), or a RecordingError naming
    what is missing."""
    cameras = []
    for name, index in AUTOWARE_CAMERAS:
        for suffix in ("image_raw/compressed", "image_raw"):
            topic = f"/sensing/camera/{name}/{suffix}"
            if topic in types:
                cameras.append(CameraTopic(topic, index, name))
                break
    if not cameras:
        raise RecordingError(
            "no camera topic of the Autoware layout (/sensing/camera/cameraN/image_raw[/compressed], N in 1, 3, "
            f"4, 2); give --layout FILE mapping the bag's topics to camera indices. Topics: {sorted(types)}"
        )
    ego = AUTOWARE_ODOMETRY if AUTOWARE_ODOMETRY in types else AUTOWARE_TF
    return RecordingLayout(tuple(cameras), ego)


def _xyz(v: Any) -> list[float]:
    return [float(v.x), float(v.y), float(v.z)]


def _xyzw(q: Any) -> list[float]:
    return [float(q.x), float(q.y), float(q.z), float(q.w)]


def _time(header: Any, log_time: int) -> dict[str, int]:
    return timestamp(stamp_ns(header.stamp) or log_time)


def _image_format(ros_format: str) -> str:
    """`jpeg` / `png` of a CompressedImage `format` ("jpeg", "png", "bgr8; jpeg compressed bgr8", ...)."""
    text = ros_format.lower()
    if "jpeg" in text or "jpg" in text:
        return "jpeg"
    return "png" if "png" in text else text


# ROS 2 type -> (Foxglove schema its messages are laid out as, conversion of a decoded message at a log time).
_CONVERSIONS: dict[str, tuple[str, Callable[[Any, int], dict[str, Any]]]] = {
    COMPRESSED: (
        "foxglove.CompressedImage",
        lambda m, t: {
            "timestamp": _time(m.header, t),
            "frame_id": m.header.frame_id,
            "format": _image_format(m.format),
            "data": bytes(m.data),
        },
    ),
    RAW: (
        "foxglove.RawImage",
        lambda m, t: {
            "timestamp": _time(m.header, t),
            "frame_id": m.header.frame_id,
            "width": int(m.width),
            "height": int(m.height),
            "encoding": m.encoding,
            "step": int(m.step),
            "data": bytes(m.data),
        },
    ),
    ODOMETRY: (
        "foxglove.PoseInFrame",
        lambda m, t: {
            "timestamp": _time(m.header, t),
            "frame_id": m.header.frame_id,
            "pose": pose(_xyz(m.pose.pose.position), _xyzw(m.pose.pose.orientation)),
        },
    ),
    TF: (
        TF,
        lambda m, t: {
            "timestamp": timestamp(t),
            "transforms": [
                (
                    tf.header.frame_id,
                    tf.child_frame_id,
                    stamp_ns(tf.header.stamp) or t,
                    _xyz(tf.transform.translation),
                    _xyzw(tf.transform.rotation),
                )
                for tf in m.transforms
            ],
        },
    ),
}


class _CdrDecoder:
    """CDR messages decoded by their schema's embedded .msg text (the factory builds each schema's decoder once
    and keeps it by schema id)."""

    def __init__(self) -> None:
        self._factory = DecoderFactory()

    def decode(self, schema: Schema | None, channel: Channel, message: Message) -> dict[str, Any]:
        ros_type = None if schema is None else type_name(schema.name)
        if schema is None or ros_type not in _CONVERSIONS:
            raise MessageError(f"type {ros_type!r} is not one replay reads; known: {sorted(_CONVERSIONS)}")
        try:
            decoder = self._factory.decoder_for(channel.message_encoding, schema)
        except Exception as e:  # the .msg parser raises several unrelated types
            raise MessageError(f"{schema.name}: its embedded definition does not parse: {e}") from e
        if decoder is None:
            raise MessageError(f"{schema.name}: message encoding {channel.message_encoding!r} is not CDR")
        try:
            return _CONVERSIONS[ros_type][1](decoder(message.data), message.log_time)
        except Exception as e:  # a truncated or corrupt payload fails anywhere in the CDR reader
            raise MessageError(f"{schema.name} CDR message does not decode: {type(e).__name__}: {e}") from e


class Rosbag2Drive(Drive):
    """A ROS 2 bag (MCAP) opened for replay; a `bridges.drives.DriveSource` like the Foxglove `Drive` it extends
    (messages are converted to the same Foxglove layout, so frames decode and ticks assemble alike)."""

    kind = "rosbag2"

    def __init__(self, path: Path, info: DriveInfo, warn: Warn, types: dict[str, str], world_frame: str):
        self.types = types
        self.world_frame = world_frame
        super().__init__(path, info, warn)

    @classmethod
    def open(
        cls,
        path: str | Path,
        layout: RecordingLayout | None = None,
        warn: Warn = print,
        world_frame: str = "map",
    ) -> Rosbag2Drive:
        """Open a rosbag2 MCAP file: every layout topic present with a type replay reads (see the module
        docstring), and at least two usable ego poses."""
        path = Path(path)
        found = scan(path, warn)
        types = {t: type_name(n or "") for t, n in found.schemas.items()}
        source = "--layout"
        if layout is None:
            layout = autoware_layout(types)
            source = "Autoware default layout"
        missing = [t for t in layout.topics if t not in types]
        if missing:
            raise RecordingError(
                f"bag {path} lacks topic(s) {missing} required by the {source}; topics present: {sorted(types)}"
            )
        for topic in layout.topics:
            allowed = EGO_TYPES if topic == layout.ego_pose_topic else CAMERA_TYPES
            if types[topic] not in allowed:
                raise RecordingError(
                    f"bag {path}: topic {topic} has message type {types[topic]!r}, which replay does not read "
                    f"there; allowed: {list(allowed)}"
                )
        counts = {t: found.counts.get(t, 0) for t in layout.topics}
        info = DriveInfo(layout, source, counts, found.indexed, found.metadata)
        return cls(path, info, warn, types, world_frame)

    def _new_decoder(self) -> Any:
        return _CdrDecoder()

    def _decode(
        self, decoder: Any, schema: Schema | None, channel: Channel, message: Message
    ) -> dict[str, Any]:
        return decoder.decode(schema, channel, message)

    def _schema_name(self, schema: Schema) -> str:
        return _CONVERSIONS[type_name(schema.name)][0]

    def describe(self) -> Any:
        """`Drive.describe` with the cameras' ROS types, plus the bag's other topics and their types (to write a
        --layout from)."""
        description = super().describe()
        cameras = [dataclasses.replace(c, detail=self.types[c.source]) for c in description.cameras]
        others = {t: self.types[t] for t in sorted(self.types) if t not in self.layout.topics}
        extra = {**description.extra, "other topics": others}
        return dataclasses.replace(description, cameras=cameras, extra=extra)

    def ego_source(self) -> str:
        topic = self.layout.ego_pose_topic
        if self.types[topic] == TF:
            return f"{topic} (tf2_msgs/msg/TFMessage): {self.world_frame} -> {EGO_FRAME}"
        return f"{topic} (nav_msgs/msg/Odometry)"

    def _load_poses(self) -> PoseTrack:
        if self.types[self.layout.ego_pose_topic] != TF:
            return super()._load_poses()
        return self._tf_poses()

    def _tf_poses(self) -> PoseTrack:
        """The world -> base_link chain of /tf (and /tf_static) composed at each base_link transform's time."""
        topics = [self.layout.ego_pose_topic] + ([TF_STATIC] if TF_STATIC in self.types else [])
        edges: dict[tuple[str, str], list[tuple[int, list[float], list[float]]]] = {}
        for _, _, msg, _ in self._messages(topics):
            for parent, child, t_ns, xyz, quat in msg["transforms"]:
                edges.setdefault((parent.lstrip("/"), child.lstrip("/")), []).append((t_ns, xyz, quat))
        chain = _chain(edges, self.world_frame, EGO_FRAME)
        if chain is None:
            seen = sorted(f"{p}->{c}" for p, c in edges)
            raise RecordingError(
                f"bag {self.path}: the transforms on {topics} never chain {self.world_frame} to {EGO_FRAME}; "
                f"transforms seen: {seen or 'none'}"
            )
        for samples in edges.values():
            samples.sort(key=lambda s: s[0])
        last = edges[chain[-1]]
        t, xyz, quat = [], [], []
        for t_ns, p, q in last:
            composed = _compose([_at(edges[link], t_ns) for link in chain[:-1]] + [(p, q)])
            if composed is None:
                continue  # an upper link has no transform yet at this time
            t.append(t_ns)
            xyz.append(composed[0])
            quat.append(composed[1])
        keep = np.concatenate([[True], np.diff(t) > 0]) if t else np.zeros(0, bool)
        if int(keep.sum()) < 2:
            raise RecordingError(
                f"bag {self.path}: the {self.world_frame} -> {EGO_FRAME} chain {chain} has {int(keep.sum())} "
                "usable pose(s); at least 2 are needed"
            )
        return PoseTrack(np.array(t, np.int64)[keep], np.array(xyz)[keep], np.array(quat)[keep])


def _chain(edges: dict[tuple[str, str], Any], world: str, target: str) -> list[tuple[str, str]] | None:
    """The links from `world` down to `target` (breadth first over parent -> child), or None."""
    paths: dict[str, list[tuple[str, str]]] = {world: []}
    frontier = [world]
    while frontier:
        nxt = []
        for frame in frontier:
            for parent, child in edges:
                if parent == frame and child not in paths:
                    paths[child] = [*paths[frame], (parent, child)]
                    nxt.append(child)
        frontier = nxt
    return paths.get(target) or None


def _at(
    samples: list[tuple[int, list[float], list[float]]], t_ns: int
) -> tuple[list[float], list[float]] | None:
    """The latest transform at or before t_ns of time-sorted `samples` (a single, static transform holds at
    every time)."""
    if len(samples) == 1:
        return samples[0][1], samples[0][2]
    i = bisect.bisect_right(samples, t_ns, key=lambda s: s[0]) - 1
    return None if i < 0 else (samples[i][1], samples[i][2])


def _compose(links: list[tuple[list[float], list[float]] | None]) -> tuple[np.ndarray, np.ndarray] | None:
    """world -> ... -> base_link transforms composed: (xyz [3], quat_xyzw [4]) of base_link in the world."""
    xyz, quat = np.zeros(3), np.array([0.0, 0.0, 0.0, 1.0])
    for link in links:
        if link is None:
            return None
        xyz, quat = from_frame(xyz, quat, np.asarray(link[0])), compose(quat, np.asarray(link[1]))
    return xyz, quat
