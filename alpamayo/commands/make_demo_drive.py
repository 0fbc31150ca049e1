"""`alpamayo make-demo-drive OUT.mcap`: a synthetic multi-camera drive, deterministic from a seed."""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from alpamayo.demo_drive import CAMERA_PERIOD_NS, IMAGE_FORMATS, make_demo_drive
from bridges.drives.mcap_messages import ENCODINGS


def parse_size(text: str) -> tuple[int, int]:
    """'HEIGHTxWIDTH' (e.g. 1080x1920) -> (height, width)."""
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"size {text!r} must be HEIGHTxWIDTH, e.g. 1080x1920") from e
    return height, width


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "make-demo-drive", help="write a synthetic multi-camera drive (MCAP) with its ego trajectory"
    )
    p.add_argument("out", help="output .mcap path")
    p.add_argument(
        "--seconds", type=float, default=10.0, help="camera time; poses run 6.4 s further (default 10)"
    )
    p.add_argument("--cameras", type=int, default=4, help="1..7 cameras in Alpamayo's order (default 4)")
    p.add_argument("--seed", type=int, default=0, help="road, speed profile and traffic (default 0)")
    p.add_argument(
        "--size", type=parse_size, default=(1080, 1920), help="frame HEIGHTxWIDTH (default 1080x1920)"
    )
    p.add_argument(
        "--encoding", choices=ENCODINGS, default="protobuf", help="message encoding (default protobuf)"
    )
    p.add_argument(
        "--image-format", choices=IMAGE_FORMATS, default="jpeg", help="jpeg (CompressedImage) or raw"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    total = round(args.seconds * 1e9 / CAMERA_PERIOD_NS) * max(args.cameras, 0)
    with tqdm(total=total, unit="frame", desc="rendering", disable=None, file=sys.stderr) as bar:
        drive = make_demo_drive(
            args.out,
            seconds=args.seconds,
            cameras=args.cameras,
            seed=args.seed,
            size=args.size,
            encoding=args.encoding,
            image_format=args.image_format,
            progress=bar.update,
        )
    print(
        f"wrote {drive.path}: {drive.camera_frames} frames from cameras {list(drive.cameras)} at "
        f"{drive.size[0]}x{drive.size[1]}, {drive.poses} ego poses, {drive.bytes / 1e6:.1f} MB"
    )
    return 0
