"""Recorded drives in MCAP: message codecs, synthetic drives, tick assembly, and damaged recordings."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader
from mcap.writer import Writer

from alpamayo.demo_drive import START_NS, make_demo_drive
from alpamayo.demo_drive.world import World
from alpamayo.prediction import FUTURE_STEPS, HISTORY_STEPS
from alpamayo.replay.ticks import TickAssembler
from bridges.drives import mcap_messages
from bridges.drives.mcap import Drive
from bridges.drives.recording import FrameError, RecordingError, RecordingLayout, default_layout

SIZE = (72, 128)


def small_drive(path: Path, **kwargs) -> Path:
    settings = {"seconds": 2.2, "cameras": 2, "seed": 3, "size": SIZE, **kwargs}
    return make_demo_drive(path, **settings).path


@pytest.fixture(scope="module")
def drive_path(tmp_path_factory) -> Path:
    return small_drive(tmp_path_factory.mktemp("drive") / "drive.mcap")


@pytest.fixture(scope="module")
def json_drive_path(tmp_path_factory) -> Path:
    return small_drive(tmp_path_factory.mktemp("drive") / "drive_json.mcap", encoding="json")


def rewrite(src: Path, dst: Path, edit=lambda topic, message: message, chunk_size: int = 1 << 20) -> Path:
    """Copy an MCAP file message by message; edit(topic, decoded dict) returns the dict to write (or None to
    drop the message). Decoded dicts are re-encoded in the channel's encoding."""
    decoder = mcap_messages.MessageDecoder()
    with open(src, "rb") as f, open(dst, "wb") as out:
        reader = make_reader(f)
        writer = Writer(out, chunk_size=chunk_size)
        writer.start()
        for record in reader.iter_metadata():
            writer.add_metadata(record.name, record.metadata)
        channels = {}
        for schema, channel, message in reader.iter_messages(log_time_order=False):
            if channel.id not in channels:
                sid = writer.register_schema(schema.name, schema.encoding, schema.data)
                channels[channel.id] = writer.register_channel(channel.topic, channel.message_encoding, sid)
            decoded = edit(channel.topic, decoder.decode(schema, channel.message_encoding, message.data))
            if decoded is not None:
                data = mcap_messages.encode(schema.name, decoded, channel.message_encoding)
                writer.add_message(channels[channel.id], message.log_time, data, message.publish_time)
        writer.finish()
    return dst


@pytest.mark.parametrize("encoding", mcap_messages.ENCODINGS)
def test_foxglove_messages_round_trip_through_mcap_in_both_encodings(encoding):
    messages = {
        "foxglove.CompressedImage": {
            "timestamp": mcap_messages.timestamp(START_NS + 7),
            "frame_id": "camera_front_wide_120fov",
            "data": bytes(range(256)),
            "format": "jpeg",
        },
        "foxglove.RawImage": {
            "timestamp": mcap_messages.timestamp(START_NS),
            "frame_id": "cam",
            "width": 2,
            "height": 1,
            "encoding": "rgb8",
            "step": 6,
            "data": b"\x01\x02\x03\x04\x05\x06",
        },
        "foxglove.PoseInFrame": {
            "timestamp": mcap_messages.timestamp(1),
            "frame_id": "world",
            "pose": {
                "position": {"x": 1.5, "y": -2.0, "z": 0.25},
                "orientation": {"x": 0.0, "y": 0.0, "z": 0.6, "w": 0.8},
            },
        },
        "foxglove.Log": {
            "timestamp": mcap_messages.timestamp(2),
            "level": mcap_messages.LOG_LEVEL_INFO,
            "message": "Slow down: a car ahead is braking.",
            "name": "alpamayo",
            "file": "",
            "line": 0,
        },
    }
    buf = io.BytesIO()
    writer = Writer(buf)
    writer.start()
    for name, message in messages.items():
        channel = writer.register_channel(
            name, encoding, mcap_messages.register_schema(writer, name, encoding)
        )
        writer.add_message(channel, 0, mcap_messages.encode(name, message, encoding), 0)
    writer.finish()
    buf.seek(0)
    decoder = mcap_messages.MessageDecoder()
    decoded = {
        schema.name: decoder.decode(schema, channel.message_encoding, message.data)
        for schema, channel, message in make_reader(buf).iter_messages()
    }
    assert decoded == messages


def test_project_schemas_are_json_only():
    assert mcap_messages.encodings_for("alpamayo.Prediction") == ("json",)
    with pytest.raises(mcap_messages.MessageError, match="cannot be written as 'protobuf'"):
        mcap_messages.encode("alpamayo.Timings", {}, "protobuf")


def test_demo_drive_is_deterministic_from_its_seed(tmp_path, drive_path):
    again = small_drive(tmp_path / "again.mcap")
    other = small_drive(tmp_path / "other.mcap", seed=4)
    assert again.read_bytes() == drive_path.read_bytes()
    assert other.read_bytes() != drive_path.read_bytes()


