"""Drive sources: one known drive written as Foxglove MCAP, rosbag2 MCAP and a PhysicalAI-AV tree (each with its
format's own library) gives the same ticks; bad input gives precise errors or counted skips; ROS 2 outputs."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader
from mcap.writer import Writer
from mcap_ros2.decoder import DecoderFactory

from alpamayo.cli import build_parser, main
from alpamayo.replay.ticks import TickAssembler
from alpamayo.rotations import yaw_to_quat
from bridges.drives import open_drive
from bridges.drives.pai import REPO_FOLDER, VIEW_DIR, VIEW_REVISION
from bridges.drives.recording import RecordingError, RecordingLayout
from tests.drive_layouts import (
    CHUNK,
    CLIP,
    KnownDrive,
    ego_pose,
    pattern,
    write_foxglove,
    write_pai,
    write_rosbag2,
)

START_NS = 100_000_000  # the known drive's first pose, ns
FAST = ["--max-reasoning-tokens", "2", "--no-progress", "--max-ticks", "1"]


@pytest.fixture(scope="module")
def known() -> KnownDrive:
    return KnownDrive()


@pytest.fixture(scope="module")
def layouts(tmp_path_factory, known) -> dict[str, str | Path]:
    root = tmp_path_factory.mktemp("layouts")
    write_pai(root / "pai", known)
    return {
        "pai_dir": root / "pai",
        "pai": f"pai:{CLIP}",
        "foxglove": write_foxglove(root / "foxglove.mcap", known),
        "foxglove_jpeg": write_foxglove(root / "foxglove_jpeg.mcap", known, "jpeg"),
        "rosbag2": write_rosbag2(root / "rosbag2.mcap", known),
        "rosbag2_jpeg_tf": write_rosbag2(root / "rosbag2_tf.mcap", known, "jpeg", "tf"),
    }


def ticks_of(spec, pai_dir=None, warn=print, **kwargs):
    source = open_drive(spec, pai_dir=pai_dir, warn=warn, **kwargs)
    assembler = TickAssembler(source, warn=warn)
    return source, assembler, list(assembler)


def test_the_known_drive_gives_the_same_ticks_through_every_source(layouts, known, record_figure):
    _, _, reference = ticks_of(layouts["foxglove"])
    history_us = 100_000 + 100_000 * np.arange(16)  # the first tick's (t0 = 1.6 s) history times
    jpeg_frames: dict[tuple[int, int], dict[str, np.ndarray]] = {}
    assert [t.t0_ns for t in reference] == [1_600_000_000 + k * 100_000_000 for k in range(5)]
    for name in ("pai", "rosbag2", "rosbag2_jpeg_tf", "foxglove_jpeg"):
        source, _, ticks = ticks_of(layouts[name], layouts["pai_dir"])
        # PAI takes frames at or before each slot (as NVIDIA's loader does): the 2.0 s tick needs the
        # tele camera's frame at 2.0 s, which fires 4.5 ms earlier and so is after the last frame.
        assert len(ticks) == (4 if name == "pai" else 5), name
        for tick, ref in zip(ticks, reference, strict=False):
            assert tick.t0_ns == ref.t0_ns and tick.frame_times_ns == ref.frame_times_ns, name
            exact = name != "rosbag2_jpeg_tf"  # the /tf chain composes two transforms
            tol = 0 if exact else 1e-12
            np.testing.assert_allclose(tick.ego_history.xyz, ref.ego_history.xyz, rtol=0, atol=tol)
            np.testing.assert_allclose(
                tick.ego_history.quat_xyzw, ref.ego_history.quat_xyzw, rtol=0, atol=1e-15
            )
            np.testing.assert_allclose(tick.future[0], ref.future[0], rtol=0, atol=1e-12)
            np.testing.assert_allclose(tick.future[1], ref.future[1], rtol=0, atol=1e-12)
            for camera, frames in tick.frames.items():
                for frame, ref_frame in zip(frames, ref.frames[camera], strict=True):
                    got, want = frame.rgb().astype(int), ref_frame.rgb().astype(int)
                    if "jpeg" in name:  # quality 95 against the raw frames (sharp bar edges ring most)
                        assert np.abs(got - want).mean() < 3.0, name
                        jpeg_frames.setdefault((frame.camera, frame.t_ns), {})[name] = got
                    else:
                        assert np.array_equal(got, want), (name, camera, frame.t_ns)
        source.close()
    # The same JPEG bytes through Foxglove and rosbag2 decode to the same pixels.
    assert jpeg_frames and all(len(fs) == 2 and np.array_equal(*fs.values()) for fs in jpeg_frames.values())
    # The history is the known curve itself (poses are recorded at every history time).
    xyz, _ = ego_pose(history_us)
    np.testing.assert_allclose(reference[0].ego_history.xyz, xyz, atol=1e-9)
    # MP4 tolerance: libx264 crf 18 frames against the frames that were encoded.
    errors = [
        np.abs(d.astype(int) - pattern(c, k, known.size))
        for c, fs in known.decoded.items()
        for k, d in enumerate(fs)
    ]
    record_figure("H.264 crf 18 vs encoded frames: mean abs error (8-bit levels)", float(np.mean(errors)))
    record_figure("H.264 crf 18 vs encoded frames: max abs error (8-bit levels)", float(np.max(errors)))
    assert np.mean(errors) < 3.0


def test_a_single_pai_tick_at_t0_and_the_cache_view(layouts):
    _, _, ticks = ticks_of(f"pai:{CLIP}@1700000", layouts["pai_dir"])
    assert [t.t0_ns for t in ticks] == [1_700_000_000]
    assert sorted(ticks[0].frames) == [0, 1, 2, 6]
    view = layouts["pai_dir"] / VIEW_DIR / REPO_FOLDER
    assert (view / "refs" / "main").read_text() == VIEW_REVISION
    link = view / "snapshots" / VIEW_REVISION / "camera"
    assert link.is_symlink() and not os.path.isabs(os.readlink(link))
    with pytest.raises(RecordingError, match=r"t0 must lie in 1600000 \.\. 1995500 µs"):
        open_drive(f"pai:{CLIP}@900000", pai_dir=layouts["pai_dir"])


def test_the_devkit_reads_a_plain_tree_offline_only_through_a_cache_view(layouts, tmp_path):
    """The measured devkit fact the view exists for: a plain tree as local_dir is not found offline."""
    from bridges.drives.pai import _devkit

    devkit = _devkit()
    plain = shutil.copytree(layouts["pai_dir"], tmp_path / "plain", ignore=shutil.ignore_patterns(VIEW_DIR))
    with pytest.raises(Exception, match=r"features\.csv"):
        devkit.PhysicalAIAVDatasetInterface(revision="main", cache_dir=tmp_path / "empty", local_dir=plain)
    source = open_drive(f"pai:{CLIP}", pai_dir=plain)
    assert source.describe().cameras[0].frames == 20


def test_drive_info_names_each_source(layouts, capsys):
    for name, kind, ego in (
        ("pai", "pai", "egomotion.chunk_0007.zip"),
        ("rosbag2", "rosbag2", "/localization/kinematic_state (nav_msgs/msg/Odometry)"),
        ("rosbag2_jpeg_tf", "rosbag2", "/tf (tf2_msgs/msg/TFMessage): map -> base_link"),
        ("foxglove", "foxglove", "/ego/pose (foxglove.PoseInFrame)"),
    ):
        assert main(["drive-info", str(layouts[name]), "--pai-dir", str(layouts["pai_dir"]), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["kind"] == kind and ego in doc["ego_source"]
        assert doc["ticks"] == (4 if kind == "pai" else 5) and len(doc["cameras"]) == 4
        assert all(c["frames"] == 20 and abs(c["rate_hz"] - 10) < 1e-6 for c in doc["cameras"])
        assert abs(doc["duration_s"] - 8.3) < 1e-9


def replay(spec, checkpoint, out, *args):
    return main(["replay", str(spec), "--checkpoint", str(checkpoint), "--out", str(out), *FAST, *args])


def predictions(path: Path) -> list[bytes]:
    with open(path, "rb") as f:
        return [m.data for _, c, m in make_reader(f).iter_messages(topics=["/alpamayo/prediction"])]


@pytest.fixture(scope="module")
def one_camera(tmp_path_factory) -> dict[str, str | Path]:
    """The known drive on camera 1 only, in each layout: one camera keeps the model's work to 4 frames a tick
    (the demo model takes ~10 s a tick on 2 busy cores with all four)."""
    root = tmp_path_factory.mktemp("one-camera")
    known = KnownDrive(cameras=(1,))
    return {
        "foxglove": write_foxglove(root / "foxglove.mcap", known),
        "rosbag2": write_rosbag2(root / "rosbag2.mcap", known),
        "pai": f"pai:{CLIP}",
        "pai_dir": write_pai(root / "pai", known),
    }


def source_args(layouts: dict[str, str | Path], name: str, cameras_flag: str = "--cameras") -> list[str]:
    """The drive-source flags of layout `name`: PAI's directory and camera 1."""
    return ["--pai-dir", str(layouts["pai_dir"]), cameras_flag, "1"] if name == "pai" else []


