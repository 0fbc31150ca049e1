"""The inference node's own cost, model excluded, and the frame rate it ingests without drops.

Both parts run an intake-only node (`InferenceNode(None, ...)`: the real sockets, validation, windows and
outputs, no model) in this process and the camera simulator (`bridges.camera_sim`, what `alpamayo
camera-sim` runs) in a child process publishing 4 cameras over loopback TCP, so sender and node do not
share an interpreter.

1. Overhead per tick at 10 Hz: per frame `receive` (the recv call) and `decode` (header parse, validation,
   payload to an RGB array, ring update); per tick `window` (assembly), `serialise` and `publish`; the
   per-tick total is 4 x (receive + decode) + window + serialise + publish. Also the node process's CPU time
   per tick (all its threads: ZeroMQ I/O, intake, predict). The first window is warm-up and excluded.
   `vision.preprocess` of the 4 new frames (resize to 320x576, normalise, patchify) is timed separately: the
   runtime does it inside `predict`, but it is host work of every tick.
2. Sustained ingest: the sender's rate is stepped up; for each step the node's lost frames (frame_id gaps:
   dropped at a PUB high-water mark or never sent) and the MB/s it received. The highest step with no lost
   frame is the sustained ingest rate (bounded by the sender when it cannot reach its rate).

    python benchmarks/node_overhead.py [--width 1920 --height 1080] [--seconds 10] [--rates 10,20,40,80]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time

from alpamayo.demo_checkpoint import MAX_PIXELS, MIN_PIXELS
from alpamayo.profiling import Tracer
from alpamayo.profiling.stats import summarize
from bridges.camera_sim import CameraSim, SimStats, SyntheticCamera
from bridges.node.config import DEFAULT_CAMERAS, NodeConfig
from bridges.node.server import InferenceNode
from bridges.wire.client import ControlClient, FramePublisher
from vision.preprocess import PreprocessConfig, preprocess_images

LOOPBACK = "tcp://127.0.0.1:*"


def node_config(width: int, height: int) -> NodeConfig:
    return NodeConfig.from_dict(
        {
            "input": {"endpoints": [LOOPBACK]},
            "output": {"endpoint": LOOPBACK},
            "control": {"endpoint": LOOPBACK},
            "limits": {"max_width": width, "max_height": height},
            "warmup": {"runs": 0},
        }
    )


def _sim_process(
    endpoint: str, rate: float, seconds: float, width: int, height: int, encoding: str
) -> SimStats:
    with FramePublisher(endpoint) as publisher:
        if not publisher.wait_for_subscriber(10.0):
            raise RuntimeError(f"the node did not subscribe to {endpoint}")
        sim = CameraSim(publisher, list(DEFAULT_CAMERAS), width, height, rate_hz=rate, encoding=encoding)
        return sim.run(ticks=round(seconds * rate))


def run_sim(endpoint: str, rate: float, seconds: float, width: int, height: int, encoding: str) -> SimStats:
    """Run the camera simulator in a child process (its own interpreter and GIL); returns what it sent."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_sim_process, (endpoint, rate, seconds, width, height, encoding))


def describe(sim: SimStats) -> str:
    return f"{sim.frames} frames in {sim.seconds:.1f} s, {sim.mb_per_s:.0f} MB/s, {sim.late_ticks} late ticks"


def overhead(args: argparse.Namespace) -> dict:
    tracer = Tracer()
    node = InferenceNode(None, node_config(args.width, args.height), tracer).start()
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        sim = run_sim(node.endpoints["input"][0], 10.0, args.seconds, args.width, args.height, args.encoding)
        time.sleep(0.3)  # the last window
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        status = node.status()
    finally:
        node.stop()
    frame_bytes = args.width * args.height * 3  # receive spans of frames, not of ego poses
    stages = {
        "receive": [s.ms for s in tracer.spans if s.name == "receive" and s.args["bytes"] > frame_bytes],
        "decode": [s.ms for s in tracer.spans if s.name == "decode" and s.args["kind"] == "CameraFrame"],
        "window": tracer.durations_ms("window")[1:],  # the first window is warm-up (32-143 ms measured)
        "serialise": tracer.durations_ms("serialise"),
        "publish": tracer.durations_ms("publish"),
    }
    table = {k: summarize(k, v) for k, v in stages.items() if v}
    cameras = len(DEFAULT_CAMERAS)
    per_tick = cameras * (table["receive"].mean_ms + table["decode"].mean_ms) + sum(
        table[k].mean_ms for k in ("window", "serialise", "publish")
    )
    windows = len(stages["window"]) + 1
    return {
        "stages_ms": {k: row.as_dict() for k, row in table.items()},
        "per_tick_ms": per_tick,
        "cpu_ms_per_tick": cpu * 1e3 / max(windows, 1),
        "cpu_percent_of_one_core": 100 * cpu / wall,
        "windows": windows,
        "frame_bytes": frame_bytes,
        "lost_frames": sum(s["lost"] for n, s in status["streams"].items() if n != "ego"),
        "sender": describe(sim),
    }


