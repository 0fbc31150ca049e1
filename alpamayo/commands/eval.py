"""`alpamayo eval SOURCES... | --clips LIST --checkpoint DIR --out RUN_DIR`: open-loop evaluation over many
clips (NVIDIA's protocol: K = 6 samples, minADE_K over XY at 6.4 s), in-process or on Ray."""

from __future__ import annotations

import argparse
from pathlib import Path

from alpamayo.commands.common import add_model_args, add_request_args, run_fields
from alpamayo.commands.replay_args import (
    add_drive_source_args,
    add_route_args,
    drive_source_fields,
    route_fields,
)
from alpamayo.eval.clips import collect_clips
from alpamayo.eval.report import report_table
from alpamayo.eval.session import run_eval
from alpamayo.eval.settings import LOCAL_RAY, EvalSettings
from alpamayo.families.registry import REFERENCE_SAMPLING

# NVIDIA's evaluation samples 6 trajectories with its released models' settings, temperature 0.6, top-p 0.98
# (alpamayo1.5 test_inference.py).
PROTOCOL_DEFAULTS = {
    "samples": 6,
    "temperature": REFERENCE_SAMPLING.temperature,
    "top_p": REFERENCE_SAMPLING.top_p,
    "seed": 0,
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate the model over many clips (minADE_K, ADE/FDE per horizon), in-process or on Ray",
    )
    p.add_argument(
        "sources",
        nargs="*",
        help="drives: a Foxglove or rosbag2 .mcap (one clip at its first tick) or pai:CLIP_ID@T0_US (--pai-dir)",
    )
    p.add_argument(
        "--clips",
        type=Path,
        default=None,
        help="clip list (.parquet or .csv): columns drive [, t0_us, clip_id], or clip_id, t0_us for "
        "PhysicalAI-AV clips (see docs/eval.md)",
    )
    add_drive_source_args(p)
    add_route_args(p)
    p.add_argument("--out", type=Path, required=True, help="run directory: per-clip results and the report")
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N clips only")
    p.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL_RAY,
        default=None,
        metavar="ADDRESS",
        help="run on Ray: no ADDRESS starts an embedded local Ray; `auto` or ray://HOST:10001 joins a cluster "
        "(default: in this process)",
    )
    p.add_argument("--workers", type=int, default=None, help="Ray workers, each with its own model")
    p.add_argument("--cpus-per-worker", type=int, default=None, help="CPUs per CPU-backend worker")
    p.add_argument(
        "--max-retries", type=int, default=2, help="re-runs of a clip whose worker process died (default 2)"
    )
    p.add_argument("--worst", type=int, default=6, help="bird's-eye views of the N worst clips (default 6)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_model_args(p)
    add_request_args(p)
    p.set_defaults(handler=run, **PROTOCOL_DEFAULTS)


def run(args: argparse.Namespace) -> int:
    clips = collect_clips(args.sources, args.clips, args.limit)
    settings = EvalSettings(
        **run_fields(args),
        worst=args.worst,
        **drive_source_fields(args, resolve=True),
        **route_fields(args, resolve=True),
        num_samples=args.samples,
        seed=args.seed,
    )
    evaluation = run_eval(settings, clips)
    print(report_table(evaluation.document))
    print(f"wrote {args.out / 'report.json'}")
    return 1 if evaluation.failed else 0
