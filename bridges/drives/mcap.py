"""Foxglove MCAP drives: one image topic per camera and one ego-pose topic, read for replay.

A drive holds one image topic per camera (`foxglove.CompressedImage` JPEG/PNG or `foxglove.RawImage`) and one
ego-pose topic (`foxglove.PoseInFrame`, world frame), in JSON or protobuf encoding; `docs/recordings.md` lists the
fields. Times are the messages' own `timestamp` (acquisition time, integer ns); a zero timestamp falls back to the
MCAP log time. The topic-to-camera mapping is a `RecordingLayout` (`bridges.drives.recording`: a YAML file, or the
`alpamayo.layout` metadata record that `make-demo-drive` writes).

Damaged recordings lose nothing that is readable: a truncated file (no footer) is read linearly up to the damage
with a warning; messages whose time goes backwards on their topic are skipped with a warning.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zstandard
from mcap.exceptions import InvalidMagic, McapError
from mcap.reader import NonSeekingReader, SeekingReader
from mcap.records import Channel, Message, Metadata, Schema
from mcap.stream_reader import StreamReader

from alpamayo.input_window import PoseTrack
from bridges.drives.description import DriveDescription, camera_descriptions, ego_fields
from bridges.drives.mcap_messages import MessageDecoder, MessageError, timestamp_ns
from bridges.drives.recording import (
    LAYOUT_METADATA,
    FrameError,
    RecordedFrame,
    RecordingError,
    RecordingLayout,
    Warn,
    default_layout,
    require_recording_file,
)

IMAGE_SCHEMAS = ("foxglove.CompressedImage", "foxglove.RawImage")
POSE_SCHEMA = "foxglove.PoseInFrame"
# Everything the MCAP parser and its decompressors raise on a damaged file.
READ_ERRORS = (McapError, struct.error, EOFError, ValueError, RuntimeError, zstandard.ZstdError)


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
            if schema is None:  # every decoder rejects a message without a schema (MessageError above)
                raise RecordingError(f"recording {self.path}: decoded a {topic} message that has no schema")
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
                if schema is None:  # `open` checked every layout topic's schema
                    raise RecordingError(f"recording {self.path}: a {channel.topic} message has no schema")
                yield schema, channel, message

    def frames(self, start_ns: int | None = None, end_ns: int | None = None) -> Iterator[RecordedFrame]:
        """Camera frames of every layout camera with start_ns <= t_ns < end_ns."""
        cameras = {c.topic: c.camera for c in self.layout.cameras}
        for topic, t_ns, msg, schema in self._messages(list(cameras), start_ns, end_ns):
            yield RecordedFrame(cameras[topic], t_ns, schema, msg)

    def frame_size(self, start_ns: int | None = None, end_ns: int | None = None) -> tuple[int, int] | None:
        """(height, width) of the first frame in [start_ns, end_ns) that decodes (None: none does). A frame that
        does not is passed over here; replay skips it with a warning when it reaches it."""
        for frame in self.frames(start_ns, end_ns):
            try:
                height, width = frame.rgb().shape[:2]
                return height, width
            except FrameError:
                continue
        return None

    def window_frames(self, t0_ns: int) -> dict[int, list[RecordedFrame]]:
        raise NotImplementedError("an MCAP drive's ticks follow its reference camera (tick_times_ns is None)")

    def ego_source(self) -> str:
        """How `describe` names the ego pose stream."""
        return f"{self.layout.ego_pose_topic} ({POSE_SCHEMA})"

    def describe(self) -> DriveDescription:
        """What the drive holds; reads the camera topics once, no image is decoded."""
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
) -> Iterator[tuple[Schema | None, Channel, Message]]:
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
