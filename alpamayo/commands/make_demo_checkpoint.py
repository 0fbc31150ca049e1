"""`alpamayo make-demo-checkpoint OUT [--layout L] [--seed S]`: write a tiny random checkpoint (offline), in the
project's layout or laid out as a released Alpamayo ships (R1 and 1.5 also write their base model)."""

from __future__ import annotations

import argparse

from alpamayo.config.loader import load_model_config, model_tokenizer
from alpamayo.demo_checkpoint import token_layout
from alpamayo.demo_release import LAYOUTS, make_demo_checkpoint


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "make-demo-checkpoint",
        help="write a tiny random-weight checkpoint in the demo or a released Alpamayo layout (deterministic)",
    )
    p.add_argument("out", help="new or empty output directory")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0); same seed, same bytes")
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="alpamayo1.5",
        help="demo (the project's layout), r1, alpamayo1.5 (default) or super: files and key names as that "
        "release ships them",
    )
    p.add_argument(
        "--base-model-out",
        default=None,
        help="r1 / alpamayo1.5: where the base model goes (default: OUT-base beside OUT)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    out = make_demo_checkpoint(args.out, args.seed, args.layout, args.base_model_out)
    cfg = load_model_config(out)
    print(f"wrote the demo checkpoint ({cfg.family.title} layout, seed {args.seed}) to {out}")
    if cfg.base_model is not None:
        print(f"  base model (vlm_name_or_path): {cfg.base_model}")
    for what, first, last in token_layout(model_tokenizer(cfg), cfg.family.history_first):
        print(f"  ids {first:>5}..{last:<5} {what}")
    return 0
