"""The `alpamayo` console script. Each sub-command lives in its own module under `alpamayo.commands`
and exposes `register(subparsers)`; the registered handler takes the parsed args and returns an exit code."""

from __future__ import annotations

import argparse
import importlib
import sys

from alpamayo.errors import BackendUnavailable, CheckpointError, ConfigError

COMMANDS = [
    "alpamayo.commands.generate",
    "alpamayo.commands.make_demo_checkpoint",
    "alpamayo.commands.predict",
    "alpamayo.commands.ask",
    "alpamayo.commands.make_demo_drive",
    "alpamayo.commands.replay",
    "alpamayo.commands.profile",
    "alpamayo.commands.demo",
    "alpamayo.commands.plan",
    "alpamayo.commands.precision",
    "alpamayo.commands.serve",
    "alpamayo.commands.camera_sim",
    "alpamayo.commands.node_ctl",
    "alpamayo.commands.curve_keys",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="alpamayo", description="Alpamayo-style driving VLA inference stack"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ConfigError, CheckpointError, ValueError, BackendUnavailable) as e:
        print(f"alpamayo {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
