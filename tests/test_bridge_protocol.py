"""The node's wire protocol: each documented field round-trips, each bad input gets its precise rejection."""

from __future__ import annotations

import io

import msgpack
import numpy as np
import pytest
from PIL import Image

from bridges.wire.jpeg import decode_jpeg
from bridges.wire.protocol import (
    MAX_HEADER_BYTES,
    MAX_OUTPUT_BYTES,
    CameraTable,
    EgoPose,
    Limits,
    ProtocolError,
    TrajectoryMessage,
    WireFrame,
    decode_message,
    decode_trajectory,
    encode_ego,
    encode_frame,
    encode_trajectory,
    join_message,
)
from tests.protocol_doc import FULL_TRAJECTORY

CAMERAS = CameraTable({"front": 1, "left": 0})
LIMITS = Limits(max_width=320, max_height=200)
RNG = np.random.default_rng(0)
IMAGE = RNG.integers(0, 256, (24, 40, 3), dtype=np.uint8)


def jpeg(image: np.ndarray, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).convert(mode).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def frame_header(**overrides) -> dict:
    header = {
        "v": 1,
        "kind": "frame",
        "camera": "front",
        "frame_id": 7,
        "t_sof_ns": 1_000_000,
        "t_eof_ns": 1_500_000,
        "encoding": "rgb8",
        "width": 40,
        "height": 24,
        "stride": 120,
    }
    header.update(overrides)
    return header


def raw(header: dict, payload: bytes = IMAGE.tobytes()) -> bytes:
    return bytes(join_message(header, memoryview(payload)))


