"""`alpamayo closed-loop --checkpoint DIR --out RUN_DIR [--policy P,...] [--baselines] [--scenes N] [--scripted]
[--seconds S] [--ray [ADDRESS] --workers W]`: the model, and reference policies beside it, drive scenes of the
synthetic world closed-loop, scored with AlpaSim's metrics."""

from __future__ import annotations

import argparse
from pathlib import Path

from alpamayo.closed_loop.policies import BASELINES, POLICIES
from alpamayo.closed_loop.report import report_table
from alpamayo.closed_loop.runner import MAX_SCENES, ClosedLoopSettings, run_closed_loop
from alpamayo.commands.common import add_model_args, add_request_args, run_fields
from alpamayo.eval.settings import LOCAL_RAY


def _size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size {text!r}: expected HEIGHTxWIDTH, e.g. 320x576") from None
    return h, w


def _policies(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(
            f"--policy {text!r}: one or more of {', '.join(POLICIES)}, comma-separated, each once"
        )
    return names


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "closed-loop",
        help="drive synthetic scenes closed-loop (AlpaSim's metrics: scene_score, collision, off-road, ...)",
    )
    p.add_argument("--out", type=Path, required=True, help="run directory: per-scene results and the report")
    p.add_argument("--scenes", type=int, default=2, help=f"scenes to drive, 1..{MAX_SCENES} (default 2)")
    p.add_argument("--first-scene", type=int, default=0, help="seed of the first scene (default 0)")
    p.add_argument(
        "--scripted",
        action="store_true",
        help="also drive the scripted scenes on the first scene's seed: lead-brakes, curve, stopped-car",
    )
    p.add_argument(
        "--policy",
        type=_policies,
        default=("model",),
        help="who drives: model (needs --checkpoint), constant-velocity, stop, route (privileged: the road and "
        "the traffic's script); comma-separated for several (default model)",
    )
    p.add_argument(
        "--baselines",
        action="store_true",
        help=f"add the reference policies ({', '.join(BASELINES)}) to --policy, reported side by side",
    )
    p.add_argument("--seconds", type=float, default=4.0, help="closed-loop seconds per scene (default 4)")
    p.add_argument(
        "--size", type=_size, default=(320, 576), help="camera frames HEIGHTxWIDTH (default 320x576)"
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL_RAY,
        default=None,
        metavar="ADDRESS",
        help="run on Ray: no ADDRESS starts an embedded local Ray; `auto` or ray://HOST:10001 joins a cluster",
    )
    p.add_argument("--workers", type=int, default=None, help="Ray workers, each with its own model")
    p.add_argument("--cpus-per-worker", type=int, default=None, help="CPUs per CPU-backend worker")
    p.add_argument("--max-retries", type=int, default=2, help="re-runs of a scene whose worker process died")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_model_args(p, checkpoint_required=False)
    add_request_args(p)
    p.set_defaults(handler=run, seed=0)


def run(args: argparse.Namespace) -> int:
    policies = args.policy + tuple(b for b in BASELINES if args.baselines and b not in args.policy)
    settings = ClosedLoopSettings(
        **run_fields(args),
        scenes=args.scenes,
        first_scene=args.first_scene,
        scripted=args.scripted,
        policies=policies,
        seconds=args.seconds,
        size=args.size,
        num_samples=args.samples,
        seed=args.seed,
    )
    run_ = run_closed_loop(settings)
    print(report_table(run_.document))
    print(f"wrote {args.out / 'report.json'}")
    return 1 if run_.failed else 0
