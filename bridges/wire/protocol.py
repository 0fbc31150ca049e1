"""Wire protocol of the inference node (version 1); `docs/protocol.md` is the reader's version of this file.

Every input message is ONE ZeroMQ frame: a msgpack map (the header, at most `MAX_HEADER_BYTES`) immediately
followed by the payload bytes (the image; empty for ego poses). Single-frame, not multipart, because
ZMQ_CONFLATE keeps only one part of a multipart message, because one frame is atomic (a header can never
arrive without its image), and because ZMQ_MAXMSGSIZE then bounds the whole message. The header is read
with a streaming `msgpack.Unpacker` over the first `MAX_HEADER_BYTES` bytes only, so the payload is never
parsed as msgpack and a raw image is used in place (no copy) when its rows are unpadded RGB.

Nothing on the input path uses pickle or msgpack-numpy: arrays travel as raw bytes described by the header
(`width`, `height`, `stride`, `encoding`) and are checked against it before use.

Output messages (trajectories) are a single msgpack map, see `TrajectoryMessage`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from bridges.wire.jpeg import JpegError, JpegSizeError, inspect_jpeg

PROTOCOL_VERSION = 1  # input messages (frame, ego)
# The output (trajectory) message. Version 2 added `decoder` (the action expert or the trajectory tokens);
# the input messages did not change and stay at PROTOCOL_VERSION.
TRAJECTORY_VERSION = 2
ENCODINGS = ("rgb8", "bgr8", "jpeg")
CHANNELS = 3  # rgb8 and bgr8 are 3 bytes per pixel; a JPEG must decode to RGB
MAX_HEADER_BYTES = 1024  # a v1 frame header packs to about 130 bytes
MAX_ROW_PADDING = 1024  # stride may exceed width*3 by this much (camera drivers align rows to <= 1 KiB)
MAX_EXPOSURE_NS = 1_000_000_000  # t_eof - t_sof: exposure plus readout, at most 1 s
MAX_POSITION_M = 1e8  # |x|, |y|, |z| of an ego pose (covers UTM and ECEF world frames)
MAX_SPEED_MPS = 150.0  # |vx|, |vy|, |vz|
QUAT_NORM_TOLERANCE = 1e-2  # |‖q‖ - 1| above this is rejected; within it q is renormalised
U32_MAX = 2**32 - 1
I64_MAX = 2**63 - 1
# Alpamayo's camera indices and names (NVlabs/alpamayo common/constants.py); the index is the model's only
# camera cue.
ALPAMAYO_CAMERAS = {
    0: "camera_cross_left_120fov",
    1: "camera_front_wide_120fov",
    2: "camera_cross_right_120fov",
    3: "camera_rear_left_70fov",
    4: "camera_rear_tele_30fov",
    5: "camera_rear_right_70fov",
    6: "camera_front_tele_30fov",
}

# Rejection reasons: the node counts rejected messages under these names (status `rejected`).
REJECTION_REASONS = (
    "too_large",  # message longer than Limits.max_message_bytes
    "malformed",  # not a msgpack map header, truncated header, non-string keys
    "version",  # `v` is not PROTOCOL_VERSION
    "missing_field",
    "extra_field",
    "wrong_type",
    "out_of_range",  # a value outside its documented range (including unknown `kind` / `encoding`)
    "non_finite",  # NaN or infinity in a pose
    "unknown_camera",
    "unexpected_size",  # width/height differ from the camera's declared size (config camera_formats)
    "unexpected_encoding",  # encoding differs from the camera's declared one
    "payload_size",  # payload length or the JPEG's own size does not match width/height/stride
    "jpeg_decode",  # truncated, damaged, a decompression bomb, or failed / over budget when decoded
    "duplicate",  # frame_id or time equal to the last accepted one of that stream
    "backwards",  # frame_id or time older than the last accepted one of that stream
    "future",  # time further ahead of the other streams than timing.max_future_ms
)


class ProtocolError(ValueError):
    """A rejected input message. `reason` is one of REJECTION_REASONS; the message names value and range."""

    def __init__(self, reason: str, message: str):
        if reason not in REJECTION_REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}; allowed: {', '.join(REJECTION_REASONS)}")
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Limits:
    """Size limits applied before anything is decoded. Pixels per side; bytes for messages."""

    max_width: int = 3840
    max_height: int = 2160
    max_jpeg_ratio: float = 1024.0  # decoded RGB bytes / JPEG bytes (bridges.wire.jpeg: measured at most 497)

    @property
    def max_payload_bytes(self) -> int:
        return self.max_height * (self.max_width * CHANNELS + MAX_ROW_PADDING)

    @property
    def max_message_bytes(self) -> int:
        """The largest legal input message: a full header plus the largest padded raw image."""
        return MAX_HEADER_BYTES + self.max_payload_bytes


@dataclass(frozen=True)
class CameraFormat:
    """What a camera is declared to send (config `camera_formats`); None: anything within the limits.
    `allow_resize`: a frame of another size is a declared restart of the stream instead of a rejection."""

    width: int | None = None
    height: int | None = None
    encoding: str | None = None
    allow_resize: bool = False

    def check(self, name: str, encoding: str, width: int, height: int) -> None:
        """Raises ProtocolError (unexpected_encoding / unexpected_size) for a frame that breaks the declaration."""
        if self.encoding is not None and encoding != self.encoding:
            raise ProtocolError(
                "unexpected_encoding", f"camera {name!r} sends {encoding}, declared {self.encoding}"
            )
        size = (self.width or width, self.height or height)
        if not self.allow_resize and size != (width, height):
            raise ProtocolError(
                "unexpected_size", f"camera {name!r} frame is {width}x{height}, declared {size[0]}x{size[1]}"
            )


@dataclass(frozen=True)
class CameraTable:
    """The node's cameras: name -> model camera index (ALPAMAYO_CAMERAS: cross_left 0, front_wide 1, ...),
    and per index the declared format, where the config declares one."""

    indices: Mapping[str, int]
    formats: Mapping[int, CameraFormat] = field(default_factory=dict)

    def name(self, index: int) -> str:
        return next(n for n, i in self.indices.items() if i == index)

    def resolve(self, camera: object) -> int:
        """Model index of a header's `camera` field, given as a configured name or index."""
        if type(camera) is int:
            if camera in self.indices.values():
                return camera
        elif isinstance(camera, str):
            if camera in self.indices:
                return self.indices[camera]
        else:
            raise ProtocolError("wrong_type", f"field 'camera' must be an int or str, got {_kind(camera)}")
        allowed = ", ".join(f"{n!r}={i}" for n, i in self.indices.items())
        raise ProtocolError("unknown_camera", f"camera {camera!r} is not configured (known: {allowed})")


