"""`alpamayo node-ctl`: status, reset or shutdown of a running node over its control socket."""

from __future__ import annotations

import argparse
import json

from alpamayo.commands.curve_client import add_curve_client_args, curve_client_keys
from bridges.wire.client import ControlClient
from bridges.wire.protocol import CONTROL_COMMANDS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("node-ctl", help="query or command a running node (status, reset, shutdown)")
    p.add_argument("command", choices=CONTROL_COMMANDS)
    p.add_argument("--control", default="tcp://127.0.0.1:5557", help="the node's control endpoint")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the reply")
    add_curve_client_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with ControlClient(args.control, args.timeout, curve=curve_client_keys(args)) as client:
        try:
            reply = client.request(args.command)
        except TimeoutError as e:
            print(f"alpamayo node-ctl: {e}")
            return 1
    print(json.dumps(reply, indent=2))
    return 0 if reply.get("ok") else 1
