"""The `alpamayo` console script. Each sub-command lives in its own module under `alpamayo.commands`
and exposes `register(subparsers)`; the registered handler takes the parsed args and returns an exit code."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from alpamayo.errors import BackendUnavailable, CheckpointError, ConfigError

COMMANDS = [
    "alpamayo.commands.generate",
    "alpamayo.commands.make_demo_checkpoint",
    "alpamayo.commands.predict",
    "alpamayo.commands.ask",
    "alpamayo.commands.make_demo_drive",
    "alpamayo.commands.replay",
    "alpamayo.commands.drive_info",
    "alpamayo.commands.extract",
    "alpamayo.commands.profile",
    "alpamayo.commands.demo",
    "alpamayo.commands.eval",
    "alpamayo.commands.closed_loop",
    "alpamayo.commands.plan",
    "alpamayo.commands.precision",
    "alpamayo.commands.serve",
    "alpamayo.commands.camera_sim",
    "alpamayo.commands.node_ctl",
    "alpamayo.commands.curve_keys",
    "alpamayo.commands.alpasim_driver",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="alpamayo", description="Alpamayo-style driving VLA inference stack"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def results_only_on_stdout() -> None:
    """From now on, `sys.stdout` (the command's results: `--json` objects, reports) keeps the process's
    stdout, and whatever native code writes to file descriptor 1 goes to stderr instead: tt-metal prints its
    "Opening/Closing user mode device driver" lines there, on a card as on the dry run's mock, also when it
    tears the cluster down at exit, which broke the JSON of `generate --json --backend ttnn`. A stdout that is
    not file descriptor 1 (a test harness capturing it) is left alone: native writes cannot reach it."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError):  # io.UnsupportedOperation is an OSError
        return
    if fd != 1:
        return
    original = sys.stdout
    original.flush()
    buffering = 1 if original.line_buffering else -1  # line-buffered on a terminal, as Python's own stdout
    sys.stdout = os.fdopen(os.dup(1), "w", buffering, original.encoding, original.errors)
    os.dup2(2, 1)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    results_only_on_stdout()
    try:
        from alpamayo.commands.common import check_quant_backend  # loaded with the command modules

        check_quant_backend(args)
        return int(args.handler(args) or 0)
    except (ConfigError, CheckpointError, ValueError, BackendUnavailable) as e:
        print(f"alpamayo {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
