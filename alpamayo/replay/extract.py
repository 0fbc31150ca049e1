"""One tick of a recorded drive as the files `alpamayo predict` and `ask` read (`alpamayo extract`).

The tick is the lock-step replay's (`TickAssembler`, from the drive's first frame), chosen by its t0 on the
recording clock or by its index (the replay's `seq`); its frames are written decoded, as PNG, so `predict` on
the files sees the pixels, frame times and ego history the replay's prediction for that tick saw.
"""

from __future__ import annotations

from pathlib import Path

from alpamayo.inputs import write_ego_csv, write_frames
from alpamayo.replay.ticks import Tick, TickAssembler
from bridges.drives import DriveSource
from bridges.drives.recording import RecordingError, Warn

FRAMES_DIR = "frames"
EGO_CSV = "ego.csv"


def find_tick(
    drive: DriveSource, t0_ns: int | None = None, index: int | None = None, warn: Warn = print
) -> Tick:
    """The tick of `drive` at `t0_ns` or with `index` (exactly one given); RecordingError naming the nearest
    ticks when there is none."""
    if (t0_ns is None) == (index is None):
        raise ValueError("give exactly one of a tick's t0 (ns) and its index")
    if index is not None and index < 0:
        raise ValueError(f"--tick must be >= 0, got {index}")
    before: Tick | None = None
    count = 0
    for tick in TickAssembler(drive, warn=warn):
        count += 1
        if tick.index == index or tick.t0_ns == t0_ns:
            return tick
        if t0_ns is not None and tick.t0_ns > t0_ns:
            nearby = [t for t in (before, tick) if t is not None]
            raise RecordingError(
                f"drive {drive.spec} has no tick at t0 = {t0_ns} ns; the nearest: "
                + ", ".join(f"{t.t0_ns} (tick {t.index})" for t in nearby)
            )
        before = tick
    if index is not None:
        raise RecordingError(
            f"drive {drive.spec} has {count} tick(s) (0 .. {count - 1}); --tick {index} is not one"
        )
    last = "none" if before is None else f"{before.t0_ns} (tick {before.index})"
    raise RecordingError(f"drive {drive.spec} has no tick at t0 = {t0_ns} ns; its last tick: {last}")


def extract_tick(tick: Tick, out: Path) -> tuple[Path, Path]:
    """Write `tick` into `out`: FRAMES_DIR/<camera>/<start-of-frame ns>.png and EGO_CSV; returns both paths.
    Raises bridges.drives.recording.FrameError when a frame does not decode (nothing is written then)."""
    frames = {c: [(f.t_ns, f.rgb()) for f in fs] for c, fs in tick.frames.items()}
    out.mkdir(parents=True, exist_ok=True)
    write_frames(out / FRAMES_DIR, frames)
    write_ego_csv(out / EGO_CSV, tick.ego_history)
    return out / FRAMES_DIR, out / EGO_CSV
