"""NVIDIA PhysicalAI-AV clips (`pai:CLIP_ID[@T0_US]`), read through the `physical-ai-av` devkit offline.

The dataset's tree (`--pai-dir`): `features.csv`, `clip_index.parquet`, `metadata/feature_presence.parquet`,
`metadata/data_collection.parquet`, per camera `camera/<camera>/<camera>.chunk_XXXX.zip` holding
`{clip}.<camera>.mp4` (H.264) and `{clip}.<camera>.timestamps.parquet` (`timestamp`, int64 µs), and
`labels/egomotion/egomotion.chunk_XXXX.zip` holding `{clip}.egomotion.parquet` (`timestamp` µs, x, y, z, qx, qy,
qz, qw, ...: the rig's pose in the clip's world frame).

Offline, the devkit (0.2.3) finds files only through the Hugging Face cache layout (`try_to_load_from_cache`),
never in a plain directory. So a plain tree gets a cache view, made once: `DIR/.hf-cache-view/
datasets--nvidia--PhysicalAI-Autonomous-Vehicles/` with `refs/main` naming a fixed revision and
`snapshots/<revision>/<entry>` a relative symlink to each top-level entry of the tree (files added under those
entries later are seen through the links; a new top-level entry is linked at the next open). A directory that
already is a Hugging Face cache (it holds `datasets--nvidia--PhysicalAI-Autonomous-Vehicles`) is used as it is.
`HF_HUB_OFFLINE` is forced on before the devkit is used: nothing is downloaded, ever.

As NVIDIA's reference loader (`load_physical_aiavdataset`) does: a tick at t0 takes each camera's frame nearest at
or before t0 - 0.3, -0.2, -0.1, 0 s, decoded from the MP4 by the devkit's reader when first used, together with
the next window's frames in the same pass (never the whole clip: two windows per camera are kept, as consecutive
ticks share three of four frames); the ego
history and the 64-step future are the devkit's egomotion interpolation (cubic-spline position, slerp rotation)
at t0 - 1.5 .. 0 s and t0 + 0.1 .. 6.4 s. Times are µs in the dataset and ns (x 1000) everywhere else.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from alpamayo.input_window import PoseTrack, SlotMissing, frame_slots
from alpamayo.prediction import FRAMES_PER_CAMERA, HISTORY_STEPS, PERIOD_US
from bridges.drives.description import DriveDescription, camera_descriptions, ego_fields
from bridges.drives.recording import (
    CameraTopic,
    FrameError,
    RecordedFrame,
    RecordingError,
    RecordingLayout,
    Warn,
)
from bridges.wire.protocol import ALPAMAYO_CAMERAS

REPO_ID = "nvidia/PhysicalAI-Autonomous-Vehicles"
REPO_FOLDER = "datasets--nvidia--PhysicalAI-Autonomous-Vehicles"
VIEW_DIR = ".hf-cache-view"
# The view's revision: any 40-hex name works offline; a fixed one keeps the devkit's member cache stable.
VIEW_REVISION = hashlib.sha1(b"alpamayo-tt plain PhysicalAI-AV tree").hexdigest()
DEFAULT_CAMERAS = (0, 1, 2, 6)  # Alpamayo's four, as the reference loader picks them
EGOMOTION = "egomotion"
HISTORY_US = (HISTORY_STEPS - 1) * PERIOD_US
FRAME_SPAN_US = (FRAMES_PER_CAMERA - 1) * PERIOD_US
FRAME_OFFSETS_US = PERIOD_US * np.arange(-(FRAMES_PER_CAMERA - 1), 1, dtype=np.int64)
MAX_FRAME_AGE_US = (
    PERIOD_US  # a frame at or before a slot older than a period means the camera dropped frames
)
# One devkit call seeks to the keyframe before its first frame and decodes forward, so a call per new frame
# decodes half a GOP for each (236 ms per 1080p frame at GOP 30, benchmarks/drive_sources.py); decoding the
# next window's frames in the same pass shares that seek. Kept per camera: two windows of decoded frames.
PREFETCH_FRAMES = FRAMES_PER_CAMERA
KEPT_FRAMES = 2 * FRAMES_PER_CAMERA


def _devkit() -> Any:
    """The devkit, offline. huggingface_hub reads HF_HUB_OFFLINE when it is first imported (transformers may
    have imported it already), so the flag is also set on the loaded module."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    import physical_ai_av

    return physical_ai_av


