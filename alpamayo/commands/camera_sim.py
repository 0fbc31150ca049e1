"""`alpamayo camera-sim`: synthetic multi-camera frames and ego poses published to a node's input."""

from __future__ import annotations

import argparse
import signal
import threading

from alpamayo.commands.curve_client import add_curve_client_args, curve_client_keys
from bridges.camera_sim import CameraSim, SyntheticDrive
from bridges.node.config import DEFAULT_CAMERAS
from bridges.wire.client import FramePublisher
from bridges.wire.protocol import ENCODINGS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("camera-sim", help="publish synthetic camera frames and ego poses to a node")
    p.add_argument("--endpoint", default="tcp://127.0.0.1:5555", help="the node's input endpoint")
    p.add_argument("--bind", action="store_true", help="bind the endpoint (the node connects) instead")
    p.add_argument(
        "--cameras",
        default=",".join(DEFAULT_CAMERAS),
        help="comma-separated camera names or indices, as configured on the node",
    )
    p.add_argument("--rate", type=float, default=10.0, help="frames per second per camera")
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--encoding", choices=ENCODINGS, default="rgb8")
    p.add_argument("--seconds", type=float, help="stop after this long (default: until Ctrl-C)")
    p.add_argument("--speed", type=float, default=10.0, help="ego speed, m/s")
    p.add_argument("--yaw-rate", type=float, default=0.02, help="ego yaw rate, rad/s")
    p.add_argument("--first-frame-id", type=int, default=0)
    p.add_argument(
        "--speedup", type=float, default=1.0, help="send ticks this many times faster than real time"
    )
    p.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the node to subscribe")
    add_curve_client_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    cameras = [int(c) if c.strip().isdigit() else c.strip() for c in args.cameras.split(",") if c.strip()]
    if not cameras:
        raise ValueError(f"--cameras {args.cameras!r} names no camera")
    for name, value, lo in (("--width", args.width, 1), ("--height", args.height, 1)):
        if value < lo:
            raise ValueError(f"{name} must be >= {lo}, got {value}")
    if args.seconds is not None and not 0 < args.seconds < float("inf"):
        raise ValueError(
            f"--seconds must be a finite number > 0 (or omitted: until Ctrl-C), got {args.seconds}"
        )
    with FramePublisher(args.endpoint, bind=args.bind, curve=curve_client_keys(args)) as pub:
        # Settings are checked (by CameraSim) before waiting for the node, so a bad one fails at once.
        sim = CameraSim(
            pub,
            cameras,
            args.width,
            args.height,
            rate_hz=args.rate,
            encoding=args.encoding,
            drive=SyntheticDrive(args.speed, args.yaw_rate),
            first_frame_id=args.first_frame_id,
            speedup=args.speedup,
        )
        ticks = None if args.seconds is None else max(1, round(args.seconds * args.rate))
        if not pub.wait_for_subscriber(args.wait):
            print(f"camera-sim: no subscriber on {args.endpoint} after {args.wait:g} s; publishing anyway")
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: stop.set())
        print(
            f"camera-sim: {len(cameras)} camera(s) {args.width}x{args.height} {args.encoding} at "
            f"{args.rate:g} Hz -> {pub.endpoint}",
            flush=True,
        )
        stats = sim.run(ticks, stop)
    print(
        f"camera-sim: sent {stats.ticks} ticks, {stats.frames} frames, {stats.bytes / 1e6:.1f} MB in "
        f"{stats.seconds:.1f} s ({stats.mb_per_s:.1f} MB/s, {stats.late_ticks} late ticks)"
    )
    return 0
