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

from alpamayo.backends import BACKENDS, BackendOptions, check_num_samples
from alpamayo.commands.common import BASE_MODEL_HELP, RECIPE_HELP, TT_MODES, guidance_arg
from alpamayo.commands.stop_signals import StopSignals
from alpamayo.config.flow import CHECKPOINT_GUIDANCE, FlowSettings
from alpamayo.devices import DTYPES
from alpamayo.expert.decoding import DECODERS
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
    p.add_argument("--tt-mode", choices=TT_MODES, help="overrides model.tt_mode (ttnn: device or golden)")
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
    p.add_argument(
        "--nav-guidance",
        type=guidance_arg,
        nargs="?",
        const=CHECKPOINT_GUIDANCE,
        metavar="W",
        help="overrides model.nav_guidance (needs model.route); without W the checkpoint's weight",
    )
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
        "model.tt_mode": args.tt_mode,
        "model.device": args.device,
        "model.dtype": args.dtype,
        "model.decoder": args.decoder,
        "model.flow_steps": args.flow_steps,
        "model.flow_temperature": args.flow_temperature,
        "model.nav_guidance": args.nav_guidance,
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
        m = config.model
        check_num_samples(m.backend, m.num_samples, m.temperature, m.checkpoint, m.base_model)
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
    m = config.model
    if m.reproducible:
        compute_on_one_thread()
    vla = AlpamayoVLA.from_checkpoint(
        m.checkpoint,
        BackendOptions(
            m.backend,
            m.dtype,
            m.device,
            m.recipe,
            m.tt_cache,
            m.moe_config,
            m.quant_recipe,
            m.quant_cache,
            m.tt_mode,
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