def cache_view(pai_dir: Path) -> tuple[Path, str]:
    """(cache_dir, revision) through which the devkit reads `pai_dir` offline (see the module docstring)."""
    pai_dir = pai_dir.resolve()
    if not pai_dir.is_dir():
        raise RecordingError(f"--pai-dir {pai_dir} is not a directory")
    if (pai_dir / REPO_FOLDER).is_dir():
        ref = pai_dir / REPO_FOLDER / "refs" / "main"
        if not ref.is_file():
            raise RecordingError(
                f"--pai-dir {pai_dir} is a Hugging Face cache without {ref.relative_to(pai_dir)}"
            )
        return pai_dir, ref.read_text().strip()
    if not (pai_dir / "features.csv").is_file():
        raise RecordingError(
            f"--pai-dir {pai_dir} has no features.csv: expected the PhysicalAI-AV tree (features.csv, "
            "clip_index.parquet, metadata/, camera/, labels/) or a Hugging Face cache holding it"
        )
    view = pai_dir / VIEW_DIR
    snapshot = view / REPO_FOLDER / "snapshots" / VIEW_REVISION
    try:
        snapshot.mkdir(parents=True, exist_ok=True)
        (view / REPO_FOLDER / "refs").mkdir(exist_ok=True)
        (view / REPO_FOLDER / "refs" / "main").write_text(VIEW_REVISION)
        for entry in sorted(pai_dir.iterdir()):
            link = snapshot / entry.name
            if entry.name.startswith(".") or link.is_symlink():
                continue
            link.symlink_to(os.path.relpath(entry, snapshot))
    except OSError as e:
        raise RecordingError(
            f"--pai-dir {pai_dir}: cannot create the devkit's cache view {view} ({e}); make the directory "
            "writable once, or pass a Hugging Face cache directory"
        ) from e
    return view, VIEW_REVISION


@dataclass
class VideoFrame(RecordedFrame):
    """A frame of a clip's MP4, decoded by the devkit when `rgb()` is first called."""

    video: Any = None  # CameraVideo
    index: int = -1  # frame number in the MP4

    def _decode(self) -> np.ndarray:
        return self.video.decode(self)


