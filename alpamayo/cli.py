"""The `alpamayo` console script. Each sub-command lives in its own module under `alpamayo.commands`
and exposes `register(subparsers)`; the registered handler takes the parsed args and returns an exit code."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from alpamayo.commands.stop_signals import StopSignals
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


# Commands that run until stopped: SIGINT and SIGTERM are theirs from main's first line, before any command
# module is imported (`alpamayo.commands.stop_signals`).
SERVICES = ("serve",)


def command_name(module: str) -> str:
    """The sub-command a module of COMMANDS registers: its name with dashes ("node-ctl" for node_ctl)."""
    return module.rsplit(".", 1)[1].replace("_", "-")


def build_parser(modules: Sequence[str] = COMMANDS) -> argparse.ArgumentParser:
    """The parser of the sub-commands of `modules` (default: all)."""
    parser = argparse.ArgumentParser(
        prog="alpamayo", description="Alpamayo-style driving VLA inference stack"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in modules:
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
    argv = sys.argv[1:] if argv is None else list(argv)
    signals = StopSignals(f"alpamayo {argv[0]}").install() if argv[:1] and argv[0] in SERVICES else None
    try:
        # Only the named command's module is imported: `node-ctl` then loads pyzmq and msgpack, not torch
        # (0.3 s instead of 3 s). Anything else (--help, a typo) gets the parser of every command.
        named = [m for m in COMMANDS if argv[:1] == [command_name(m)]]
        args = build_parser(named or COMMANDS).parse_args(argv)
        args.stop_signals = signals
        results_only_on_stdout()
        if hasattr(args, "quant"):
            from alpamayo.commands.common import check_quant_backend

            check_quant_backend(args)
        return int(args.handler(args) or 0)
    except (ConfigError, CheckpointError, ValueError, BackendUnavailable) as e:
        print(f"alpamayo {args.command}: error: {e}", file=sys.stderr)
        return 2
    finally:
        if signals is not None:
            signals.restore()


if __name__ == "__main__":
    sys.exit(main())
