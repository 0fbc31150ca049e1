"""`alpamayo plan`: DRAM budget and grid plan of the ttnn text backbone on one Blackhole p150 (no device)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alpamayo.commands.common import BASE_MODEL_HELP, MOE_CONFIG_HELP, RECIPE_HELP
from alpamayo.config import ModelConfig, load_config
from alpamayo.configs import NAMES, builtin_config
from alpamayo.moe.config import model_block_config
from alpamayo.tt.memory import DoesNotFit, check_fits, plan_memory
from alpamayo.tt.precision import load_precision
from alpamayo.tt.program_config import plan_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="DRAM and grid plan of the ttnn text backbone on a Blackhole p150")
    p.add_argument(
        "--checkpoint",
        required=True,
        help=f"checkpoint directory, or a built-in config name ({', '.join(NAMES)})",
    )
    p.add_argument("--base-model", default=None, help=BASE_MODEL_HELP)
    p.add_argument("--recipe", default="performance", help=RECIPE_HELP)
    p.add_argument("--max-seq-len", type=int, default=8192, help="KV cache positions (prompt + generated)")
    p.add_argument("--moe-config", default=None, help=MOE_CONFIG_HELP)
    p.set_defaults(handler=run)


def resolve_config(spec: str, base_model: str | None = None) -> ModelConfig:
    """A checkpoint directory's config (R1 / 1.5: with its base model), or a built-in config by name."""
    if Path(spec).exists():
        return load_config(spec, base_model)
    if spec in NAMES:
        return builtin_config(spec)
    raise ValueError(
        f"--checkpoint {spec!r}: no such directory and not a built-in config ({', '.join(NAMES)})"
    )


def run(args: argparse.Namespace) -> int:
    cfg = resolve_config(args.checkpoint, args.base_model)
    print(f"model family: {cfg.family.title} ({cfg.family.name})")
    precision = load_precision(args.recipe)
    # the block config a ttnn run would take, so its one-chip refusals (mesh, shared experts, bias) show here
    block = model_block_config(cfg.text, args.moe_config)
    grid = plan_text(cfg, precision, moe=block)
    print("\n".join(plan_memory(cfg, precision, args.max_seq_len).describe()))
    print("\n".join(grid.describe()))
    try:
        check_fits(cfg, precision, args.max_seq_len)
    except DoesNotFit as e:
        print(f"alpamayo plan: does not fit: {e}", file=sys.stderr)
        return 2
    return 0