@dataclass
class WireFrame:
    """A camera frame message (`kind: "frame"`) received on the node's input socket and accepted. image:
    [height, width, 3] uint8 RGB, C-contiguous (read-only when zero-copy);
    a JPEG frame keeps its compressed bytes in `jpeg` and has image None until a window decodes it
    (`bridges.wire.jpeg.decode_jpeg`)."""

    camera: int
    frame_id: int
    t_sof_ns: int
    t_eof_ns: int
    encoding: str
    image: np.ndarray | None
    nbytes: int  # message length on the wire
    jpeg: bytes | None = None
    width: int = 0  # px; taken from `image` when it is given
    height: int = 0

    def __post_init__(self) -> None:
        if self.image is not None:
            self.height, self.width = self.image.shape[:2]

    @property
    def held_bytes(self) -> int:
        """Memory this frame holds: the pixels, plus the compressed bytes of a JPEG."""
        return (0 if self.image is None else self.image.nbytes) + (0 if self.jpeg is None else len(self.jpeg))


@dataclass
class EgoPose:
    """An accepted ego pose in a fixed world frame: xyz [3] m, quat_xyzw [4] unit (ego->world), velocity [3] m/s
    in the world frame or None."""

    t_ns: int
    xyz: np.ndarray
    quat_xyzw: np.ndarray
    velocity: np.ndarray | None


