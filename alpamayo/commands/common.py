"""Arguments shared by several sub-commands."""

from __future__ import annotations

import argparse

import torch

from bridges.sockets import CurveClientKeys

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (HF or Alpamayo layout)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weights and activations")
    parser.add_argument("--device", default="cpu", help="torch device: cpu or cuda[:N]")


def resolve_device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name}: supported devices are cpu and cuda")
    return device


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
