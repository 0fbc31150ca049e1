"""Decode cost and peak memory of replaying a PhysicalAI-AV clip: a generated 20 s, 7-camera, 1080p, 30 fps clip
(H.264 by PyAV, as `tests/drive_layouts.py` writes the dataset layout), ticked at 10 Hz through
`bridges.drives.open_drive` + `TickAssembler`, every frame of every tick decoded (what lock-step replay does
before the model runs). Prints ms per decoded frame and the process's peak RSS before and after.

    PYTHONPATH=. python benchmarks/drive_sources.py [--seconds 20] [--cameras 7] [--size 1080x1920]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from alpamayo.replay.ticks import TickAssembler
from bridges.drives import open_drive
from tests.drive_layouts import CLIP, KnownDrive, write_pai


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--cameras", type=int, default=7)
    p.add_argument("--size", default="1080x1920")
    args = p.parse_args()
    h, w = (int(v) for v in args.size.split("x"))
    cameras = (1, 0, 2, 6, 3, 5, 4)[: args.cameras]
    t = time.perf_counter()
    known = KnownDrive(size=(h, w), frames=round(args.seconds * 30), cameras=cameras, gop=30, fps=30)
    with tempfile.TemporaryDirectory() as tmp:
        root = write_pai(Path(tmp) / "pai", known)
        known.decoded.clear()
        print(
            f"generated {args.seconds:g} s x {len(cameras)} cameras {w}x{h} in {time.perf_counter() - t:.0f} s; "
            f"MP4 {sum(len(m) for m in known.mp4.values()) / 2**20:.1f} MiB"
        )
        known.mp4.clear()
        before = peak_rss_mib()
        source = open_drive(f"pai:{CLIP}", pai_dir=root, cameras=sorted(cameras))
        frames = ticks = 0
        t = time.perf_counter()
        for tick in TickAssembler(source):
            frames += sum(not f.decoded for fs in tick.frames.values() for f in fs)
            for fs in tick.frames.values():
                for f in fs:
                    f.rgb()
            ticks += 1
        seconds = time.perf_counter() - t
        print(
            f"{ticks} ticks, {frames} frames decoded: {1e3 * seconds / frames:.1f} ms per frame, "
            f"{1e3 * seconds / ticks:.0f} ms per tick; peak RSS {before:.0f} MiB before opening, "
            f"{peak_rss_mib():.0f} MiB after"
        )


if __name__ == "__main__":
    main()
