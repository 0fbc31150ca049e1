"""`alpamayo demo [--out DIR]`: the demo checkpoint, a synthetic drive and a lock-step replay, end to end.

Writes into DIR: checkpoint-seed<S>/ in the Alpamayo 1.5 layout with its base model checkpoint-seed<S>-base/
(kept and reused: they are deterministic per seed), drive.mcap, predictions.mcap, report.json, trace.json and
plots/; prints the accuracy and latency tables. The replay samples as Alpamayo does (temperature 0.6, top_p
0.98), seeded with --seed, so a rerun reproduces it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from alpamayo.commands.make_demo_drive import parse_size
from alpamayo.demo_drive import make_demo_drive
from alpamayo.demo_release import make_demo_checkpoint
from alpamayo.model_spec import ModelSpec
from alpamayo.replay.session import run_replay, summary
from alpamayo.replay.settings import ReplaySettings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="demo checkpoint + synthetic drive + lock-step replay, with reports")
    p.add_argument("--out", type=Path, default=Path("demo"), help="output directory (default ./demo)")
    p.add_argument(
        "--seconds", type=float, default=4.0, help="drive length; ticks start after 1.5 s (default 4)"
    )
    p.add_argument("--cameras", type=int, default=4, help="cameras (default 4)")
    p.add_argument(
        "--size", type=parse_size, default=(1080, 1920), help="frame HEIGHTxWIDTH (default 1080x1920)"
    )
    p.add_argument("--seed", type=int, default=0, help="checkpoint and drive seed (default 0)")
    # The demo model's random weights never close their reasoning, so every tick runs to this cap.
    p.add_argument("--max-reasoning-tokens", type=int, default=32, help="reasoning length cap (default 32)")
    p.add_argument(
        "--draft",
        default="lookup",
        help="speculative draft of the reasoning: none, lookup (default; the summary prints the mean "
        "accepted length), previous or dflash:DIR",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    checkpoint = out / f"checkpoint-seed{args.seed}"
    if (checkpoint / "config.json").is_file():
        print(f"using the demo checkpoint in {checkpoint}")
    else:
        make_demo_checkpoint(checkpoint, args.seed, layout="alpamayo1.5")
        print(f"wrote the demo checkpoint to {checkpoint}")
    drive = make_demo_drive(out / "drive.mcap", args.seconds, args.cameras, args.seed, args.size)
    print(f"wrote a {args.seconds:g} s drive, {drive.camera_frames} frames, to {drive.path}")
    settings = ReplaySettings(
        drive=drive.path,
        model=ModelSpec(
            checkpoint=checkpoint, max_reasoning_tokens=args.max_reasoning_tokens, draft=args.draft
        ),
        out=out / "predictions.mcap",
        warmup=1,  # the first tick encodes all 4 frames of every camera; later ticks only the newest
        seed=args.seed,
        trace=out / "trace.json",
        json=out / "report.json",
        plots=out / "plots",
    )
    replayed = run_replay(settings)
    print()
    print(summary(replayed))
    print(f"\nwrote {settings.out}, {settings.json}, {settings.trace} and {settings.plots}/")
    return 0
