"""`alpamayo make-demo-checkpoint OUT [--seed S]`: write the tiny embedded demo checkpoint (offline)."""

from __future__ import annotations

import argparse

from alpamayo.demo_checkpoint import make_demo_checkpoint, token_layout
from alpamayo.tokenizer import load_tokenizer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "make-demo-checkpoint",
        help="write a tiny random-weight Alpamayo-format checkpoint (deterministic per seed)",
    )
    p.add_argument("out", help="new or empty output directory")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0); same seed, same bytes")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    out = make_demo_checkpoint(args.out, args.seed)
    print(f"wrote the demo checkpoint (seed {args.seed}) to {out}")
    for what, first, last in token_layout(load_tokenizer(out)):
        print(f"  ids {first:>5}..{last:<5} {what}")
    return 0
