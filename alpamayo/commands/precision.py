"""`alpamayo precision`: what each precision recipe costs, on the CPU (no card, no ttnn needed).

    alpamayo precision --checkpoint DIR [--base-model DIR]
                       [--recipe accuracy --recipe performance --recipe FILE.yaml]
                       [--quant int8 --quant int4-g32 --quant int4-g64 --quant int4-g128 [--quant-head]]
                       [--drive DRIVE.mcap | --drive pai:CLIP[@T0_US] --pai-dir DIR] [--golden]
                       [--json REPORT.json]

Prints a table (per recipe, the ttnn ones emulated and the torch backend's weight-only ones run: worst
per-layer PCC, final-logit PCC, teacher-forced top-1 agreement, vision tower PCC, the action expert's velocity
PCC and waypoint drift, with a drive the trajectory token agreement, ADE drift and eval-style minADE
difference, and the memory plan) and the per-layer figures; `--golden` adds, per ttnn recipe, a row of the
figures its device programs compute in the ttnn golden mode; `--json` writes the same report as JSON. See
`alpamayo.precision.report`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from alpamayo.commands.common import BASE_MODEL_HELP, RECIPE_HELP
from alpamayo.commands.replay_args import DRIVE_HELP, add_drive_source_args, drive_source_fields
from alpamayo.precision.report import precision_report
from alpamayo.precision.settings import Settings
from alpamayo.quant import GROUP_SIZES, QuantRecipe

DEFAULT_RECIPES = ("accuracy", "performance")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "precision",
        help="compare ttnn precision recipes and torch --quant recipes on the CPU: layer/logit PCC, top-1, "
        "expert velocity PCC, drive drift, eval minADE, memory",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (HF or Alpamayo layout)")
    p.add_argument("--base-model", default=None, help=BASE_MODEL_HELP)
    p.add_argument(
        "--recipe",
        action="append",
        help=f"{RECIPE_HELP}; repeat to compare several (default, without --quant: "
        f"{', '.join(DEFAULT_RECIPES)})",
    )
    p.add_argument(
        "--quant",
        action="append",
        help="a torch backend weight-only recipe to compare too: int8, int4 (group 128) or "
        f"{', '.join(f'int4-g{g}' for g in GROUP_SIZES)}; repeat for several",
    )
    p.add_argument("--quant-head", action="store_true", help="--quant: quantise the LM head too")
    p.add_argument("--drive", help=f"{DRIVE_HELP}: also compare trajectories on its first ticks")
    add_drive_source_args(p)
    d = Settings()
    p.add_argument("--ticks", type=int, default=d.ticks, help="drive ticks to predict per model")
    p.add_argument(
        "--max-reasoning-tokens",
        type=int,
        default=d.max_reasoning_tokens,
        help="reasoning cap per drive tick",
    )
    p.add_argument(
        "--prompt-tokens", type=int, default=d.prompt_tokens, help="prompt tokens (driving corpus)"
    )
    p.add_argument("--tokens", type=int, default=d.tokens, help="greedy continuation tokens (teacher-forced)")
    p.add_argument(
        "--max-seq-len", type=int, default=d.max_seq_len, help="KV cache positions of the DRAM plan"
    )
    p.add_argument(
        "--eval-samples",
        type=int,
        default=d.eval_samples,
        help="with --drive: samples K of the eval-style minADE (alpamayo eval's default); torch GPU plan rows",
    )
    p.add_argument(
        "--golden",
        action="store_true",
        help="also run each ttnn recipe's device programs in the ttnn golden mode (ttnn's golden functions "
        "on the host; needs ttnn, no card) and show their figures beside the emulation's",
    )
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.set_defaults(handler=run)


def json_destination(spec: str | None) -> Path | None:
    """The `--json` file, its directory created: checked before the models run, so a bad path loses
    nothing."""
    if spec is None:
        return None
    path = Path(spec)
    if path.is_dir():
        raise ValueError(f"--json {spec!r} is a directory; give a file name for the JSON report")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--json {spec!r}: cannot create its directory {str(path.parent)!r} ({e})") from e
    return path


def run(args: argparse.Namespace) -> int:
    json_path = json_destination(args.json)
    settings = Settings(
        prompt_tokens=args.prompt_tokens,
        tokens=args.tokens,
        ticks=args.ticks,
        max_reasoning_tokens=args.max_reasoning_tokens,
        max_seq_len=args.max_seq_len,
        eval_samples=args.eval_samples,
    )
    quants = [QuantRecipe.parse(q, args.quant_head) for q in args.quant or ()]
    if args.quant_head and not quants:
        raise ValueError("--quant-head applies to the --quant recipes; give at least one --quant")
    report = precision_report(
        args.checkpoint,
        args.recipe or ([] if quants else DEFAULT_RECIPES),
        settings,
        args.drive,
        warn=lambda message: print(f"alpamayo precision: warning: {message}", file=sys.stderr),
        **drive_source_fields(args),
        base_model=args.base_model,
        progress=lambda message: print(f"alpamayo precision: {message}", file=sys.stderr, flush=True),
        quants=quants,
        golden=args.golden,
    )
    print(report.table())
    if json_path is not None:
        json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return 0