def test_demo_drive_reads_back_with_its_layout_frames_and_poses(drive_path):
    drive = Drive.open(drive_path, warn=pytest.fail)
    assert drive.info.layout_source == "alpamayo.layout metadata"
    assert [c.camera for c in drive.layout.cameras] == [1, 0]
    assert drive.info.message_counts == {
        "/cameras/camera_front_wide_120fov/compressed": 22,
        "/cameras/camera_cross_left_120fov/compressed": 22,
        "/ego/pose": 20 * (22 + 64) // 10 + 1,  # 20 Hz over 2.2 + 6.4 s, both ends
    }
    frames = list(drive.frames())
    assert [f.t_ns - START_NS for f in frames[:3]] == [0, 1_500_000, 100_000_000]
    assert frames[0].rgb().shape == (*SIZE, 3) and frames[0].rgb().dtype == np.uint8
    # The recorded poses are the world's ego path, so the recorded future is the true future.
    world = World(3, 2.2 + 6.4)
    xyz, _ = world.ego_pose((drive.poses.t_ns - START_NS) / 1e9)
    np.testing.assert_allclose(drive.poses.xyz, xyz, atol=1e-9)


def test_json_and_protobuf_drives_hold_the_same_frames(drive_path, json_drive_path):
    a, b = Drive.open(drive_path), Drive.open(json_drive_path)
    for fa, fb in zip(a.frames(), b.frames(), strict=True):
        assert (fa.camera, fa.t_ns) == (fb.camera, fb.t_ns)
        assert fa.image["data"] == fb.image["data"]
    np.testing.assert_array_equal(a.poses.quat_xyzw, b.poses.quat_xyzw)


def test_raw_image_drive_decodes_to_the_rendered_pixels(tmp_path):
    raw = Drive.open(small_drive(tmp_path / "raw.mcap", seconds=0.3, cameras=1, image_format="raw"))
    frame = next(raw.frames())
    assert frame.schema_name == "foxglove.RawImage"
    assert frame.rgb().shape == (*SIZE, 3)
    assert frame.rgb().std() > 10  # a rendered scene, not a blank image


def test_ticks_cover_the_drive_once_history_and_frames_are_complete(drive_path):
    assembler = TickAssembler(Drive.open(drive_path), warn=pytest.fail)
    ticks = list(assembler)
    # 22 frames at 10 Hz; the first tick needs 1.5 s of poses, so t0 = 1.5 .. 2.1 s.
    assert [round((t.t0_ns - START_NS) / 1e8) for t in ticks] == list(range(15, 22))
    assert assembler.not_ready == 15 and not assembler.skipped
    tick = ticks[0]
    assert tick.frame_times_ns[0] == [START_NS + k * 100_000_000 + 1_500_000 for k in range(12, 16)]
    assert tick.ego_history.xyz.shape == (HISTORY_STEPS, 3)
    assert tick.ego_history.t_ns[-1] == tick.t0_ns
    xyz, heading = tick.future
    assert xyz.shape == (FUTURE_STEPS, 3) and heading.shape == (FUTURE_STEPS,)
    # ~9-14 m/s along a gentle curve: the first waypoint is about 1 m ahead, nearly on the x axis.
    assert 0.8 < xyz[0, 0] < 1.5 and abs(xyz[0, 1]) < 0.05


def test_start_and_duration_select_a_window_of_ticks(drive_path):
    ticks = list(TickAssembler(Drive.open(drive_path), start_s=1.75, duration_s=0.3))
    assert [round((t.t0_ns - START_NS) / 1e8) for t in ticks] == [18, 19, 20]


def test_a_layout_file_maps_topics_to_cameras(tmp_path, drive_path):
    layout_file = tmp_path / "layout.yaml"
    layout_file.write_text(
        "ego_pose_topic: /ego/pose\ncameras:\n  - {topic: /cameras/camera_cross_left_120fov/compressed, camera: 0}\n"
    )
    drive = Drive.open(drive_path, RecordingLayout.load(layout_file))
    assert drive.info.layout_source == "--layout"
    assert {f.camera for f in drive.frames()} == {0}


def test_missing_topic_is_a_clear_error(tmp_path, drive_path):
    layout = default_layout((1, 6))
    with pytest.raises(
        RecordingError, match=r"lacks topic\(s\) \['/cameras/camera_front_tele_30fov/compressed'\]"
    ):
        Drive.open(drive_path, layout)


def test_a_file_that_is_not_mcap_is_a_clear_error(tmp_path):
    path = tmp_path / "drive.mcap"
    path.write_bytes(b"this is not an mcap file at all")
    with pytest.raises(RecordingError, match="not an MCAP file"):
        Drive.open(path)
    with pytest.raises(RecordingError, match="does not exist"):
        Drive.open(tmp_path / "absent.mcap")


