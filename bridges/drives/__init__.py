"""Recorded drives behind one interface: Foxglove MCAP, rosbag2 MCAP and NVIDIA PhysicalAI-AV clips.

Open any drive with `open_drive` and iterate its ticks with `alpamayo.replay.ticks.TickAssembler`:

    from alpamayo.replay.ticks import TickAssembler
    from bridges.drives import open_drive

    source = open_drive("drive.mcap")                                    # Foxglove or rosbag2 MCAP
    source = open_drive("pai:25cd4769-5dcf-4b53-a351-bf2c5deb6124@5100000", pai_dir="/data/pai")
    ticks = TickAssembler(source, start_s=0.0, duration_s=None, warn=print)
    for tick in ticks:            # alpamayo.replay.ticks.Tick, in time order
        tick.t0_ns                # the tick's time, integer ns on the drive's clock (PAI: clip µs x 1000)
        tick.frames               # camera index -> 4 RecordedFrame, oldest first; .rgb() decodes (HxWx3 uint8)
        tick.ego_history          # EgoHistory: 16 poses at t0 - 1.5 .. 0 s, world frame
        tick.future               # (xyz [64, 3] m, heading [64] rad) in the t0 ego frame, or None
    ticks.skipped                 # Counter: ticks skipped mid-drive, by reason
    source.skipped                # Counter: messages / frames the reader skipped, by reason
    source.describe()             # DriveDescription: cameras, rates, duration, ego source (`alpamayo drive-info`)
    source.close()

`open_drive(spec, layout=None, pai_dir=None, cameras=None, warn=print)`:
  * a path to an MCAP file: rosbag2 when its schemas are `ros2msg` (CDR messages), else Foxglove;
    `layout` (a `RecordingLayout`) maps topics to camera indices (default: the file's own layout record for
    Foxglove, Autoware's topic names for rosbag2; see docs/recordings.md);
  * `pai:CLIP_ID` (10 Hz ticks over the clip) or `pai:CLIP_ID@T0_US` (the single tick NVIDIA's evaluation uses)
    with `pai_dir` the dataset's local tree, read through the `physical-ai-av` devkit offline; `cameras`
    (camera indices) picks the clip's cameras (default Alpamayo's 0, 1, 2, 6).
Bad input raises `RecordingError` (a ValueError) naming the file, topic, clip or camera and what is allowed.

Every source satisfies `DriveSource`; the readers live in `bridges.drives.mcap` (Foxglove),
`bridges.drives.rosbag2` and `bridges.drives.pai`; what they share (layout, recorded frames, pose track, errors)
in `bridges.drives.recording`. The package also writes drives: `mcap_writer` (`RecordingWriter`) with the message
schemas and codecs of `mcap_messages` and the ROS 2 definitions of `ros2_messages`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from mcap.records import Channel, Message, Schema

from bridges.drives.description import CameraDescription, DriveDescription
from bridges.drives.mcap import Drive
from bridges.drives.recording import RecordedFrame, RecordingError, RecordingLayout, Warn

__all__ = ["CameraDescription", "DriveDescription", "DriveSource", "open_drive", "parse_pai_spec"]

PAI_PREFIX = "pai:"


class DriveSource(Protocol):
    """What every drive reader provides (see the module docstring for how to use one).

    kind: "foxglove", "rosbag2" or "pai"; spec: how the drive was named; path: its file or dataset directory;
    layout: the cameras in use (the first is the tick reference); poses: the recorded ego track (world frame,
    `interpolate(times_ns) -> (xyz [M, 3], quat_xyzw [M, 4]) | None`); tick_times_ns: fixed tick times (PAI)
    or None when ticks follow the reference camera's frames; skipped: what the reader skipped, by reason.
    The attributes are read-only here (properties): a reader may hold them as plain attributes or properties.
    """

    @property
    def kind(self) -> str: ...
    @property
    def spec(self) -> str: ...
    @property
    def path(self) -> Path: ...
    @property
    def layout(self) -> RecordingLayout: ...
    @property
    def poses(self) -> Any: ...
    @property
    def tick_times_ns(self) -> np.ndarray | None: ...
    @property
    def skipped(self) -> Counter: ...

    def frames(self, start_ns: int | None = None, end_ns: int | None = None) -> Iterator[RecordedFrame]:
        """Camera frames with start_ns <= t_ns < end_ns in time order, not yet decoded."""
        ...

    def window_frames(self, t0_ns: int) -> dict[int, list[RecordedFrame]]:
        """Fixed-tick sources: each camera's 4 frames for the tick at t0_ns (raises FrameError)."""
        ...

    def frame_size(self, start_ns: int | None = None, end_ns: int | None = None) -> tuple[int, int] | None:
        """(height, width) of the first frame in the range that decodes (None: none does)."""
        ...

    def raw_messages(self, start_ns: int, end_ns: int) -> Iterator[tuple[Schema, Channel, Message]]:
        """The recorded messages in [start_ns, end_ns), undecoded, for copying into outputs (none for PAI)."""
        ...

    def describe(self) -> DriveDescription: ...

    def close(self) -> None: ...


def parse_pai_spec(spec: str) -> tuple[str, int | None]:
    """(clip id, t0 µs or None) of `pai:CLIP_ID[@T0_US]`."""
    body = spec[len(PAI_PREFIX) :]
    clip, _, t0 = body.partition("@")
    if not clip:
        raise RecordingError(f"{spec!r}: expected pai:CLIP_ID or pai:CLIP_ID@T0_US")
    if not t0:
        return clip, None
    if not t0.isdigit():
        raise RecordingError(f"{spec!r}: T0_US {t0!r} must be a non-negative integer (microseconds)")
    return clip, int(t0)


def open_drive(
    spec: str | Path,
    layout: RecordingLayout | None = None,
    pai_dir: str | Path | None = None,
    cameras: Sequence[int] | None = None,
    warn: Warn = print,
) -> DriveSource:
    """Open a recorded drive of any kind (see the module docstring)."""
    text = str(spec)
    if text.startswith(PAI_PREFIX):
        if layout is not None:
            raise RecordingError(f"{text}: --layout maps MCAP topics; a PhysicalAI-AV clip takes --cameras")
        if pai_dir is None:
            raise RecordingError(
                f"{text}: a PhysicalAI-AV clip needs --pai-dir DIR (the dataset's local tree)"
            )
        from bridges.drives.pai import PaiClip

        clip, t0_us = parse_pai_spec(text)
        return PaiClip.open(Path(pai_dir), clip, t0_us, cameras, warn)
    if cameras is not None:
        raise RecordingError(
            f"{text}: --cameras picks a PhysicalAI-AV clip's cameras; an MCAP drive's come from --layout"
        )
    path = Path(text)
    from bridges.drives.rosbag2 import Rosbag2Drive, is_rosbag2

    if is_rosbag2(path):
        return Rosbag2Drive.open(path, layout, warn)
    return Drive.open(path, layout, warn)
