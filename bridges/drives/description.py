"""What a recorded drive holds, as `alpamayo drive-info` reports it: cameras, rates, span, ego source, ticks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


def rate_hz(times_ns: Sequence[int] | np.ndarray) -> float | None:
    """Mean rate of a strictly increasing time series (None with fewer than two times)."""
    if len(times_ns) < 2:
        return None
    return (len(times_ns) - 1) / ((int(times_ns[-1]) - int(times_ns[0])) / 1e9)


@dataclass(frozen=True)
class CameraDescription:
    """One camera of a drive: Alpamayo index and name, where it is read from, its frames, span and rate."""

    camera: int
    name: str
    source: str  # topic (MCAP) or video file (PAI)
    frames: int
    first_ns: int | None
    last_ns: int | None
    rate_hz: float | None
    detail: str = ""  # message type / encoding


@dataclass(frozen=True)
class DriveDescription:
    """What a drive holds (`alpamayo drive-info`): times in ns on the drive's clock, rates in Hz."""

    kind: str
    spec: str
    cameras: list[CameraDescription]
    ego_source: str
    ego_poses: int
    ego_first_ns: int
    ego_last_ns: int
    ego_rate_hz: float | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return (self.ego_last_ns - self.ego_first_ns) / 1e9

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "duration_s": self.duration_s}

    def table(self) -> str:
        lines = [
            f"{self.kind} drive {self.spec}",
            f"  ego: {self.ego_source}: {self.ego_poses} poses over {self.duration_s:.2f} s"
            + ("" if self.ego_rate_hz is None else f" ({self.ego_rate_hz:.1f} Hz)"),
            "  cameras:",
        ]
        for c in self.cameras:
            rate = "?" if c.rate_hz is None else f"{c.rate_hz:.1f} Hz"
            span = (
                "" if c.first_ns is None or c.last_ns is None else f", {(c.last_ns - c.first_ns) / 1e9:.2f} s"
            )
            detail = f" [{c.detail}]" if c.detail else ""
            lines.append(f"    {c.camera} {c.name}: {c.source}{detail}: {c.frames} frames, {rate}{span}")
        for key, value in self.extra.items():
            lines.append(f"  {key}: {value}")
        return "\n".join(lines)


def ego_fields(t_ns: np.ndarray) -> dict[str, Any]:
    """`DriveDescription`'s ego_poses, ego_first_ns, ego_last_ns and ego_rate_hz of the ego pose times t_ns [N]
    (ns, strictly increasing, N >= 2)."""
    return {
        "ego_poses": len(t_ns),
        "ego_first_ns": int(t_ns[0]),
        "ego_last_ns": int(t_ns[-1]),
        "ego_rate_hz": rate_hz(t_ns),
    }


def camera_descriptions(
    cameras: Sequence[tuple[int, str, str, str]], times: dict[int, list[int]]
) -> list[CameraDescription]:
    """CameraDescriptions of (index, name, source, detail) from each camera's frame times (ns)."""
    out = []
    for camera, name, source, detail in cameras:
        t = times.get(camera, [])
        out.append(
            CameraDescription(
                camera, name, source, len(t), t[0] if t else None, t[-1] if t else None, rate_hz(t), detail
            )
        )
    return out
