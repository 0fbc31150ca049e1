"""`alpamayo extract DRIVE (--t0 NS | --tick N) --out DIR`: one tick's inputs as the files `predict` reads."""

from __future__ import annotations

import argparse
from pathlib import Path

from alpamayo.commands.replay_args import DRIVE_HELP, add_drive_source_args
from alpamayo.replay.extract import extract_tick, find_tick
from alpamayo.replay.session import print_warning
from bridges.drives import open_drive
from bridges.drives.recording import RecordingLayout


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "extract", help="write one tick of a drive as a frames directory and ego.csv (predict's inputs)"
    )
    p.add_argument("drive", help=DRIVE_HELP)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--t0", type=int, default=None, help="the tick's t0, ns on the recording clock")
    which.add_argument("--tick", type=int, default=None, help="the tick's index (the replay's seq)")
    p.add_argument("--out", type=Path, required=True, help="directory for frames/ and ego.csv")
    add_drive_source_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; expected a directory")
    layout = None if args.layout is None else RecordingLayout.load(args.layout)
    drive = open_drive(args.drive, layout, args.pai_dir, args.pai_cameras, print_warning)
    try:
        tick = find_tick(drive, args.t0, args.tick, print_warning)
        frames, ego = extract_tick(tick, args.out)
    finally:
        drive.close()
    cameras = ",".join(str(c) for c in tick.frames)
    print(f"tick {tick.index} at t0 = {tick.t0_ns} ns, cameras {cameras}")
    print(f"wrote {frames}/ and {ego}")
    print(f"predict: alpamayo predict --checkpoint DIR --frames {frames} --ego {ego}")
    return 0
