"""`alpamayo serve`: the on-vehicle inference node (camera frames in over ZeroMQ, trajectories out)."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
import threading
from typing import NoReturn

import yaml

from alpamayo.commands.common import SPEC_KEYS, add_model_args
from alpamayo.commands.stop_signals import StopSignals
from alpamayo.runtime import AlpamayoVLA
from bridges.node.config import NodeConfig, load_node_config
from bridges.node.server import InferenceNode


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the inference node: frames in over ZeroMQ, trajectories out")
    p.add_argument("--config", help="node YAML file (docs/protocol.md); keys it omits take their defaults")
    p.add_argument("--input", action="append", help="input endpoint (repeatable; overrides input.endpoints)")
    p.add_argument("--output", help="output endpoint (overrides output.endpoint)")
    p.add_argument("--control", help="control endpoint (overrides control.endpoint)")
    add_model_args(p, overrides=True)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set timing.stale_after_ms=500 (repeatable)",
    )
    p.add_argument("--print-config", action="store_true", help="print the effective config and exit")
    p.add_argument(
        "--no-model",
        action="store_true",
        help="intake only, to check sensor wiring: validate and window the inputs, answer with valid=false",
    )
    p.add_argument("--quiet", action="store_true", help="log warnings only (no line per trajectory)")
    p.set_defaults(handler=run)


def effective_config(args: argparse.Namespace) -> NodeConfig:
    """Defaults < --config file < --set KEY=VALUE < the dedicated flags."""
    flags = {
        "input.endpoints": args.input,
        "output.endpoint": args.output,
        "control.endpoint": args.control,
        **{f"model.{key}": getattr(args, key) for key in SPEC_KEYS},
    }
    return load_node_config(args.config, [*args.set, *((k, v) for k, v in flags.items() if v is not None)])


def run(args: argparse.Namespace) -> int:
    """`args.stop_signals`: the SIGINT/SIGTERM handler `alpamayo.cli.main` installed before the imports."""
    signals: StopSignals = args.stop_signals
    config = effective_config(args)
    print("# effective node config")
    print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="", flush=True)
    if args.print_config:
        return 0
    if config.model.checkpoint is None and not args.no_model:
        raise ValueError("no checkpoint: pass --checkpoint DIR or set model.checkpoint in the config")
    if not args.no_model:  # model.temperature null is the family's default, which config.json tells
        config.model.check_samples(config.model.num_samples)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
    # From here a signal stops the node (or abandons the model load) instead of exiting at once. The load runs
    # on a worker thread so the main thread stays free to act on signals (a load is one long call into torch
    # or ttnn that Python signal handlers cannot interrupt).
    node: InferenceNode | None = None

    def stop_node(cause: str) -> None:
        if node is not None:
            node.request_shutdown(cause)

    signals.take_over(stop_node)
    model = None if args.no_model else _load_or_abandon(config, signals)
    try:
        node = InferenceNode(model, config).start()
    except BaseException:
        _close(model)
        raise
    if signals.received:
        node.request_shutdown(f"{signals.received[0]} received")
    print(f"serving: {node.endpoints}", flush=True)
    while not node.wait(0.2):
        pass
    finished = node.stop()
    cause = f"{signals.received[0]} received" if signals.received else "shutdown requested"
    stopped = "stopped" if node.interrupted is None else f"stopped, {node.interrupted}"
    print("stopped" if node.interrupted is None else f"stopped ({node.interrupted})", flush=True)
    print(f"alpamayo serve: {cause}: {stopped}", file=sys.stderr, flush=True)
    if finished:
        _close(model)
        _exit_now(clean=True)
    _exit_now()


def _load_or_abandon(config: NodeConfig, signals: StopSignals) -> AlpamayoVLA:
    """Load the model on a worker thread; on SIGINT/SIGTERM meanwhile, leave at once with exit 0."""
    result: list = []

    def load() -> None:
        try:
            result.append(load_model(config))
        except BaseException as e:  # re-raised on the main thread: bad checkpoints are CLI errors
            result.append(e)

    print(f"loading model from {config.model.checkpoint}", flush=True)
    loader = threading.Thread(target=load, name="serve-load", daemon=True)
    loader.start()
    while loader.is_alive() and not signals.event.wait(0.05):
        pass
    if signals.received:
        print(
            f"alpamayo serve: {signals.received[0]} received during model load: exiting, load abandoned",
            file=sys.stderr,
        )
        _exit_now()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _exit_now(clean: bool = False) -> NoReturn:
    """Exit 0 without finalising the interpreter: at once while a thread may still be inside torch (an
    abandoned load or prediction), or, `clean`, after the atexit handlers (logging's flush, pyzmq's, torch's)
    once everything is closed. Finalising tears down every imported module (torch, transformers, pandas, ...):
    2.8-3.2 s measured under load (importing alpamayo.commands.serve, then exiting), which a supervisor
    stopping the node would wait through, for nothing of ours."""
    if clean:
        atexit._run_exitfuncs()
    # Abandoned work is still running in a daemon thread, inside torch (or on the ttnn device, which is
    # therefore not closed). Finalising the interpreter under it aborts the process: on CPython 3.12 and 3.13
    # the thread, re-taking the GIL in the destructor of torch's `pybind11::gil_scoped_release`, is ended with
    # pthread_exit, and the forced unwind through that noexcept destructor calls std::terminate (SIGABRT,
    # exit 134; gdb backtrace on CPython 3.12.1, torch 2.14.1; CPython 3.14 hangs such threads instead,
    # gh-87135). A running load or prediction cannot be stopped from outside (one vision or prefill call is a
    # single long C++ call), so the bounded way out is to leave without finalising. Every socket is closed and
    # stdout, which the log goes to, is flushed; no atexit handler of ours is skipped.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _close(model: AlpamayoVLA | None) -> None:
    """Release the model's device (ttnn); a no-op for torch and for an intake-only node."""
    if model is not None:
        model.close()


def load_model(config: NodeConfig) -> AlpamayoVLA:
    vla = AlpamayoVLA.from_spec(config.model)
    print(vla.model_line(), flush=True)
    return vla
