"""Arguments shared by several sub-commands."""

from __future__ import annotations

import argparse

from alpamayo.devices import DTYPES, resolve_device

__all__ = ["DTYPES", "add_model_args", "resolve_device"]


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (HF or Alpamayo layout)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weights and activations")
    parser.add_argument("--device", default="cpu", help="torch device: cpu or cuda[:N]")