def test_lockstep_predictions_are_byte_identical_across_sources_and_ros2_output_reads_back(
    demo_checkpoint, one_camera, tmp_path, capsys
):
    layouts = one_camera
    outs = {}
    for name in ("foxglove", "rosbag2", "pai"):
        outs[name] = tmp_path / f"{name}.out.mcap"
        assert replay(layouts[name], demo_checkpoint, outs[name], *source_args(layouts, name)) == 0
    reference = predictions(outs["foxglove"])
    assert len(reference) == 1
    assert predictions(outs["rosbag2"]) == reference
    # PAI: the same bytes but for the scores against the recorded future, whose devkit cubic spline reproduces
    # the recorded poses to an ulp (7e-15 m), not bit for bit.
    for got, want in zip(predictions(outs["pai"]), reference, strict=True):
        got, want = json.loads(got), json.loads(want)
        scores = got.pop("errors_m")
        for key, value in want.pop("errors_m").items():
            assert abs(scores[key] - value) < 1e-12
        assert got == want

    ros2 = tmp_path / "ros2.out.mcap"
    assert replay(layouts["rosbag2"], demo_checkpoint, ros2, "--format", "ros2") == 0
    capsys.readouterr()
    decoded: dict[str, list] = {}
    with open(ros2, "rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        schemas = {s.name: s for s in reader.get_summary().schemas.values()}
        for _, channel, message, msg in reader.iter_decoded_messages():
            decoded.setdefault(channel.topic, []).append((message.log_time, msg))
    assert schemas["autoware_planning_msgs/msg/Trajectory"].encoding == "ros2msg"
    text = schemas["autoware_planning_msgs/msg/Trajectory"].data.decode()
    assert "MSG: autoware_planning_msgs/TrajectoryPoint" in text and "MSG: geometry_msgs/Pose" in text
    assert len(decoded["/alpamayo/trajectory"]) == 1 and len(decoded["/alpamayo/recorded_future"]) == 1
    assert "/sensing/camera/camera1/image_raw" in decoded  # the bag's own messages are copied in
    for (t0, trajectory), raw in zip(decoded["/alpamayo/trajectory"], reference, strict=True):
        sample = json.loads(raw)["samples"][0]
        assert (
            trajectory.header.stamp.sec * 10**9 + trajectory.header.stamp.nanosec
            == t0
            == json.loads(raw)["t0_ns"]
        )
        assert trajectory.header.frame_id == "base_link" and len(trajectory.points) == 64
        assert [p.pose.position.x for p in trajectory.points] == sample["x"]
        assert [p.pose.position.y for p in trajectory.points] == sample["y"]
        assert [p.time_from_start.nanosec for p in trajectory.points[:3]] == [
            100_000_000,
            200_000_000,
            300_000_000,
        ]
        first = np.hypot(sample["x"][0], sample["y"][0]) / 0.1
        assert trajectory.points[0].longitudinal_velocity_mps == pytest.approx(first, rel=1e-6)
        orientation = [[getattr(p.pose.orientation, k) for k in "xyzw"] for p in trajectory.points]
        assert np.allclose(orientation, yaw_to_quat(np.array(sample["heading"])), atol=1e-7)
    # The recorded future as the lock-step tick holds it (t0 ego frame), each pose stamped t0 + k * 0.1 s.
    _, _, (tick, *_) = ticks_of(layouts["rosbag2"])
    ((_, future),) = decoded["/alpamayo/recorded_future"]
    assert future.header.frame_id == "base_link" and len(future.poses) == 64
    assert [p.header.stamp.sec * 10**9 + p.header.stamp.nanosec for p in future.poses] == [
        tick.t0_ns + k * 100_000_000 for k in range(1, 65)
    ]
    xyz = [[getattr(p.pose.position, k) for k in "xyz"] for p in future.poses]
    orientation = [[getattr(p.pose.orientation, k) for k in "xyzw"] for p in future.poses]
    assert np.allclose(xyz, tick.future[0], atol=1e-9)
    assert np.allclose(orientation, yaw_to_quat(tick.future[1]), atol=1e-9)
    reasoning = decoded["/alpamayo/reasoning"][0][1].data
    assert reasoning == json.loads(reference[0])["samples"][0]["reasoning"]


@pytest.mark.parametrize("name", ["rosbag2", "pai"])
def test_realtime_replay_answers_ticks_from_the_new_sources(
    demo_checkpoint, one_camera, name, tmp_path, capsys
):
    """Issue 19: `replay --realtime` reads a rosbag2 bag and a PhysicalAI-AV clip as it reads Foxglove MCAP.
    At the recorded pace (1x) the node, ~0.4 s a prediction here, answers 2 of the 5 ticks (t0 = 1.6 .. 2.0 s;
    newest wins, so at least the first it sees) and drops the rest; the accounting must add up."""
    out, report = tmp_path / "rt.mcap", tmp_path / "rt.json"
    args = ["replay", str(one_camera[name]), "--checkpoint", str(demo_checkpoint), "--out", str(out)]
    args += [
        "--realtime",
        "--speed",
        "1",
        "--json",
        str(report),
        "--max-reasoning-tokens",
        "2",
        "--no-progress",
    ]
    assert main([*args, *source_args(one_camera, name)]) == 0
    assert "real-time at 1.0x" in capsys.readouterr().out
    ticks = json.loads(report.read_text())["ticks"]
    assert ticks["offered"] == 5 and ticks["answered"] >= 1  # t0 = 1.6 .. 2.0 s, as in lock step
    assert ticks["answered"] + ticks["dropped"] == ticks["offered"]
    answered = [json.loads(data) for data in predictions(out)]
    assert len(answered) == ticks["answered"]
    for prediction in answered:
        assert prediction["t0_ns"] in range(1_600_000_000, 2_000_000_001, 100_000_000)
        assert len(prediction["samples"][0]["x"]) == 64


@pytest.mark.parametrize("name", ["rosbag2", "pai"])
def test_profile_prints_the_latency_table_for_the_new_sources(demo_checkpoint, one_camera, name, capsys):
    args = ["profile", str(one_camera[name]), "--checkpoint", str(demo_checkpoint), "--warmup", "0"]
    args += ["--iters", "1", "--max-reasoning-tokens", "2", "--no-progress"]
    assert main([*args, *source_args(one_camera, name, "--pai-cameras")]) == 0
    printed = capsys.readouterr().out
    assert "Latency per stage (ms) over 1 measured ticks" in printed and "1 camera(s) [1]" in printed
    stages = {
        line.split()[0]: int(line.split()[1])
        for line in printed.splitlines()
        if line.startswith(("decode ", "prefill "))
    }
    assert stages["decode"] >= 1 and stages["prefill"] == 1


# --- bad input: precise errors, counted skips ---


def test_pai_errors_name_the_clip_camera_or_file(layouts, tmp_path, capsys):
    pai_dir = layouts["pai_dir"]
    with pytest.raises(RecordingError, match=r"clip 'nope' is not in .*clip_index.parquet \(1 clips, e.g. "):
        open_drive("pai:nope", pai_dir=pai_dir)
    with pytest.raises(
        RecordingError,
        match=r"camera_rear_left_70fov needs .*camera_rear_left_70fov.chunk_0007.zip, which is missing",
    ):
        open_drive(f"pai:{CLIP}", pai_dir=pai_dir, cameras=[0, 1, 2, 3])
    broken = shutil.copytree(pai_dir, tmp_path / "broken", ignore=shutil.ignore_patterns(VIEW_DIR))
    zip_path = broken / f"camera/camera_front_tele_30fov/camera_front_tele_30fov.chunk_{CHUNK:04d}.zip"
    with zipfile.ZipFile(zip_path, "w") as zf:
        zf.writestr("unrelated.txt", b"")
    with pytest.raises(RecordingError, match=rf"\.zip lacks .*{CLIP}\.camera_front_tele_30fov\.mp4"):
        open_drive(f"pai:{CLIP}", pai_dir=broken)
    with pytest.raises(RecordingError, match=r"has no features\.csv"):
        open_drive(f"pai:{CLIP}", pai_dir=tmp_path)
    assert main(["drive-info", "pai:nope", "--pai-dir", str(pai_dir)]) == 2
    err = capsys.readouterr().err
    assert "clip 'nope' is not in" in err and "Traceback" not in err
    assert main(["drive-info", f"pai:{CLIP}"]) == 2
    assert "needs --pai-dir" in capsys.readouterr().err


@pytest.fixture(scope="module")
def truncated(tmp_path_factory) -> Path:
    """A clip whose tele camera MP4 lost its last 10 % (the index, moov, is first, so the file still opens)."""
    known = KnownDrive(faststart=True)
    known.mp4[6] = known.mp4[6][: len(known.mp4[6]) * 9 // 10]
    return write_pai(tmp_path_factory.mktemp("truncated") / "pai", known)


def test_a_truncated_mp4_fails_its_frames_naming_camera_and_time(truncated):
    # After the devkit's reader has demuxed into the damage, no seek in that stream decodes again.
    _, _, ticks = ticks_of(f"pai:{CLIP}", truncated)
    assert len(ticks) == 4
    for tick in ticks:
        assert all(f.rgb().shape == (64, 96, 3) for c in (0, 1, 2) for f in tick.frames[c])
        with pytest.raises(ValueError, match=r"camera 6 frame at \d+ ns \(camera_front_tele_30fov frame \d+"):
            tick.frames[6][-1].rgb()


def test_a_truncated_mp4_is_a_counted_skip_in_the_replay_summary(
    truncated, tmp_path, demo_checkpoint, capsys
):
    out = tmp_path / "out.mcap"
    args = ["replay", f"pai:{CLIP}", "--pai-dir", str(truncated), "--checkpoint", str(demo_checkpoint)]
    assert main([*args, "--out", str(out), "--max-reasoning-tokens", "1", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert predictions(out) == [] and "skipped: 4 x a frame does not decode" in captured.out
    assert captured.err.count("camera 6 frame at") == 4 and "MP4 does not decode there" in captured.err
    assert "Traceback" not in captured.err


def test_egomotion_gaps_over_the_limit_skip_and_count_the_ticks(tmp_path):
    known = KnownDrive(frames=30)
    write_pai(tmp_path / "pai", known, pose_gap_us=(150_000, 450_000))  # 0.3 s > the 0.25 s limit
    warnings = []
    _, assembler, ticks = ticks_of(f"pai:{CLIP}", tmp_path / "pai", warn=warnings.append)
    # t0 = 1.6 .. 1.9 s have the gap in their 1.5 s history; 2.0 .. 2.9 s do not.
    assert [t.t0_ns // 100_000_000 for t in ticks] == list(range(20, 30))
    assert assembler.skipped == {"the ego poses have a gap over 0.25 s in the 1.5 s history": 4}
    assert sum("gap over 0.25 s" in w for w in warnings) == 4


def _rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy an MCAP file record by record; edit(topic, index, data) returns the message bytes to write."""
    with open(src, "rb") as f, open(dst, "wb") as out:
        writer = Writer(out)
        writer.start(profile="ros2", library="test")
        channels, schemas, counts = {}, {}, {}
        for schema, channel, message in make_reader(f).iter_messages(log_time_order=False):
            if schema.id not in schemas:
                schemas[schema.id] = writer.register_schema(schema.name, schema.encoding, schema.data)
            if channel.id not in channels:
                channels[channel.id] = writer.register_channel(
                    channel.topic, channel.message_encoding, schemas[schema.id]
                )
            counts[channel.topic] = counts.get(channel.topic, 0) + 1
            data = edit(channel.topic, counts[channel.topic], message.data)
            writer.add_message(channels[channel.id], message.log_time, data, message.publish_time)
        writer.finish()
    return dst


def test_a_cdr_message_that_does_not_decode_is_skipped_and_counted(layouts, tmp_path):
    topic = "/sensing/camera/camera3/image_raw"
    bag = _rewrite(
        layouts["rosbag2"], tmp_path / "bad.mcap", lambda t, i, d: d[:30] if t == topic and i == 18 else d
    )
    warnings = []
    source, assembler, ticks = ticks_of(bag, warn=warnings.append)
    assert source.skipped == {f"a {topic} message does not decode": 1}
    assert any(
        f"{topic}: skipped the message at log time" in w and "CDR message does not decode" in w
        for w in warnings
    )
    # Frame 18 (1.8 s) of camera 0 is gone: the three ticks whose window needs it are skipped and counted.
    assert [t.t0_ns // 100_000_000 for t in ticks] == [16, 17]
    assert assembler.skipped == {"camera 0 lacks a frame within 50 ms of one of t0 -0.3 .. 0 s": 3}


def test_bag_errors_name_the_topic_type_and_transforms(known, layouts, tmp_path):
    from mcap_ros2.writer import Writer as Ros2Writer

    from bridges.drives.ros2_messages import definition

    topic = "/sensing/camera/camera1/image_raw/compressed"
    bag = tmp_path / "string.mcap"
    with open(bag, "wb") as f:
        writer = Ros2Writer(f)
        schema = writer.register_msgdef("std_msgs/msg/String", definition("std_msgs/msg/String"))
        writer.write_message(topic, schema, {"data": "not an image"}, 1, 1)
        writer.write_message("/tf", schema, {"data": "not a transform"}, 1, 1)
        writer.finish()
    with pytest.raises(
        RecordingError,
        match=rf"topic {topic} has message type 'std_msgs/String', which replay does not read there; allowed: "
        r"\['sensor_msgs/CompressedImage', 'sensor_msgs/Image'\]",
    ):
        open_drive(
            bag,
            RecordingLayout.from_dict(
                {"cameras": [{"topic": topic, "camera": 1}], "ego_pose_topic": "/tf"}, "t"
            ),
        )
    no_static = write_rosbag2(tmp_path / "tf.mcap", known, "raw", "tf", tf_static=False)
    with pytest.raises(
        RecordingError, match=r"never chain map to base_link; transforms seen: \['odom->base_link'\]"
    ):
        open_drive(no_static)
    assert main(["drive-info", str(no_static)]) == 2


def test_bag_without_autoware_topics_asks_for_a_layout(known, tmp_path):
    bag = write_rosbag2(tmp_path / "other.mcap", known, topics={c: f"/cam{c}" for c in known.cameras})
    with pytest.raises(RecordingError, match=r"no camera topic of the Autoware layout .* give --layout FILE"):
        open_drive(bag)


@pytest.mark.parametrize(
    "encoding", ["bayer_rggb8", "bayer_bggr8", "bayer_gbrg8", "bayer_grbg8", "mono8", "bgr8"]
)
def test_ros_raw_image_encodings_convert_to_rgb(known, tmp_path, encoding):
    """Images whose colour is constant over each 2x2 cell survive a Bayer mosaic exactly; mono8 becomes grey."""
    cells = pattern(1, 3, (32, 48))[::2, ::2]
    rgb = cells.repeat(2, axis=0).repeat(2, axis=1)
    if encoding.startswith("bayer"):
        order = encoding[6:10].upper()
        data = np.zeros(rgb.shape[:2], np.uint8)
        for i, colour in enumerate(order):
            data[i // 2 :: 2, i % 2 :: 2] = rgb[i // 2 :: 2, i % 2 :: 2, "RGB".index(colour)]
        expected = rgb
    elif encoding == "mono8":
        data, expected = rgb[:, :, 0], np.repeat(rgb[:, :, :1], 3, axis=2)
    else:
        data, expected = rgb[:, :, ::-1], rgb
    frame_bytes = np.ascontiguousarray(data).tobytes()
    step = len(frame_bytes) // 32
    from mcap_ros2.writer import Writer as Ros2Writer

    from bridges.drives.ros2_messages import definition, stamp

    bag = tmp_path / "raw.mcap"
    xyz, quat = ego_pose(known.pose_times_us)
    with open(bag, "wb") as f:
        writer = Ros2Writer(f)
        image = writer.register_msgdef("sensor_msgs/msg/Image", definition("sensor_msgs/msg/Image"))
        odom = writer.register_msgdef("nav_msgs/msg/Odometry", definition("nav_msgs/msg/Odometry"))
        for t_us, p, q in zip(known.pose_times_us[:3], xyz, quat, strict=False):
            pose = {
                "position": dict(zip("xyz", map(float, p), strict=True)),
                "orientation": dict(zip("xyzw", map(float, q), strict=True)),
            }
            zero = {"x": 0.0, "y": 0.0, "z": 0.0}
            message = {
                "header": {"stamp": stamp(int(t_us) * 1000), "frame_id": "map"},
                "child_frame_id": "base_link",
                "pose": {"pose": pose, "covariance": [0.0] * 36},
                "twist": {"twist": {"linear": zero, "angular": zero}, "covariance": [0.0] * 36},
            }
            writer.write_message(
                "/localization/kinematic_state", odom, message, int(t_us) * 1000, int(t_us) * 1000
            )
        header = {"stamp": stamp(START_NS), "frame_id": "cam"}
        message = {
            "header": header,
            "height": 32,
            "width": 48,
            "encoding": encoding,
            "is_bigendian": 0,
            "step": step,
            "data": frame_bytes,
        }
        writer.write_message("/sensing/camera/camera1/image_raw", image, message, START_NS, START_NS)
        writer.finish()
    (frame,) = list(open_drive(bag).frames())
    assert np.array_equal(frame.rgb(), expected)


def test_precision_reads_its_drive_ticks_through_every_source(layouts):
    from alpamayo.precision.drives import drive_ticks

    for name in ("pai", "rosbag2", "foxglove"):
        ticks = drive_ticks(layouts[name], 2, print, pai_dir=layouts["pai_dir"])
        assert [t.t0_ns for t in ticks] == [1_600_000_000, 1_700_000_000], name


def test_precision_reads_a_bag_of_other_topic_names_through_its_layout(known, tmp_path):
    from alpamayo.precision.drives import drive_ticks

    bag = write_rosbag2(tmp_path / "other.mcap", known, topics={c: f"/cam{c}" for c in known.cameras})
    layout = tmp_path / "layout.yaml"
    cameras = "".join(f"  - {{topic: /cam{c}, camera: {c}}}\n" for c in known.cameras)
    layout.write_text(f"ego_pose_topic: /localization/kinematic_state\ncameras:\n{cameras}")
    ticks = drive_ticks(bag, 2, print, layout=layout)
    assert [t.t0_ns for t in ticks] == [1_600_000_000, 1_700_000_000]
    args = build_parser().parse_args(
        ["precision", "--checkpoint", "c", "--drive", str(bag), "--layout", "l.yaml"]
    )
    assert args.layout == Path("l.yaml")