class CameraVideo:
    """One camera's MP4 and frame times; decodes frames on demand, batching the window's undecoded ones."""

    def __init__(self, camera: int, feature: str, reader: Any, timestamps_us: np.ndarray, source: str):
        self.camera = camera
        self.feature = feature
        self.reader = reader  # physical_ai_av.video.SeekVideoReader
        self.timestamps_us = timestamps_us
        self.source = source
        self.used = np.zeros(0, dtype=np.int64)  # the frame numbers the ticks use, ascending (set by PaiClip)
        self._frames: OrderedDict[int, VideoFrame] = OrderedDict()

    def frame(self, index: int) -> VideoFrame:
        """The frame object of `index` (the same one for consecutive ticks, so it is decoded once)."""
        frame = self._frames.get(index)
        if frame is None:
            t_ns = int(self.timestamps_us[index]) * 1000
            frame = VideoFrame(self.camera, t_ns, "video/mp4", {}, video=self, index=index)
            self._frames[index] = frame
            while len(self._frames) > KEPT_FRAMES:
                self._frames.popitem(last=False)
        return frame

    def decode(self, frame: VideoFrame) -> np.ndarray:
        """Decode `frame` together with the other kept frames not yet decoded and the next PREFETCH_FRAMES
        frames the ticks use (one forward pass per keyframe)."""
        ahead = self.used[np.searchsorted(self.used, frame.index, side="right") :][:PREFETCH_FRAMES]
        for index in ahead:
            self.frame(int(index))
        pending = [f for f in self._frames.values() if not f.decoded and f is not frame] + [frame]
        indices = np.array(sorted({f.index for f in pending}), dtype=np.int64)
        try:
            images = self.reader.decode_images_from_frame_indices(indices)
        except Exception as e:  # PyAV and the devkit raise several types for a damaged stream
            raise FrameError(
                f"{frame.where} ({self.feature} frame {frame.index}, {frame.t_ns // 1000} µs): the MP4 does not "
                f"decode there: {type(e).__name__}: {str(e).splitlines()[0]}"
            ) from e
        by_index = dict(zip(indices.tolist(), images, strict=True))
        for f in pending:
            if f is not frame:
                f._rgb = by_index[f.index]
        return by_index[frame.index]

    def frames_at(self, t0_us: int) -> list[VideoFrame]:
        """The window's frames at t0 by the reference loader's rule, the newest at or before each slot
        (`alpamayo.input_window.frame_slots`); FrameError outside the video or when one is older than
        MAX_FRAME_AGE_US (the camera dropped frames there)."""
        ts = self.timestamps_us
        first, last = t0_us + FRAME_OFFSETS_US[0], t0_us + FRAME_OFFSETS_US[-1]
        if first < ts[0] or last > ts[-1]:
            raise FrameError(
                f"camera {self.camera} ({self.feature}) has frames from {ts[0]} to {ts[-1]} µs; the tick needs "
                f"{first} .. {last} µs"
            )
        try:
            indices = frame_slots(ts, t0_us, MAX_FRAME_AGE_US, PERIOD_US, rule="at_or_before")
        except SlotMissing as e:
            # the oldest frame; the oldest slot of two as old
            k, age = max(e.missing, key=lambda slot: slot[1] or 0)
            raise FrameError(
                f"camera {self.camera} ({self.feature}): the newest frame at or before {t0_us - k * PERIOD_US} µs "
                f"is {(age or 0) / 1000:g} ms older (limit {MAX_FRAME_AGE_US / 1000:g} ms): frames are missing"
            ) from None
        return [self.frame(i) for i in indices]

    def close(self) -> None:
        self.reader.close()
        self._frames.clear()


