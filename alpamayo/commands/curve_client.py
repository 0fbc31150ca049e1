"""The CURVE client flags of the commands that talk to a node (`node-ctl`, `camera-sim`). Light on purpose:
`node-ctl` imports nothing heavier than pyzmq and msgpack, so a health check or a `shutdown` takes a fraction
of a second."""

from __future__ import annotations

import argparse

from bridges.wire.sockets import CurveClientKeys


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