def rejection(message: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_message(message, LIMITS, CAMERAS)
    return info.value


def test_rgb8_frame_round_trips_by_name_and_index():
    for camera in ("front", 1):
        frame = decode_message(encode_frame(camera, 7, 10, 20, IMAGE), LIMITS, CAMERAS)
        assert isinstance(frame, WireFrame)
        assert (frame.camera, frame.frame_id, frame.t_sof_ns, frame.t_eof_ns) == (1, 7, 10, 20)
        assert frame.image.dtype == np.uint8 and frame.image.flags.c_contiguous
        np.testing.assert_array_equal(frame.image, IMAGE)


def test_bgr8_frame_is_converted_to_rgb():
    frame = decode_message(encode_frame("left", 0, 10, 20, IMAGE[:, :, ::-1], "bgr8"), LIMITS, CAMERAS)
    np.testing.assert_array_equal(frame.image, IMAGE)


def test_padded_stride_rows_are_cropped():
    stride = 40 * 3 + 8
    padded = np.zeros((24, stride), np.uint8)
    padded[:, :120] = IMAGE.reshape(24, 120)
    padded[:, 120:] = 255
    frame = decode_message(raw(frame_header(stride=stride), padded.tobytes()), LIMITS, CAMERAS)
    np.testing.assert_array_equal(frame.image, IMAGE)


def test_jpeg_frame_is_kept_compressed_and_decodes_to_the_pillow_image():
    data = jpeg(IMAGE)
    frame = decode_message(encode_frame("front", 1, 10, 20, data, "jpeg", 40, 24), LIMITS, CAMERAS)
    assert frame.image is None and frame.jpeg == data and (frame.width, frame.height) == (40, 24)
    assert frame.held_bytes == len(data)
    np.testing.assert_array_equal(decode_jpeg(data), np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def test_ego_pose_round_trips_and_quaternion_is_renormalised():
    pose = decode_message(
        encode_ego(5, [1.0, -2.0, 3], [0.0, 0.0, 0.0, 1.005], [10.0, 0.5, 0.0]), LIMITS, CAMERAS
    )
    assert isinstance(pose, EgoPose)
    assert pose.t_ns == 5
    np.testing.assert_array_equal(pose.xyz, [1.0, -2.0, 3.0])
    np.testing.assert_allclose(pose.quat_xyzw, [0, 0, 0, 1])
    np.testing.assert_array_equal(pose.velocity, [10.0, 0.5, 0.0])
    assert decode_message(encode_ego(5, [0, 0, 0], [0, 0, 0, 1]), LIMITS, CAMERAS).velocity is None


BAD_FRAMES = [
    # (header overrides or None to delete, payload, reason, message fragment)
    ({"v": 2}, None, "version", "protocol version 2 is not supported (supported: 1)"),
    ({"kind": "lidar"}, None, "out_of_range", "kind 'lidar' is not one of: frame, ego"),
    ({"kind": 3}, None, "wrong_type", "field 'kind' must be a str, got int"),
    (
        {"camera": "rear"},
        None,
        "unknown_camera",
        "camera 'rear' is not configured (known: 'front'=1, 'left'=0)",
    ),
    ({"camera": 5}, None, "unknown_camera", "camera 5 is not configured"),
    ({"camera": 1.0}, None, "wrong_type", "field 'camera' must be an int or str, got float"),
    ({"frame_id": 2**32}, None, "out_of_range", "field 'frame_id' = 4294967296 is outside [0, 4294967295]"),
    ({"frame_id": -1}, None, "out_of_range", "field 'frame_id' = -1 is outside [0, 4294967295]"),
    ({"frame_id": True}, None, "wrong_type", "field 'frame_id' must be an int, got bool"),
    ({"frame_id": "7"}, None, "wrong_type", "field 'frame_id' must be an int, got str"),
    (
        {"t_eof_ns": 999_999},
        None,
        "out_of_range",
        "field 't_eof_ns' = 999999 is outside [1000000, 1001000000]",
    ),
    ({"encoding": "yuv420"}, None, "out_of_range", "encoding 'yuv420' is not one of rgb8, bgr8, jpeg"),
    ({"width": 321}, None, "out_of_range", "field 'width' = 321 is outside [1, 320]"),
    ({"height": 0}, None, "out_of_range", "field 'height' = 0 is outside [1, 200]"),
    ({"stride": 119}, None, "out_of_range", "field 'stride' = 119 is outside [120, 1144]"),
    (
        {},
        IMAGE.tobytes()[:-1],
        "payload_size",
        "rgb8 payload is 2879 bytes, expected stride*height = 120*24 = 2880",
    ),
    ({"extra": 1}, None, "extra_field", "frame header has unknown field(s) 'extra'"),
    ({"stride": None}, None, "missing_field", "frame header lacks field(s) stride"),
    ({"kind": None}, None, "missing_field", "header lacks field 'kind'"),
]


@pytest.mark.parametrize(("overrides", "payload", "reason", "fragment"), BAD_FRAMES)
def test_bad_frame_headers_are_rejected_with_the_value_and_range(overrides, payload, reason, fragment):
    header = frame_header(**{k: v for k, v in overrides.items() if v is not None})
    for key in [k for k, v in overrides.items() if v is None]:
        del header[key]
    error = rejection(raw(header, IMAGE.tobytes() if payload is None else payload))
    assert error.reason == reason
    assert fragment in str(error)


@pytest.mark.parametrize(
    ("message", "reason", "fragment"),
    [
        (b"", "malformed", "no complete msgpack header in the first 0 bytes"),
        (b"\xc1" + bytes(10), "malformed", "header is not valid msgpack"),
        (msgpack.packb([1, 2, 3]), "malformed", "header must be a msgpack map, got list"),
        (msgpack.packb({1: 2}, strict_types=False), "malformed", "not valid msgpack"),
        (msgpack.packb({"kind": "ego", "v": 1, "x": "a" * 2000}), "malformed", "first 1024 bytes"),
        (msgpack.packb({"kind": "ego", "v": 1, "t_ns": 1, "xyz": [0] * 17}), "malformed", "max_array_len"),
    ],
)
def test_malformed_headers_are_rejected(message, reason, fragment):
    error = rejection(message)
    assert (error.reason, fragment in str(error)) == (reason, True), str(error)


def test_messages_over_the_limit_are_rejected_before_parsing():
    error = rejection(bytes(LIMITS.max_message_bytes + 1))
    assert error.reason == "too_large"
    assert f"{LIMITS.max_message_bytes + 1} bytes, limit {LIMITS.max_message_bytes} bytes" in str(error)
    assert LIMITS.max_message_bytes == MAX_HEADER_BYTES + 200 * (320 * 3 + 1024)


@pytest.mark.parametrize(
    ("mutate", "reason", "fragment"),
    [
        (lambda d: d[:-20], "jpeg_decode", "jpeg truncated: entropy-coded data runs to the end"),
        (lambda d: b"\x00\x00" + d[2:], "jpeg_decode", "does not start with the JPEG SOI marker"),
        (lambda d: d[:2] + bytes(len(d) - 2), "jpeg_decode", "jpeg damaged: byte 2 is 0x00 where a marker"),
        (lambda d: d + b"\x00" * 7, "jpeg_decode", "jpeg damaged: 7 bytes after the end-of-image marker"),
        (lambda d: d[:-2], "jpeg_decode", "jpeg truncated"),
    ],
)
def test_jpegs_that_fail_to_decode_are_rejected(mutate, reason, fragment):
    error = rejection(encode_frame("front", 1, 10, 20, mutate(jpeg(IMAGE)), "jpeg", 40, 24))
    assert error.reason == reason and fragment in str(error)


def test_jpeg_size_mode_and_stride_must_match_the_header():
    error = rejection(encode_frame("front", 1, 10, 20, jpeg(IMAGE), "jpeg", 40, 20))
    assert (error.reason, str(error)) == ("payload_size", "jpeg is 40x24, header says 40x20")
    error = rejection(encode_frame("front", 1, 10, 20, jpeg(IMAGE, "L"), "jpeg", 40, 24))
    assert (error.reason, str(error)) == (
        "jpeg_decode",
        "jpeg has 1 colour component(s), expected 3 (YCbCr, decoded to RGB)",
    )
    error = rejection(raw(frame_header(encoding="jpeg", stride=120), jpeg(IMAGE)))
    assert (error.reason, str(error)) == ("out_of_range", "field 'stride' = 120 is outside [0, 0]")


@pytest.mark.parametrize(
    ("fields", "reason", "fragment"),
    [
        (
            {"xyz": [float("nan"), 0.0, 0.0]},
            "non_finite",
            "field 'xyz' = [nan, 0.0, 0.0] has NaN or infinite",
        ),
        ({"quat_xyzw": [0.0, 0.0, float("inf"), 1.0]}, "non_finite", "field 'quat_xyzw'"),
        ({"velocity": [0.0, float("nan"), 0.0]}, "non_finite", "field 'velocity'"),
        ({"quat_xyzw": [0.0, 0.0, 0.0, 0.5]}, "out_of_range", "quat_xyzw has norm 0.5, expected 1 ± 0.01"),
        ({"xyz": [2e8, 0.0, 0.0]}, "out_of_range", "field 'xyz' = [200000000.0, 0.0, 0.0] exceeds ±1e+08"),
        ({"velocity": [200.0, 0.0, 0.0]}, "out_of_range", "exceeds ±150"),
        ({"xyz": [0.0, 0.0]}, "wrong_type", "field 'xyz' must be an array of 3 numbers, got list"),
        (
            {"xyz": [0.0, "1", 0.0]},
            "wrong_type",
            "field 'xyz' must hold numbers, got ['float', 'str', 'float']",
        ),
        ({"t_ns": -5}, "out_of_range", "field 't_ns' = -5 is outside [0, 9223372036854775807]"),
        ({"odometry": 1}, "extra_field", "ego header has unknown field(s) 'odometry'"),
    ],
)
def test_bad_ego_poses_are_rejected(fields, reason, fragment):
    header = {"v": 1, "kind": "ego", "t_ns": 5, "xyz": [0.0, 0.0, 0.0], "quat_xyzw": [0.0, 0.0, 0.0, 1.0]}
    header.update(fields)
    error = rejection(raw(header, b""))
    assert (error.reason, fragment in str(error)) == (reason, True), str(error)


def test_ego_message_with_a_payload_is_rejected():
    error = rejection(bytes(encode_ego(5, [0, 0, 0], [0, 0, 0, 1])) + b"x")
    assert (error.reason, str(error)) == ("payload_size", "an ego message carries no payload, got 1 bytes")


def test_trajectory_message_round_trips():
    msg = FULL_TRAJECTORY
    assert decode_trajectory(encode_trajectory(msg)) == msg
    invalid = TrajectoryMessage(seq=4, t0_ns=None, valid=False, invalid_reasons=["ego: stale"])
    assert decode_trajectory(encode_trajectory(invalid)) == invalid


def test_trajectory_decoder_rejects_foreign_and_oversized_messages():
    assert rejection_of_output(msgpack.packb({"kind": "frame"})).reason == "malformed"
    assert rejection_of_output(bytes(MAX_OUTPUT_BYTES + 1)).reason == "too_large"
    d = TrajectoryMessage(0, 1, True, [], x=[1.0]).to_dict()
    assert rejection_of_output(msgpack.packb(d)).reason == "payload_size"


def rejection_of_output(data: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_trajectory(data)
    return info.value
