"""`alpamayo replay DRIVE --checkpoint DIR --out OUT.mcap`: a recorded drive through the model."""

from __future__ import annotations

import argparse
from pathlib import Path

from alpamayo.commands.replay_args import DRIVE_HELP, add_output_args, add_replay_args, settings_from_args
from alpamayo.replay.session import run_replay, summary


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a recorded drive through the model; write predictions as MCAP")
    p.add_argument("drive", help=DRIVE_HELP)
    p.add_argument("--out", type=Path, required=True, help="predictions (.mcap)")
    p.add_argument("--max-ticks", type=int, default=None, help="stop after this many ticks")
    p.add_argument("--warmup", type=int, default=0, help="ticks excluded from the statistics (default 0)")
    add_replay_args(p)
    add_output_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(
        args,
        args.drive,
        args.out,
        max_ticks=args.max_ticks,
        warmup=args.warmup,
        encoding=args.encoding,
        output_format=args.output_format,
        copy_inputs=not args.no_copy_inputs,
    )
    replayed = run_replay(settings)
    print(summary(replayed))
    print(f"wrote {args.out}")
    return 0