# Header schemas: field -> required. Types and ranges are checked by the decoders below.
FRAME_FIELDS = {
    f: True
    for f in (
        "v",
        "kind",
        "camera",
        "frame_id",
        "t_sof_ns",
        "t_eof_ns",
        "encoding",
        "width",
        "height",
        "stride",
    )
}
EGO_FIELDS = {"v": True, "kind": True, "t_ns": True, "xyz": True, "quat_xyzw": True, "velocity": False}
KINDS = {"frame": FRAME_FIELDS, "ego": EGO_FIELDS}


def decode_message(
    buf: bytes | bytearray | memoryview, limits: Limits, cameras: CameraTable
) -> WireFrame | EgoPose:
    """Validate and decode one input message; raises ProtocolError naming the field, value and allowed range."""
    view = memoryview(buf)
    if view.nbytes > limits.max_message_bytes:
        raise ProtocolError(
            "too_large", f"message is {view.nbytes} bytes, limit {limits.max_message_bytes} bytes"
        )
    header, offset = unpack_header(view)
    payload = view[offset:]
    if "kind" not in header:
        raise ProtocolError("missing_field", "header lacks field 'kind' (one of: frame, ego)")
    kind = header["kind"]
    if not isinstance(kind, str):
        raise ProtocolError("wrong_type", f"field 'kind' must be a str, got {_kind(kind)}")
    if kind not in KINDS:
        raise ProtocolError("out_of_range", f"kind {kind!r} is not one of: frame, ego")
    _check_fields(header, KINDS[kind], kind)
    version = _int(header, "v", 0, U32_MAX)
    if version != PROTOCOL_VERSION:
        raise ProtocolError("version", f"protocol version {version} is not supported (supported: 1)")
    if kind == "frame":
        return _decode_frame(header, payload, limits, cameras, view.nbytes)
    if payload.nbytes:
        raise ProtocolError("payload_size", f"an ego message carries no payload, got {payload.nbytes} bytes")
    return _decode_ego(header)