def preprocess(args: argparse.Namespace) -> dict[str, float]:
    """`vision.preprocess` of one tick's 4 new frames (the host part of the model call, done in `predict`)."""
    frames = [SyntheticCamera(i, args.width, args.height).render(0.0) for i in range(len(DEFAULT_CAMERAS))]
    cfg = PreprocessConfig(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)  # Alpamayo's: 1080x1920 -> 320x576
    preprocess_images(frames, cfg)  # warm-up: resize tables
    times = []
    for _ in range(args.preprocess_reps):
        start = time.perf_counter()
        preprocess_images(frames, cfg)
        times.append((time.perf_counter() - start) * 1e3)
    return summarize("preprocess", times).as_dict()


def ingest(args: argparse.Namespace) -> list[dict]:
    steps = []
    for rate in (float(r) for r in args.rates.split(",")):
        node = InferenceNode(None, node_config(args.width, args.height)).start()
        try:
            sim = run_sim(
                node.endpoints["input"][0], rate, args.step_seconds, args.width, args.height, args.encoding
            )
            time.sleep(0.3)
            with ControlClient(node.endpoints["control"]) as control:
                status = control.status()
        finally:
            node.stop()
        streams = [s for n, s in status["streams"].items() if n != "ego"]
        received = sum(s["accepted"] for s in streams)
        lost = sum(s["lost"] for s in streams)
        frame_mb = args.width * args.height * 3 / 1e6
        steps.append(
            {
                "rate_hz_per_camera": rate,
                "offered_mb_s": rate * len(streams) * frame_mb,
                "sent_mb_s": sim.mb_per_s,
                "received_mb_s": received * frame_mb / sim.seconds,
                "frames_received": received,
                "frames_lost": lost,
                "rejected": status["counters"]["rejected_total"],
                "sender": describe(sim),
            }
        )
    return steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--encoding", default="rgb8", choices=["rgb8", "bgr8", "jpeg"])
    p.add_argument("--seconds", type=float, default=10.0, help="duration of the 10 Hz overhead run")
    p.add_argument("--rates", default="10,20,30,40,60", help="sender rates per camera for the ingest ramp")
    p.add_argument("--step-seconds", type=float, default=5.0)
    p.add_argument("--preprocess-reps", type=int, default=20)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    result = {"overhead": overhead(args), "preprocess_ms": preprocess(args), "ingest": ingest(args)}
    o, pre = result["overhead"], result["preprocess_ms"]
    print(
        f"## Node overhead per tick: 4 cameras {args.width}x{args.height} {args.encoding} at 10 Hz, model excluded"
    )
    print(f"sender: {o['sender']}")
    print("| stage | n | mean ms | p50 | p90 | max |")
    print("|---|---|---|---|---|---|")
    for name, s in o["stages_ms"].items():
        print(
            f"| {name} | {s['n']} | {s['mean_ms']:.3f} | {s['p50_ms']:.3f} | {s['p90_ms']:.3f} | {s['max_ms']:.3f} |"
        )
    print(
        f"per tick: {o['per_tick_ms']:.2f} ms of stage time (4 x (receive + decode) + window + serialise + "
        f"publish), {o['cpu_ms_per_tick']:.1f} ms CPU (all node threads), "
        f"{o['cpu_percent_of_one_core']:.0f}% of one core; {o['windows']} windows, {o['lost_frames']} lost frames"
    )
    print(
        f"vision preprocess of the 4 new frames (inside predict): mean {pre['mean_ms']:.1f} ms, "
        f"p90 {pre['p90_ms']:.1f}, max {pre['max_ms']:.1f} ({pre['n']} reps); node + preprocess per tick: "
        f"{o['per_tick_ms'] + pre['mean_ms']:.1f} ms"
        " of the 100 ms period"
    )
    print("\n## Sustained ingest without drops (loopback TCP)")
    print("| rate/camera Hz | offered MB/s | sent MB/s | received MB/s | lost frames | sender |")
    print("|---|---|---|---|---|---|")
    for s in result["ingest"]:
        print(
            f"| {s['rate_hz_per_camera']:g} | {s['offered_mb_s']:.0f} | {s['sent_mb_s']:.0f} | "
            f"{s['received_mb_s']:.0f} | {s['frames_lost']} | {s['sender']} |"
        )
    clean = [s for s in result["ingest"] if s["frames_lost"] == 0]
    if clean:
        best = max(clean, key=lambda s: s["received_mb_s"])
        print(f"sustained ingest without drops: {best['received_mb_s']:.0f} MB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
