"""Arguments shared by several sub-commands."""

from __future__ import annotations

import argparse

from alpamayo.devices import DTYPES, resolve_device

__all__ = ["DTYPES", "add_model_args", "add_sampling_args", "resolve_device"]


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (HF or Alpamayo layout)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weights and activations")
    parser.add_argument("--device", default="cpu", help="torch device: cpu or cuda[:N]")


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """How trajectories are sampled: `--samples`, `--temperature`, `--top-p`, `--seed`, `--max-reasoning-tokens`."""
    parser.add_argument("--samples", type=int, default=1, help="trajectory samples sharing one prefill")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy (default); Alpamayo uses 0.6"
    )
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, help="sampling seed (reproducible samples)")
    parser.add_argument("--max-reasoning-tokens", type=int, default=256)
