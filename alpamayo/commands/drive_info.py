"""`alpamayo drive-info SOURCE`: what a recorded drive holds (cameras, rates, duration, ego source, ticks)."""

from __future__ import annotations

import argparse
import json
import sys

from alpamayo.commands.replay_args import DRIVE_HELP, add_drive_source_args
from alpamayo.replay.ticks import TickAssembler
from bridges.drives import open_drive
from bridges.drives.recording import RecordingLayout


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("drive-info", help="what a recorded drive holds: cameras, rates, duration, ego, ticks")
    p.add_argument("drive", help=DRIVE_HELP)
    add_drive_source_args(p)
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    def warn(message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)

    layout = None if args.layout is None else RecordingLayout.load(args.layout)
    source = open_drive(args.drive, layout, args.pai_dir, args.pai_cameras, warn)
    try:
        description = source.describe()
        # Assembling ticks reads messages and picks frames but decodes none, so counting them is cheap.
        assembler = TickAssembler(source, warn=lambda message: None)
        ticks = sum(1 for _ in assembler)
        skipped = {**dict(assembler.skipped), **dict(source.skipped)}
    finally:
        source.close()
    if args.json:
        print(json.dumps({**description.as_dict(), "ticks": ticks, "skipped": skipped}, indent=2))
        return 0
    print(description.table())
    print(f"  ticks: {ticks}" + (f" ({sum(skipped.values())} skipped)" if skipped else ""))
    for reason, n in skipped.items():
        print(f"    skipped {n} x {reason}")
    return 0