def unpack_header(view: memoryview) -> tuple[dict[str, Any], int]:
    """The leading msgpack map and the payload's offset, reading at most MAX_HEADER_BYTES bytes."""
    unpacker = msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        max_buffer_size=MAX_HEADER_BYTES,
        max_array_len=16,
        max_map_len=16,
        timestamp=0,
    )
    unpacker.feed(view[:MAX_HEADER_BYTES])
    try:
        header = unpacker.unpack()
    except msgpack.OutOfData:
        raise ProtocolError(
            "malformed",
            f"no complete msgpack header in the first {min(view.nbytes, MAX_HEADER_BYTES)} bytes "
            f"(a header is at most {MAX_HEADER_BYTES} bytes)",
        ) from None
    except (ValueError, TypeError) as e:  # FormatError, StackError, limits, invalid UTF-8 are ValueErrors
        raise ProtocolError("malformed", f"header is not valid msgpack: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError("malformed", f"header must be a msgpack map, got {_kind(header)}")
    if not all(isinstance(k, str) for k in header):
        raise ProtocolError("malformed", "header keys must be strings")
    return header, unpacker.tell()


def _check_fields(header: dict[str, Any], schema: Mapping[str, bool], kind: str) -> None:
    missing = [f for f, required in schema.items() if required and f not in header]
    if missing:
        raise ProtocolError("missing_field", f"{kind} header lacks field(s) {', '.join(missing)}")
    extra = sorted(set(header) - set(schema))
    if extra:
        raise ProtocolError(
            "extra_field",
            f"{kind} header has unknown field(s) {', '.join(map(repr, extra))}; allowed: {', '.join(schema)}",
        )


def _decode_frame(
    header: dict[str, Any], payload: memoryview, limits: Limits, cameras: CameraTable, nbytes: int
) -> WireFrame:
    camera = cameras.resolve(header["camera"])
    frame_id = _int(header, "frame_id", 0, U32_MAX)
    t_sof = _int(header, "t_sof_ns", 0, I64_MAX)
    t_eof = _int(header, "t_eof_ns", t_sof, min(I64_MAX, t_sof + MAX_EXPOSURE_NS))
    encoding = header["encoding"]
    if not isinstance(encoding, str):
        raise ProtocolError("wrong_type", f"field 'encoding' must be a str, got {_kind(encoding)}")
    if encoding not in ENCODINGS:
        raise ProtocolError("out_of_range", f"encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
    width = _int(header, "width", 1, limits.max_width)
    height = _int(header, "height", 1, limits.max_height)
    declared = cameras.formats.get(camera)
    if declared is not None:
        declared.check(cameras.name(camera), encoding, width, height)
    if encoding == "jpeg":
        _int(header, "stride", 0, 0)
        data = bytes(payload)
        try:
            inspect_jpeg(data, width, height, limits.max_jpeg_ratio)
        except JpegSizeError as e:
            raise ProtocolError("payload_size", str(e)) from None
        except JpegError as e:
            raise ProtocolError("jpeg_decode", f"jpeg {e}") from None
        return WireFrame(camera, frame_id, t_sof, t_eof, encoding, None, nbytes, data, width, height)
    row = width * CHANNELS
    stride = _int(header, "stride", row, row + MAX_ROW_PADDING)
    if payload.nbytes != stride * height:
        raise ProtocolError(
            "payload_size",
            f"{encoding} payload is {payload.nbytes} bytes, expected stride*height = "
            f"{stride}*{height} = {stride * height}",
        )
    rows = np.frombuffer(payload, np.uint8).reshape(height, stride)[:, :row].reshape(height, width, 3)
    image = np.ascontiguousarray(rows if encoding == "rgb8" else rows[:, :, ::-1])
    return WireFrame(camera, frame_id, t_sof, t_eof, encoding, image, nbytes)


def _decode_ego(header: dict[str, Any]) -> EgoPose:
    t_ns = _int(header, "t_ns", 0, I64_MAX)
    xyz = _floats(header, "xyz", 3, MAX_POSITION_M)
    quat = _floats(header, "quat_xyzw", 4, 2.0)
    norm = float(np.linalg.norm(quat))
    if abs(norm - 1.0) > QUAT_NORM_TOLERANCE:
        raise ProtocolError(
            "out_of_range", f"quat_xyzw has norm {norm:.6g}, expected 1 ± {QUAT_NORM_TOLERANCE}"
        )
    velocity = _floats(header, "velocity", 3, MAX_SPEED_MPS) if "velocity" in header else None
    return EgoPose(t_ns, xyz, quat / norm, velocity)


def _int(header: Mapping[str, Any], name: str, lo: int, hi: int) -> int:
    value = header[name]
    if type(value) is not int:  # bool is an int subclass: rejected too
        raise ProtocolError("wrong_type", f"field {name!r} must be an int, got {_kind(value)}")
    if not lo <= value <= hi:
        raise ProtocolError("out_of_range", f"field {name!r} = {value} is outside [{lo}, {hi}]")
    return value


def _floats(header: Mapping[str, Any], name: str, n: int, bound: float) -> np.ndarray:
    value = header[name]
    if not isinstance(value, list) or len(value) != n:
        raise ProtocolError(
            "wrong_type", f"field {name!r} must be an array of {n} numbers, got {_kind(value)}"
        )
    if not all(type(x) in (int, float) for x in value):
        raise ProtocolError(
            "wrong_type", f"field {name!r} must hold numbers, got {[_kind(x) for x in value]}"
        )
    out = np.array(value, dtype=np.float64)
    if not np.isfinite(out).all():
        raise ProtocolError("non_finite", f"field {name!r} = {value} has NaN or infinite entries")
    if np.abs(out).max() > bound:
        raise ProtocolError("out_of_range", f"field {name!r} = {value} exceeds ±{bound:g}")
    return out


def _kind(value: object) -> str:
    return "nil" if value is None else type(value).__name__


# ------------------------------------------------------------------------------------------------ control

CONTROL_COMMANDS = ("status", "reset", "shutdown")
MAX_CONTROL_BYTES = 4096  # the largest control frame (ZMQ_MAXMSGSIZE of the control socket)
# Frames a REQ or DEALER client puts before its request map: a REQ with ZMQ_REQ_CORRELATE (`ControlClient`)
# sends a request id and the empty delimiter, a plain REQ the delimiter, a DEALER none or the delimiter.
MAX_ROUTING_FRAMES = 2
# The most frames of a control request as the node's ROUTER reads it: the peer's routing id (the ROUTER
# prepends it), the routing frames, the request map.
CONTROL_REQUEST_FRAMES = 1 + MAX_ROUTING_FRAMES + 1


# ----------------------------------------------------------------------------------------------- encoding


def encode_frame(
    camera: int | str,
    frame_id: int,
    t_sof_ns: int,
    t_eof_ns: int,
    image: np.ndarray | bytes,
    encoding: str = "rgb8",
    width: int | None = None,
    height: int | None = None,
) -> bytearray:
    """One frame message. image: [H, W, 3] uint8 for rgb8/bgr8 (sent unpadded, stride = 3W), or the JPEG
    bytes with `width`/`height` given."""
    if encoding == "jpeg":
        if width is None or height is None:
            raise ValueError("encode_frame: a jpeg payload needs width and height")
        payload, stride = memoryview(bytes(image)), 0
    else:
        arr = np.ascontiguousarray(image, dtype=np.uint8)
        if arr.ndim != 3 or arr.shape[2] != CHANNELS:
            raise ValueError(f"encode_frame: image must be [H, W, 3] uint8, got shape {list(arr.shape)}")
        height, width = arr.shape[:2]
        payload, stride = memoryview(arr).cast("B"), width * CHANNELS
    header = {
        "v": PROTOCOL_VERSION,
        "kind": "frame",
        "camera": camera,
        "frame_id": frame_id,
        "t_sof_ns": t_sof_ns,
        "t_eof_ns": t_eof_ns,
        "encoding": encoding,
        "width": width,
        "height": height,
        "stride": stride,
    }
    return join_message(header, payload)


def encode_ego(
    t_ns: int, xyz: Sequence[float], quat_xyzw: Sequence[float], velocity: Sequence[float] | None = None
) -> bytearray:
    """One ego pose message (world frame, metres, unit quaternion x, y, z, w; velocity m/s, optional)."""
    header: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "kind": "ego",
        "t_ns": t_ns,
        "xyz": [float(v) for v in xyz],
        "quat_xyzw": [float(v) for v in quat_xyzw],
    }
    if velocity is not None:
        header["velocity"] = [float(v) for v in velocity]
    return join_message(header, memoryview(b""))


def join_message(header: Mapping[str, Any], payload: memoryview) -> bytearray:
    """Header map and payload in one buffer, with a single copy of the payload."""
    head = msgpack.packb(dict(header), use_bin_type=True)
    out = bytearray(len(head) + payload.nbytes)
    out[: len(head)] = head
    out[len(head) :] = payload
    return out


# ------------------------------------------------------------------------------------------------- output


@dataclass
class CameraWindow:
    """The frames one prediction used from one camera, oldest first (4 at 10 Hz)."""

    name: str
    index: int
    frame_ids: list[int]
    t_sof_ns: list[int]


@dataclass
class TrajectoryMessage:
    """The node's output, one per prediction (or per tick while inputs are stale: valid=False, no trajectory).

    Waypoints are in the t0 ego frame (x forward, y left, z up; metres), t in seconds after t0, heading in
    radians (yaw, counter-clockwise from x). Times `*_ns` are the sensors' clock; `*_ms` durations are measured
    on the node's monotonic clock.
    """

    seq: int
    t0_ns: int | None
    valid: bool
    invalid_reasons: list[str]
    cameras: list[CameraWindow] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    t: list[float] = field(default_factory=list)
    x: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)
    z: list[float] = field(default_factory=list)
    heading: list[float] = field(default_factory=list)
    reasoning: str = ""
    decoder: str = ""  # "expert" or "tokens": what decoded the trajectory ("" when there is none)
    frame_age_ms: float | None = None
    frame_drop_perc: float = 0.0
    model_execution_ms: float | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": TRAJECTORY_VERSION,
            "kind": "trajectory",
            "seq": self.seq,
            "t0_ns": self.t0_ns,
            "valid": self.valid,
            "invalid_reasons": list(self.invalid_reasons),
            "cameras": [
                {"name": c.name, "index": c.index, "frame_ids": c.frame_ids, "t_sof_ns": c.t_sof_ns}
                for c in self.cameras
            ],
            "token_ids": list(self.token_ids),
            "waypoints": {"t": self.t, "x": self.x, "y": self.y, "z": self.z, "heading": self.heading},
            "reasoning": self.reasoning,
            "decoder": self.decoder,
            "frame_age_ms": self.frame_age_ms,
            "frame_drop_perc": self.frame_drop_perc,
            "model_execution_ms": self.model_execution_ms,
            "timings_ms": dict(self.timings_ms),
        }


