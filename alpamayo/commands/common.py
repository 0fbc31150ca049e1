"""Arguments shared by several sub-commands."""

from __future__ import annotations

import argparse

from alpamayo.devices import DTYPES, resolve_device
from bridges.sockets import CurveClientKeys

__all__ = ["DTYPES", "add_curve_client_args", "add_model_args", "curve_client_keys", "resolve_device"]


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (HF or Alpamayo layout)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weights and activations")
    parser.add_argument("--device", default="cpu", help="torch device: cpu or cuda[:N]")


def add_curve_client_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--curve-key", help="CURVE: this client's NAME.key_secret file (enables CURVE)")
    parser.add_argument("--curve-server-key", help="CURVE: the node's public NAME.key file")


def curve_client_keys(args: argparse.Namespace) -> CurveClientKeys | None:
    """The CURVE client keys named by --curve-key/--curve-server-key, or None when CURVE is off."""
    if (args.curve_key is None) != (args.curve_server_key is None):
        raise ValueError("--curve-key and --curve-server-key must be given together")
    if args.curve_key is None:
        return None
    return CurveClientKeys.from_files(args.curve_key, args.curve_server_key)
