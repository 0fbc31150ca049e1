"""`alpamayo curve-keys`: a CURVE key pair for the node or one of its clients."""

from __future__ import annotations

import argparse

from bridges.wire.sockets import create_keys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("curve-keys", help="write a CURVE key pair: DIR/NAME.key and DIR/NAME.key_secret")
    p.add_argument("directory")
    p.add_argument("--name", required=True, help="key name, e.g. node or camera-driver")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing pair (peers holding its public key lose access)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    public, secret = create_keys(args.directory, args.name, overwrite=args.force)
    print(f"public key: {public}\nsecret key: {secret} (mode 600; keep it on the host that uses it)")
    return 0
