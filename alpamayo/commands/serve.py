"""`alpamayo serve`: the on-vehicle inference node (camera frames in over ZeroMQ, trajectories out)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

import yaml

from alpamayo.backends import BACKENDS, BackendOptions, check_num_samples
from alpamayo.commands.common import BASE_MODEL_HELP, RECIPE_HELP
from alpamayo.devices import DTYPES
from alpamayo.expert.decoding import DECODERS
from alpamayo.expert.sampler import FlowSettings
from alpamayo.reproducibility.mode import compute_on_one_thread
from alpamayo.runtime import AlpamayoVLA
from bridges.config import NodeConfig, load_node_config
from bridges.node import InferenceNode


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the inference node: frames in over ZeroMQ, trajectories out")
    p.add_argument("--checkpoint", help="checkpoint directory (overrides model.checkpoint)")
    p.add_argument("--base-model", help="overrides model.base_model (" + BASE_MODEL_HELP + ")")
    p.add_argument("--config", help="node YAML file (docs/protocol.md); keys it omits take their defaults")
    p.add_argument("--input", action="append", help="input endpoint (repeatable; overrides input.endpoints)")
    p.add_argument("--output", help="output endpoint (overrides output.endpoint)")
    p.add_argument("--control", help="control endpoint (overrides control.endpoint)")
    p.add_argument("--backend", choices=BACKENDS, help="overrides model.backend")
    p.add_argument("--recipe", help="overrides model.recipe (" + RECIPE_HELP + ")")
    p.add_argument("--device", help="overrides model.device (cpu, cuda[:N])")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="overrides model.dtype")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set timing.stale_after_ms=500 (repeatable)",
    )
    p.add_argument("--print-config", action="store_true", help="print the effective config and exit")
    p.add_argument("--decoder", choices=DECODERS, help="overrides model.decoder (expert or tokens)")
    p.add_argument("--flow-steps", type=int, help="overrides model.flow_steps (the expert's Euler steps)")
    p.add_argument("--flow-temperature", type=float, help="overrides model.flow_temperature")
    p.add_argument("--nav-guidance", type=float, help="overrides model.nav_guidance (needs model.route)")
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
        "model.checkpoint": args.checkpoint,
        "model.base_model": args.base_model,
        "input.endpoints": args.input,
        "output.endpoint": args.output,
        "control.endpoint": args.control,
        "model.backend": args.backend,
        "model.recipe": args.recipe,
        "model.device": args.device,
        "model.dtype": args.dtype,
        "model.decoder": args.decoder,
        "model.flow_steps": args.flow_steps,
        "model.flow_temperature": args.flow_temperature,
        "model.nav_guidance": args.nav_guidance,
    }
    return load_node_config(args.config, [*args.set, *((k, v) for k, v in flags.items() if v is not None)])


def run(args: argparse.Namespace) -> int:
    config = effective_config(args)
    print("# effective node config")
    print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="", flush=True)
    if args.print_config:
        return 0
    if config.model.checkpoint is None and not args.no_model:
        raise ValueError("no checkpoint: pass --checkpoint DIR or set model.checkpoint in the config")
    if not args.no_model:  # model.temperature null is the family's default, which config.json tells
        m = config.model
        check_num_samples(m.backend, m.num_samples, m.temperature, m.checkpoint, m.base_model)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
    # Signals are taken from here on, whatever is running: the model load happens on a worker thread so the
    # main thread stays free to act on them (a load is one long call into torch or ttnn that Python signal
    # handlers cannot interrupt).
    signalled = threading.Event()
    received: list[str] = []  # the signal's name, for the stderr line
    node: InferenceNode | None = None

    def on_signal(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        signalled.set()
        if node is not None:
            node.request_shutdown()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    model = None if args.no_model else _load_or_abandon(config, signalled, received)
    try:
        node = InferenceNode(model, config).start()
    except BaseException:
        _close(model)
        raise
    if signalled.is_set():
        node.request_shutdown()
    print(f"serving: {node.endpoints}", flush=True)
    while not node.wait(0.2):
        pass
    phase = node.phase
    finished = node.stop()
    cause = f"{received[0]} received" if received else "shutdown requested"
    if finished:
        print("stopped", flush=True)
        print(f"alpamayo serve: {cause}: stopped", file=sys.stderr, flush=True)
        _close(model)
        return 0
    print(f"stopped ({phase} abandoned)", flush=True)
    print(f"alpamayo serve: {cause}: stopped, {phase} abandoned", file=sys.stderr)
    _exit_now()


def _load_or_abandon(config: NodeConfig, signalled: threading.Event, received: list[str]) -> AlpamayoVLA:
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
    while loader.is_alive() and not signalled.wait(0.05):
        pass
    if signalled.is_set():
        print(
            f"alpamayo serve: {received[0]} received during model load: exiting, load abandoned",
            file=sys.stderr,
        )
        _exit_now()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _exit_now() -> None:
    """Exit 0 while a thread may still be inside torch (an abandoned load or prediction)."""
    # The abandoned work is still running in a daemon thread, inside torch (or on the ttnn device, which is
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
    m = config.model
    if m.reproducible:
        compute_on_one_thread()
    vla = AlpamayoVLA.from_checkpoint(
        m.checkpoint,
        BackendOptions(
            m.backend, m.dtype, m.device, m.recipe, m.tt_cache, m.moe_config, m.quant_recipe, m.quant_cache
        ),
        max_reasoning_tokens=m.max_reasoning_tokens,
        base_model=m.base_model,
        decoder=m.decoder,
        flow=FlowSettings(m.flow_steps, m.flow_temperature, m.nav_guidance),
        draft=m.draft,
    )
    vla.sampling = vla.sampling.override(m.temperature, m.top_p, m.top_k)
    print(vla.model_line(), flush=True)
    return vla
