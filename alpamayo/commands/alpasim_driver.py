"""`alpamayo alpasim-driver`: the model as an AlpaSim policy (egodriver.EgodriverService over gRPC)."""

from __future__ import annotations

import argparse
import signal

from alpamayo.commands.common import add_model_args, add_request_args, load_vla
from bridges.alpasim.selection import SELECTIONS
from bridges.alpasim.service import DEFAULT_CAMERAS, EgodriverService, Limits, serve


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "alpasim-driver", help="serve the model to AlpaSim over gRPC (egodriver.EgodriverService)"
    )
    add_model_args(p)
    p.add_argument(
        "--listen", default="127.0.0.1:6789", help="HOST:PORT or unix:PATH (default 127.0.0.1:6789)"
    )
    # No --seed: each drive's seed is the AlpaSim session's random_seed plus its drive count.
    add_request_args(p, seed=False)
    p.add_argument(
        "--selection",
        choices=SELECTIONS,
        default="ALWAYS_FIRST",
        help="which of the --samples plans is driven (AlpaSim's strategies; CLOSEST_*: nearest the last plan)",
    )
    p.add_argument(
        "--cameras",
        default=",".join(DEFAULT_CAMERAS),
        help="comma-separated AlpaSim logical ids the model sees (default: Alpamayo 1.5's four)",
    )
    p.add_argument("--max-sessions", type=int, default=Limits.max_sessions, help="open sessions at most")
    p.add_argument(
        "--frames-per-camera",
        type=int,
        default=Limits.frames_per_camera,
        help="frames kept per camera at most (0.4 s are kept: 17 frames at 40 Hz)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    vla = load_vla(args)
    limits = Limits(max_sessions=args.max_sessions, frames_per_camera=args.frames_per_camera)
    service = EgodriverService(
        vla, vla.model_line(), args.samples, args.selection, tuple(args.cameras.split(",")), limits
    )
    server, port = serve(service, args.listen)
    print(f"alpasim-driver: {vla.model_line()} listening on {args.listen} (port {port})", flush=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: service.stop_requested.set())
    try:
        service.stop_requested.wait()
    finally:
        server.stop(grace=1.0).wait()
        vla.close()
    return 0