def ego_track(interpolator: Any) -> PoseTrack:
    """The clip's egomotion samples (t_ns [N], xyz [N, 3] m, quat_xyzw [N, 4] rig -> world) with the devkit's
    interpolator between them, NVIDIA's semantics (cubic-spline position, slerp rotation). `PoseTrack.at`
    asks it only for times within the samples and no gap over MAX_POSE_GAP_NS (outside them the devkit
    would return NaN: it never extrapolates)."""

    def devkit(times_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        state = interpolator(times_ns // 1000)
        return np.asarray(state.pose.translation), np.asarray(state.pose.rotation.as_quat())

    return PoseTrack(
        np.asarray(interpolator.timestamps, dtype=np.int64) * 1000,
        np.asarray(interpolator.values.pose.translation),
        np.asarray(interpolator.values.pose.rotation.as_quat()),
        interpolator=devkit,
    )


class PaiClip:
    """A PhysicalAI-AV clip opened for replay (a `bridges.drives.DriveSource`)."""

    kind = "pai"

    def __init__(
        self,
        pai_dir: Path,
        clip: str,
        t0_us: int | None,
        videos: list[CameraVideo],
        ego: PoseTrack,
        ego_file: str,
        warn: Warn,
    ):
        self.path = pai_dir
        self.clip = clip
        self.t0_us = t0_us
        self.spec = f"pai:{clip}" + ("" if t0_us is None else f"@{t0_us}")
        self.videos = {v.camera: v for v in videos}
        self.poses = ego
        self.ego_file = ego_file
        self.layout = RecordingLayout(
            tuple(CameraTopic(v.source, v.camera, v.feature) for v in videos), EGOMOTION
        )
        self.skipped: Counter = Counter()
        self._warn = warn
        self.tick_times_ns = self._tick_times_us() * 1000
        slots = np.unique((self.tick_times_ns // 1000)[:, None] + FRAME_OFFSETS_US[None, :])
        for video in videos:
            ts = video.timestamps_us
            inside = slots[(slots >= ts[0]) & (slots <= ts[-1])]
            video.used = np.unique(np.searchsorted(ts, inside, side="right") - 1)

    @classmethod
    def open(
        cls,
        pai_dir: Path,
        clip: str,
        t0_us: int | None = None,
        cameras: Sequence[int] | None = None,
        warn: Warn = print,
    ) -> PaiClip:
        """Open `clip` of the dataset in `pai_dir` through the devkit; RecordingError naming the clip, camera or
        file for an unknown clip, a missing chunk zip or member, an MP4 that does not open, or a t0 outside."""
        cameras = tuple(DEFAULT_CAMERAS if cameras is None else cameras)
        bad = [c for c in cameras if c not in ALPAMAYO_CAMERAS]
        if bad or len(set(cameras)) != len(cameras) or not cameras:
            raise RecordingError(
                f"--cameras {list(cameras)}: give distinct camera indices from {sorted(ALPAMAYO_CAMERAS)}"
            )
        cache_dir, revision = cache_view(pai_dir)
        devkit = _devkit()
        try:
            avdi = devkit.PhysicalAIAVDatasetInterface(revision=revision, cache_dir=cache_dir)
        except Exception as e:  # pandas, pyarrow and huggingface_hub raise unrelated types for a bad tree
            raise RecordingError(f"--pai-dir {pai_dir}: the devkit cannot read the dataset index: {e}") from e
        if clip not in avdi.clip_index.index:
            some = ", ".join(map(str, avdi.clip_index.index[:3]))
            raise RecordingError(
                f"clip {clip!r} is not in {pai_dir}/clip_index.parquet ({len(avdi.clip_index)} clips, e.g. {some})"
            )
        chunk = int(avdi.get_clip_chunk(clip))
        opened = cls._open_feature(avdi, pai_dir, clip, chunk, EGOMOTION)
        ego = ego_track(opened[0])
        videos = []
        try:
            for camera in sorted(cameras):
                reader, source = cls._open_feature(avdi, pai_dir, clip, chunk, ALPAMAYO_CAMERAS[camera])
                videos.append(
                    CameraVideo(camera, ALPAMAYO_CAMERAS[camera], reader, reader.timestamps, source)
                )
            return cls(pai_dir, clip, t0_us, videos, ego, opened[1], warn)
        except BaseException:
            for video in videos:
                video.close()
            raise

    @staticmethod
    def _open_feature(avdi: Any, pai_dir: Path, clip: str, chunk: int, feature: str) -> tuple[Any, str]:
        """The devkit's reader of one clip feature (egomotion interpolator or video reader) and the file it
        came from, or a RecordingError naming what is missing or damaged."""
        if feature not in avdi.features.ALL:
            raise RecordingError(
                f"{pai_dir}/features.csv has no feature {feature!r}; it lists {sorted(avdi.features.ALL)}"
            )
        filename = avdi.features.get_chunk_feature_filename(chunk, feature)
        if not (pai_dir / filename).is_file():
            raise RecordingError(f"clip {clip}: {feature} needs {pai_dir / filename}, which is missing")
        members = avdi.features.get_clip_files_in_zip(clip, feature)
        source = f"{filename}:{members.get('video', members.get(feature, ''))}"
        try:
            reader = avdi.get_clip_feature(clip, feature)
        except KeyError as e:  # zipfile names the absent member
            raise RecordingError(f"clip {clip}: {pai_dir / filename} lacks {e.args[0]}") from e
        except Exception as e:  # zipfile, pyarrow and PyAV raise unrelated types for a damaged member
            raise RecordingError(
                f"clip {clip}: {feature} in {pai_dir / filename} does not open: {type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}"
            ) from e
        start = getattr(reader, "start_time_pts", 0)
        if start not in (0, None):
            reader.close()
            # The devkit numbers decoded frames from pts 0 (it ignores the stream's start time) and would
            # return the wrong frames for such a stream.
            raise RecordingError(
                f"clip {clip}: {source}: the video stream starts at pts {start}, not 0; the devkit's reader "
                "would mis-number its frames"
            )
        return reader, source

    def _tick_times_us(self) -> np.ndarray:
        """The single t0 asked for (validated), else a 10 Hz grid (multiples of 0.1 s) over the span every
        camera and 1.5 s of egomotion cover."""
        ego_us = self.poses.t_ns // 1000
        first = max(
            int(ego_us[0]) + HISTORY_US,
            *(int(v.timestamps_us[0]) + FRAME_SPAN_US for v in self.videos.values()),
        )
        last = min(int(ego_us[-1]), *(int(v.timestamps_us[-1]) for v in self.videos.values()))
        if self.t0_us is not None:
            if not first <= self.t0_us <= last:
                raise RecordingError(
                    f"{self.spec}: t0 must lie in {first} .. {last} µs (1.5 s of egomotion and 0.3 s of every "
                    f"camera before it, both still recorded at t0); the clip's egomotion spans {ego_us[0]} .. "
                    f"{ego_us[-1]} µs"
                )
            return np.array([self.t0_us], dtype=np.int64)
        start = -(-first // PERIOD_US) * PERIOD_US
        return np.arange(start, last + 1, PERIOD_US, dtype=np.int64)

    def window_frames(self, t0_ns: int) -> dict[int, list[RecordedFrame]]:
        return {camera: list(video.frames_at(t0_ns // 1000)) for camera, video in self.videos.items()}

    def frames(self, start_ns: int | None = None, end_ns: int | None = None) -> Iterator[RecordedFrame]:
        """The frames the ticks use (nearest at or before each 0.1 s slot), in time order; a slot a camera cannot
        serve is left out."""
        picked: list[tuple[int, int, int]] = []
        for video in self.videos.values():
            for index in video.used:
                t_ns = int(video.timestamps_us[index]) * 1000
                if (start_ns is None or t_ns >= start_ns) and (end_ns is None or t_ns < end_ns):
                    picked.append((t_ns, video.camera, int(index)))
        for _, camera, index in sorted(picked):
            yield self.videos[camera].frame(index)

    def frame_size(self, start_ns: int | None = None, end_ns: int | None = None) -> tuple[int, int] | None:
        """(height, width) of the first camera's video stream."""
        stream = next(iter(self.videos.values())).reader.stream
        return int(stream.codec_context.height), int(stream.codec_context.width)

    def raw_messages(self, start_ns: int, end_ns: int) -> Iterator[Any]:
        """A clip has no recorded messages to copy into outputs."""
        return iter(())

    def describe(self) -> DriveDescription:
        cameras = []
        for v in self.videos.values():
            stream = v.reader.stream
            detail = f"{stream.codec_context.name} {stream.codec_context.width}x{stream.codec_context.height}"
            cameras.append((v.camera, v.feature, v.source, detail))
        times = {v.camera: [int(t) * 1000 for t in v.timestamps_us] for v in self.videos.values()}
        ticks = "the single tick at t0" if self.t0_us is not None else "10 Hz over the clip"
        return DriveDescription(
            kind=self.kind,
            spec=self.spec,
            cameras=camera_descriptions(cameras, times),
            ego_source=f"{self.ego_file} (egomotion, the clip's world frame)",
            **ego_fields(self.poses.t_ns),
            extra={"clip": self.clip, "dataset": str(self.path), "ticks_taken": ticks},
        )

    def close(self) -> None:
        for video in self.videos.values():
            video.close()
