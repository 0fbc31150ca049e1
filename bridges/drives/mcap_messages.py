"""The message schemas recordings use, and their codecs for both MCAP encodings Foxglove reads.

Messages are plain dicts in Foxglove's JSON layout whatever the wire encoding:
  * timestamps `{"sec": int, "nsec": int}` (nanoseconds split, as Foxglove's JSON schemas spell them);
  * byte fields (`data` of images) as `bytes` (base64 only on the JSON wire);
  * enums as ints; vectors `{"x", "y", "z"}`; quaternions `{"x", "y", "z", "w"}`.

Foxglove schemas (`foxglove.*`) are written in protobuf (the compiled `foxglove-schemas-protobuf` classes) or
JSON; they are read in either encoding from any producer, because protobuf messages are decoded with the
descriptor set embedded in the file. The project's own schemas (`alpamayo.*`) are JSON only; `docs/recordings.md`
documents every field.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any

from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from foxglove_schemas_protobuf.FrameTransform_pb2 import FrameTransform
from foxglove_schemas_protobuf.Log_pb2 import Log
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from foxglove_schemas_protobuf.PosesInFrame_pb2 import PosesInFrame
from foxglove_schemas_protobuf.RawImage_pb2 import RawImage
from mcap.records import Schema
from mcap.writer import Writer
from mcap_protobuf.decoder import DecoderFactory
from mcap_protobuf.schema import build_file_descriptor_set

ENCODINGS = ("protobuf", "json")
LOG_LEVEL_INFO = 2  # foxglove.Log.Level: UNKNOWN 0, DEBUG 1, INFO 2, WARNING 3, ERROR 4, FATAL 5

_PROTOBUF_CLASSES = {
    cls.DESCRIPTOR.full_name: cls
    for cls in (CompressedImage, RawImage, PoseInFrame, PosesInFrame, Log, FrameTransform)
}


class MessageError(ValueError):
    """A message cannot be encoded or decoded (unknown schema or encoding, malformed payload)."""


def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


_NUM = {"type": "number"}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_BYTES = {"type": "string", "contentEncoding": "base64"}
_TIME = _obj({"sec": {"type": "integer", "minimum": 0}, "nsec": {"type": "integer", "minimum": 0}})
_VEC3 = _obj({"x": _NUM, "y": _NUM, "z": _NUM})
_QUAT = _obj({"x": _NUM, "y": _NUM, "z": _NUM, "w": _NUM})
_POSE = _obj({"position": _VEC3, "orientation": _QUAT})
_FLOATS = {"type": "array", "items": _NUM}
_INTS = {"type": "array", "items": _INT}

JSON_SCHEMAS: dict[str, dict[str, Any]] = {
    "foxglove.CompressedImage": _obj(
        {"timestamp": _TIME, "frame_id": _STR, "data": _BYTES, "format": _STR},
        ("timestamp", "data", "format"),
    ),
    "foxglove.RawImage": _obj(
        {
            "timestamp": _TIME,
            "frame_id": _STR,
            "width": _INT,
            "height": _INT,
            "encoding": _STR,
            "step": _INT,
            "data": _BYTES,
        },
        ("timestamp", "width", "height", "encoding", "step", "data"),
    ),
    "foxglove.PoseInFrame": _obj(
        {"timestamp": _TIME, "frame_id": _STR, "pose": _POSE}, ("timestamp", "pose")
    ),
    "foxglove.PosesInFrame": _obj(
        {"timestamp": _TIME, "frame_id": _STR, "poses": {"type": "array", "items": _POSE}},
        ("timestamp", "poses"),
    ),
    "foxglove.Log": _obj(
        {
            "timestamp": _TIME,
            "level": {"type": "integer", "minimum": 0, "maximum": 5},
            "message": _STR,
            "name": _STR,
            "file": _STR,
            "line": _INT,
        },
        ("timestamp", "level", "message"),
    ),
    "foxglove.FrameTransform": _obj(
        {
            "timestamp": _TIME,
            "parent_frame_id": _STR,
            "child_frame_id": _STR,
            "translation": _VEC3,
            "rotation": _QUAT,
        },
        ("timestamp", "parent_frame_id", "child_frame_id", "translation", "rotation"),
    ),
    "alpamayo.Prediction": _obj(
        {
            "seq": _INT,
            "t0_ns": _INT,
            "frame_times_ns": {"type": "object", "additionalProperties": _INTS},
            "valid": {"type": "boolean"},
            "invalid_reasons": {"type": "array", "items": _STR},
            "t_s": _FLOATS,
            "decoder": {"enum": ["expert", "tokens"]},
            "route": {"type": ["string", "null"]},
            "flow": {
                "type": ["object", "null"],
                "properties": {"steps": _INT, "temperature": _NUM, "guidance": {"type": ["number", "null"]}},
            },
            "samples": {
                "type": "array",
                "items": _obj(
                    {
                        "reasoning": _STR,
                        "reasoning_token_ids": _INTS,
                        "reasoning_capped": {"type": "boolean"},
                        "token_ids": _INTS,
                        "x": _FLOATS,
                        "y": _FLOATS,
                        "z": _FLOATS,
                        "heading": _FLOATS,
                        "accel": _FLOATS,
                        "curvature": _FLOATS,
                    }
                ),
            },
            "errors_m": {"type": ["object", "null"], "additionalProperties": _NUM},
        },
        ("seq", "t0_ns", "frame_times_ns", "valid", "t_s", "samples"),
    ),
    "alpamayo.Timings": _obj(
        {
            "seq": _INT,
            "t0_ns": _INT,
            "stages_ms": {"type": "object", "additionalProperties": _NUM},
            "e2e_age_ms": _NUM,
        },
        ("seq", "t0_ns", "stages_ms"),
    ),
}
for _name, _schema in JSON_SCHEMAS.items():
    _schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    _schema["title"] = _name

# Top-level fields carried as base64 on the JSON wire and as bytes everywhere else.
_BYTES_FIELDS = {
    name: tuple(k for k, v in schema["properties"].items() if v.get("contentEncoding") == "base64")
    for name, schema in JSON_SCHEMAS.items()
}


def encodings_for(schema_name: str) -> tuple[str, ...]:
    """The encodings a schema can be written in."""
    if schema_name not in JSON_SCHEMAS:
        raise MessageError(f"unknown schema {schema_name!r}; known: {sorted(JSON_SCHEMAS)}")
    return ENCODINGS if schema_name in _PROTOBUF_CLASSES else ("json",)


def wire_encoding(schema_name: str, preferred: str) -> str:
    """`preferred` when `schema_name` can be written in it, else "json" (the project's schemas are JSON only)."""
    return preferred if preferred in encodings_for(schema_name) else "json"


def _check_encoding(schema_name: str, encoding: str) -> None:
    if encoding not in encodings_for(schema_name):
        raise MessageError(
            f"schema {schema_name!r} cannot be written as {encoding!r}; allowed: {encodings_for(schema_name)}"
        )


def register_schema(writer: Writer, schema_name: str, encoding: str) -> int:
    """Register `schema_name` in `encoding` with an MCAP writer; returns the schema id."""
    _check_encoding(schema_name, encoding)
    if encoding == "protobuf":
        fds = build_file_descriptor_set(_PROTOBUF_CLASSES[schema_name])
        return writer.register_schema(schema_name, "protobuf", fds.SerializeToString())
    data = json.dumps(JSON_SCHEMAS[schema_name], sort_keys=True).encode()
    return writer.register_schema(schema_name, "jsonschema", data)


def _to_protobuf_fields(value: Any) -> Any:
    if isinstance(value, dict):
        if value.keys() == {"sec", "nsec"}:
            return {"seconds": value["sec"], "nanos": value["nsec"]}
        return {k: _to_protobuf_fields(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_protobuf_fields(v) for v in value]
    return value


def encode(schema_name: str, message: dict[str, Any], encoding: str) -> bytes:
    """Serialise a message dict (Foxglove JSON layout, bytes as bytes) as `encoding`.

    JSON is written with sorted keys and no whitespace, so equal messages give equal bytes (lock-step replay
    compares outputs byte for byte).
    """
    _check_encoding(schema_name, encoding)
    if encoding == "protobuf":
        return _PROTOBUF_CLASSES[schema_name](**_to_protobuf_fields(message)).SerializeToString()
    wire = dict(message)
    for key in _BYTES_FIELDS[schema_name]:
        if key in wire:
            wire[key] = base64.b64encode(wire[key]).decode("ascii")
    return json.dumps(wire, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _from_protobuf(message: Any) -> Any:
    name = message.DESCRIPTOR.full_name
    if name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        return {"sec": message.seconds, "nsec": message.nanos}
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is None:
            out[field.name] = list(value) if field.is_repeated else value
        elif field.is_repeated:
            out[field.name] = [_from_protobuf(v) for v in value]
        else:
            out[field.name] = _from_protobuf(value)
    return out


class MessageDecoder:
    """Decodes MCAP messages of any known schema, JSON or protobuf, into message dicts."""

    def __init__(self) -> None:
        self._protobuf = DecoderFactory()
        self._decoders: dict[int, Callable[[bytes], dict[str, Any]]] = {}

    def decode(self, schema: Schema | None, message_encoding: str, data: bytes) -> dict[str, Any]:
        """The message dict of one MCAP message; MessageError for an unknown schema or a payload that does
        not decode."""
        if schema is None or schema.name not in JSON_SCHEMAS:
            name = None if schema is None else schema.name
            raise MessageError(f"schema {name!r} is not one replay reads; known: {sorted(JSON_SCHEMAS)}")
        decoder = self._decoders.get(schema.id)
        if decoder is None:
            decoder = self._decoder_for(schema, message_encoding)
            self._decoders[schema.id] = decoder
        try:
            return decoder(data)
        except MessageError:
            raise
        except Exception as e:  # the protobuf and json parsers raise several unrelated types
            raise MessageError(f"{schema.name} message ({message_encoding}) does not decode: {e}") from e

    def _decoder_for(self, schema: Schema, message_encoding: str) -> Callable[[bytes], dict[str, Any]]:
        if message_encoding == "json":
            return lambda data: _from_json(schema.name, data)
        if message_encoding == "protobuf":
            parse = self._protobuf.decoder_for(message_encoding, schema)
            if parse is not None:
                return lambda data: _from_protobuf(parse(data))
        raise MessageError(
            f"schema {schema.name!r}: message encoding {message_encoding!r} with schema encoding "
            f"{schema.encoding!r} is not supported; allowed: json with jsonschema, protobuf with protobuf"
        )


def _from_json(schema_name: str, data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict):
        raise MessageError(f"{schema_name} JSON message is a {type(message).__name__}, expected an object")
    for key in _BYTES_FIELDS[schema_name]:
        if key in message:
            message[key] = base64.b64decode(message[key], validate=True)
    return message


def timestamp(t_ns: int) -> dict[str, int]:
    """Foxglove timestamp dict of an integer nanosecond time."""
    if t_ns < 0:
        raise MessageError(f"timestamp {t_ns} ns is negative; Foxglove times are unsigned")
    return {"sec": t_ns // 1_000_000_000, "nsec": t_ns % 1_000_000_000}


def timestamp_ns(stamp: dict[str, int]) -> int:
    """Integer nanoseconds of a Foxglove timestamp dict."""
    return int(stamp.get("sec", 0)) * 1_000_000_000 + int(stamp.get("nsec", 0))


def pose(xyz: Sequence[float], quat_xyzw: Sequence[float]) -> dict[str, dict[str, float]]:
    """Foxglove Pose dict: position xyz [3] metres, orientation quat_xyzw [4] (x, y, z, w); ROS 2's
    geometry_msgs/Pose has the same fields (`alpamayo.replay.ros2_outputs` writes it as CDR)."""
    x, y, z = (float(v) for v in xyz)
    qx, qy, qz, qw = (float(v) for v in quat_xyzw)
    return {"position": {"x": x, "y": y, "z": z}, "orientation": {"x": qx, "y": qy, "z": qz, "w": qw}}