OUTPUT_FIELDS = tuple(TrajectoryMessage(0, None, False, []).to_dict())
WAYPOINT_FIELDS = ("t", "x", "y", "z", "heading")
MAX_OUTPUT_BYTES = 1 << 20  # 64 waypoints, 128 tokens and a reasoning sentence pack to about 4 KiB


def encode_trajectory(message: TrajectoryMessage) -> bytes:
    return msgpack.packb(message.to_dict(), use_bin_type=True)


def decode_trajectory(buf: bytes | memoryview) -> TrajectoryMessage:
    """Parse an output message (for consumers); raises ProtocolError on anything that is not a v2 trajectory."""
    if len(buf) > MAX_OUTPUT_BYTES:
        raise ProtocolError("too_large", f"trajectory message is {len(buf)} bytes, limit {MAX_OUTPUT_BYTES}")
    try:
        d = msgpack.unpackb(buf, raw=False, strict_map_key=True, max_array_len=4096, max_map_len=64)
    except (ValueError, TypeError) as e:
        raise ProtocolError("malformed", f"trajectory message is not valid msgpack: {e}") from None
    if not isinstance(d, dict) or d.get("kind") != "trajectory":
        raise ProtocolError("malformed", "not a trajectory message (a map with kind 'trajectory')")
    _check_fields(d, dict.fromkeys(OUTPUT_FIELDS, True), "trajectory")
    if d["v"] != TRAJECTORY_VERSION:
        raise ProtocolError(
            "version",
            f"trajectory message version {d['v']} is not supported (supported: {TRAJECTORY_VERSION})",
        )
    waypoints = d["waypoints"]
    if not isinstance(waypoints, dict) or set(waypoints) != set(WAYPOINT_FIELDS):
        raise ProtocolError("wrong_type", f"waypoints must be a map with keys {', '.join(WAYPOINT_FIELDS)}")
    lengths = {len(waypoints[k]) for k in WAYPOINT_FIELDS}
    if len(lengths) != 1:
        raise ProtocolError("payload_size", f"waypoint arrays differ in length: {sorted(lengths)}")
    try:
        return TrajectoryMessage(
            seq=d["seq"],
            t0_ns=d["t0_ns"],
            valid=bool(d["valid"]),
            invalid_reasons=list(d["invalid_reasons"]),
            cameras=[CameraWindow(**c) for c in d["cameras"]],
            token_ids=list(d["token_ids"]),
            reasoning=d["reasoning"],
            decoder=d["decoder"],
            frame_age_ms=d["frame_age_ms"],
            frame_drop_perc=d["frame_drop_perc"],
            model_execution_ms=d["model_execution_ms"],
            timings_ms=dict(d["timings_ms"]),
            **{k: [float(v) for v in waypoints[k]] for k in WAYPOINT_FIELDS},
        )
    except (TypeError, ValueError) as e:
        raise ProtocolError("wrong_type", f"trajectory message has a mistyped field: {e}") from None
