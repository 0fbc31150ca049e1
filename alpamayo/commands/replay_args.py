"""Arguments shared by `alpamayo replay` and `alpamayo profile`, and their translation to ReplaySettings."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from alpamayo.commands.common import add_model_args, add_request_args, model_spec
from alpamayo.replay.settings import OUTPUT_FORMATS, ReplaySettings
from bridges.drives.mcap_messages import ENCODINGS


def add_replay_args(p: argparse.ArgumentParser, cameras_flag: str = "--cameras") -> None:
    add_model_args(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--lockstep",
        dest="mode",
        action="store_const",
        const="lockstep",
        help="every tick in order, no drops (default)",
    )
    mode.add_argument(
        "--realtime",
        dest="mode",
        action="store_const",
        const="realtime",
        help="drive the ZeroMQ node at the recorded pace x --speed; drops are measured",
    )
    p.set_defaults(mode="lockstep")
    p.add_argument(
        "--speed", type=float, default=None, help="real-time pace factor, with --realtime only (default 1)"
    )
    p.add_argument(
        "--start", type=float, default=0.0, help="seconds from the drive's first frame (default 0)"
    )
    p.add_argument(
        "--duration", type=float, default=None, help="seconds of drive to replay (default: to the end)"
    )
    add_drive_source_args(p, cameras_flag)
    add_route_args(p)
    add_request_args(p)
    p.add_argument("--trace", type=Path, default=None, help="write a Chrome/Perfetto trace JSON here")
    p.add_argument(
        "--json", type=Path, default=None, help="write the report (latency, decode, accuracy) here"
    )
    p.add_argument("--plots", type=Path, default=None, help="write PNG plots into this directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


DRIVE_HELP = "recorded drive: Foxglove or rosbag2 MCAP file, or pai:CLIP_ID[@T0_US] with --pai-dir"


def parse_cameras(text: str) -> tuple[int, ...]:
    """`--cameras 0,1,2,6` -> (0, 1, 2, 6)."""
    try:
        return tuple(int(c) for c in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--cameras {text!r}: expected camera indices like 0,1,2,6") from e


def add_drive_source_args(p: argparse.ArgumentParser, cameras_flag: str = "--cameras") -> None:
    """--layout, which maps an MCAP drive's topics, and --pai-dir and --cameras (`cameras_flag` where --cameras
    means something else), which open a PhysicalAI-AV clip: the arguments of `bridges.drives.open_drive`."""
    p.add_argument(
        "--layout", type=Path, default=None, help="YAML topic-to-camera layout (default: the drive's own)"
    )
    p.add_argument(
        "--pai-dir", type=Path, default=None, help="PhysicalAI-AV dataset directory, for pai:CLIP drives"
    )
    p.add_argument(
        cameras_flag,
        dest="pai_cameras",
        type=parse_cameras,
        default=None,
        help="PhysicalAI-AV camera indices, comma-separated (default: with a checkpoint, its family's driving "
        "cameras, 0,1,2,6 or Alpamayo 2 Super's 0,1,2,3,5,6; else 0,1,2,6)",
    )


def add_route_args(p: argparse.ArgumentParser) -> None:
    """--route and --route-file: the navigation text of each tick (alpamayo.replay.routes)."""
    routes = p.add_mutually_exclusive_group()
    routes.add_argument(
        "--route",
        default=None,
        help="navigation text for every tick ('Turn left in 20m'), or `auto`: per tick from the drive's own "
        "recorded path, with AlpaSim's route-to-text rule",
    )
    routes.add_argument(
        "--route-file",
        type=Path,
        default=None,
        help="CSV with columns t0_ns,route: each tick takes the last row at or before its t0",
    )


def route_fields(args: argparse.Namespace, resolve: bool = False) -> dict[str, Any]:
    """The fields `add_route_args` sets; `resolve` makes the file's path absolute (for Ray workers)."""
    route_file = args.route_file
    if resolve and route_file is not None:
        route_file = route_file.resolve()
    return dict(route=args.route, route_file=route_file)


def drive_source_fields(args: argparse.Namespace, resolve: bool = False) -> dict[str, Any]:
    """The fields `add_drive_source_args` sets, by the name ReplaySettings, EvalSettings and `precision_report`
    give them; `resolve` makes the paths absolute (eval's Ray workers do not run in this directory)."""

    def path(p: Path | None) -> Path | None:
        return p.resolve() if resolve and p is not None else p

    return dict(layout=path(args.layout), pai_dir=path(args.pai_dir), cameras=args.pai_cameras)


def settings_from_args(
    args: argparse.Namespace, drive: Path | str, out: Path | None, **overrides
) -> ReplaySettings:
    if args.speed is not None and args.mode != "realtime":
        raise ValueError(
            f"--speed {args.speed:g} applies to --realtime only; lock-step replays every tick as fast as the "
            "model answers"
        )
    return ReplaySettings(
        drive=drive,
        model=model_spec(args),
        out=out,
        mode=args.mode,
        speed=1.0 if args.speed is None else args.speed,
        start_s=args.start,
        duration_s=args.duration,
        num_samples=args.samples,
        seed=args.seed,
        trace=args.trace,
        json=args.json,
        plots=args.plots,
        progress=not args.no_progress,
        **drive_source_fields(args),
        **route_fields(args),
        **overrides,
    )


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        dest="output_format",
        choices=OUTPUT_FORMATS,
        default="foxglove",
        help="foxglove (default) or ros2: a rosbag2 MCAP with Autoware Trajectory, nav_msgs Path, String",
    )
    p.add_argument("--encoding", choices=ENCODINGS, default="protobuf", help="Foxglove message encoding")
    p.add_argument(
        "--no-copy-inputs",
        action="store_true",
        help="do not copy the replayed camera and pose topics into the output",
    )