def test_a_truncated_recording_replays_up_to_the_damage_with_a_warning(tmp_path, drive_path):
    # A recorder writing 16 kB chunks (about 5 frames each) stopped mid-chunk near the end.
    data = rewrite(drive_path, tmp_path / "chunked.mcap", chunk_size=16 << 10).read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(data[: int(len(data) * 0.85)])
    warnings: list[str] = []
    drive = Drive.open(cut, warn=warnings.append)
    assert not drive.info.indexed
    ticks = list(TickAssembler(drive, warn=warnings.append))
    assert any("truncated" in w for w in warnings)
    assert any("damaged after" in w for w in warnings)
    assert 0 < len(ticks) < 7


def test_times_that_go_backwards_are_skipped_with_a_warning(tmp_path, json_drive_path):
    topic = "/cameras/camera_cross_left_120fov/compressed"
    seen = {"n": 0}

    def edit(t, message):
        if t == topic:
            seen["n"] += 1
            if seen["n"] == 19:  # frame 18 (t = 1.8 s) is stamped before frame 17
                message["timestamp"] = mcap_messages.timestamp(START_NS + 1_650_000_000)
        return message

    warnings: list[str] = []
    drive = Drive.open(rewrite(json_drive_path, tmp_path / "back.mcap", edit), warn=warnings.append)
    ticks = list(TickAssembler(drive, warn=warnings.append))
    assert any("not after the previous one" in w and topic in w for w in warnings)
    # Ticks 1.8 .. 2.1 s need the dropped frame: each is skipped with a reason; the others are replayed.
    assert [round((t.t0_ns - START_NS) / 1e8) for t in ticks] == [15, 16, 17]
    assert sum("lacks a frame within 50 ms of one of t0 -0.3 .. 0 s" in w for w in warnings) == 4


def test_corrupt_jpeg_raises_a_frame_error_naming_the_frame(tmp_path, json_drive_path):
    def edit(topic, message):
        if topic.endswith("/compressed"):
            message["data"] = message["data"][:50]
        return message

    frame = next(Drive.open(rewrite(json_drive_path, tmp_path / "bad.mcap", edit)).frames())
    with pytest.raises(FrameError, match=f"camera 1 frame at {START_NS} ns: jpeg image does not decode"):
        frame.rgb()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("width", None, "raw image field(s) {'width': None} must be integers"),
        ("step", "384", "raw image field(s) {'step': '384'} must be integers"),
        ("encoding", ["rgb8"], "raw encoding ['rgb8'] unsupported"),
    ],
)
def test_mistyped_raw_image_fields_raise_a_frame_error_naming_the_field(tmp_path, field, value, message):
    raw = small_drive(tmp_path / "raw.mcap", seconds=0.3, cameras=1, image_format="raw", encoding="json")

    def edit(topic, image):
        if topic.endswith("/image"):
            image[field] = value
            if value is None:
                del image[field]
        return image

    frame = next(Drive.open(rewrite(raw, tmp_path / "bad.mcap", edit)).frames())
    with pytest.raises(FrameError, match=re.escape(f"camera 1 frame at {START_NS} ns: {message}")):
        frame.rgb()


def test_a_mistyped_pose_or_timestamp_is_skipped_with_a_warning(tmp_path, json_drive_path):
    poses = {"n": 0}

    def edit(topic, message):
        if topic == "/ego/pose":
            poses["n"] += 1
            if poses["n"] == 3:
                message["pose"]["position"] = {"x": "abc"}
            elif poses["n"] == 4:
                message["pose"] = "not a pose"
            elif poses["n"] == 5:
                message["timestamp"] = "yesterday"
        return message

    warnings: list[str] = []
    drive = Drive.open(rewrite(json_drive_path, tmp_path / "bad.mcap", edit), warn=warnings.append)
    assert len(drive.poses.t_ns) == Drive.open(json_drive_path).poses.t_ns.size - 3
    skipped = [w for w in warnings if "skipped the pose" in w and "its fields are not numbers" in w]
    assert len(skipped) == 2 and all(w.startswith("/ego/pose: ") for w in skipped)
    assert any(
        w.startswith("/ego/pose: ") and "timestamp 'yesterday' is not {sec, nsec}" in w for w in warnings
    )


def test_bad_layouts_name_the_offending_entry(tmp_path):
    with pytest.raises(RecordingError, match="index 9"):
        RecordingLayout.from_dict({"cameras": [{"topic": "/a", "camera": 9}]}, "test")
    with pytest.raises(RecordingError, match="indices repeat"):
        RecordingLayout.from_dict(
            {"cameras": [{"topic": "/a", "camera": 1}, {"topic": "/b", "camera": 1}]}, "t"
        )
    with pytest.raises(RecordingError, match=r"cameras\[0\] needs 'topic'"):
        RecordingLayout.from_dict({"cameras": [{"camera": 1}]}, "t")
    bad = tmp_path / "layout.yaml"
    bad.write_text(json.dumps({"cameras": [], "extra": 1}))
    with pytest.raises(RecordingError, match=r"unknown keys \['extra'\]"):
        RecordingLayout.load(bad)
