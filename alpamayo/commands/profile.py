"""`alpamayo profile (DRIVE | --synthetic) --checkpoint DIR`: per-stage latency of the replay pipeline."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from alpamayo.commands.make_demo_drive import parse_size
from alpamayo.commands.replay_args import DRIVE_HELP, add_replay_args, settings_from_args
from alpamayo.demo_drive import CAMERA_PERIOD_NS, make_demo_drive
from alpamayo.input_window import HISTORY_OFFSETS_NS
from alpamayo.replay.report import latency_table
from alpamayo.replay.session import run_replay


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="per-stage latency table, Chrome trace, JSON report and plots")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("drive", nargs="?", help=DRIVE_HELP)
    source.add_argument("--synthetic", action="store_true", help="profile on a fresh synthetic drive")
    p.add_argument("--warmup", type=int, default=2, help="ticks run first and excluded (default 2)")
    p.add_argument("--iters", type=int, default=20, help="measured ticks (default 20)")
    p.add_argument("--cameras", type=int, default=4, help="synthetic drive cameras (default 4)")
    p.add_argument("--size", type=parse_size, default=(1080, 1920), help="synthetic frame HEIGHTxWIDTH")
    p.add_argument("--out", type=Path, default=None, help="also write the predictions (.mcap)")
    add_replay_args(p, cameras_flag="--pai-cameras")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.warmup < 0 or args.iters < 1:
        raise ValueError(f"--warmup must be >= 0 and --iters >= 1, got {args.warmup} and {args.iters}")
    ticks = args.warmup + args.iters
    with tempfile.TemporaryDirectory(prefix="alpamayo-profile-") as tmp:
        drive = args.drive
        if args.synthetic:
            # Enough frames for the 1.5 s history plus every tick, at the model's 10 Hz.
            frames = len(HISTORY_OFFSETS_NS) - 1 + ticks
            seconds = frames * CAMERA_PERIOD_NS / 1e9
            drive = make_demo_drive(Path(tmp) / "synthetic.mcap", seconds, args.cameras, size=args.size).path
        settings = settings_from_args(args, drive, args.out, max_ticks=ticks, warmup=args.warmup)
        profiled = run_replay(settings)
    if len(profiled.measured) < args.iters:
        print(
            f"note: the drive had {len(profiled.ticks)} usable ticks, fewer than --warmup + --iters = {ticks}"
        )
    print(latency_table(profiled))
    for label, path in (("trace", args.trace), ("report", args.json), ("plots", args.plots)):
        if path is not None:
            print(f"wrote {label}: {path}")
    return 0
