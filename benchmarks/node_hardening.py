"""The node under a stream of lying JPEGs: control-reply latency and peak memory of `alpamayo serve`.

Starts `alpamayo serve --no-model` (default config: 4 cameras, limits 3840x2160) as a child process on
loopback ports, sends it N JPEGs of 1.8 KB each whose header claims 3840x2160 (`tests.images.lying_jpeg`,
a decompression bomb: 24.9 MB each once decoded) back to back, spread over the 4 cameras with increasing
frame ids and times, and meanwhile asks `status` over the control socket in a loop. Reports the latency of
each control reply (first and worst), the time until the node has counted every bomb, how they were counted
(accepted / rejected by reason) and the serve process's resident memory before and at its peak (VmRSS,
VmHWM from /proc).

    python -m benchmarks.node_hardening [--bombs 64] [--set KEY=VALUE ...] [--json out.json]    (from the checkout root)

With `--load-seconds S`, a second run times `status` the same way for S seconds while `alpamayo camera-sim`
(a child process) streams 4 cameras of 1920x1080 rgb8 at `--load-rate` Hz, the node predicting nothing but
forming windows: the control latency under a legitimate load.

`--set` goes to `alpamayo serve`: `--set limits.max_jpeg_ratio=1000000` turns the ratio check off, and the
bombs are then rejected by the next one (a sequential JPEG needs 2 bits of entropy-coded data per block).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import time
from pathlib import Path

from bridges.client import ControlClient, FramePublisher
from bridges.config import DEFAULT_CAMERAS
from bridges.protocol import encode_frame
from tests.images import lying_jpeg

LOOPBACK = "tcp://127.0.0.1:*"
WIDTH, HEIGHT = 3840, 2160
PERIOD_NS = 100_000_000


def start_serve(overrides: list[str]) -> tuple[subprocess.Popen, dict]:
    cmd = [sys.executable, "-m", "alpamayo.cli", "serve", "--no-model", "--quiet"]
    cmd += [arg for item in overrides for arg in ("--set", item)]
    cmd += ["--input", LOOPBACK, "--output", LOOPBACK, "--control", LOOPBACK]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("serving: "):
            return proc, ast.literal_eval(line.removeprefix("serving: "))
    raise RuntimeError(f"serve exited with {proc.wait()} before serving")


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak) of process `pid`, MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}


def run(bombs: int, timeout_s: float, overrides: list[str]) -> dict:
    serve, endpoints = start_serve(overrides)
    try:
        with (
            FramePublisher(endpoints["input"][0], hwm=10 * bombs) as pub,
            ControlClient(endpoints["control"], timeout_s=timeout_s) as ctl,
        ):
            if not pub.wait_for_subscriber(10.0):
                raise RuntimeError("the node never subscribed")
            status = ctl.status()  # warm: the control path and the reply's first status are set up
            before = memory_mb(serve.pid)
            data = lying_jpeg(WIDTH, HEIGHT)
            cameras = list(DEFAULT_CAMERAS)
            start = time.perf_counter()
            for k in range(bombs):
                t = 10**12 + (k // len(cameras)) * PERIOD_NS
                pub.send(encode_frame(cameras[k % len(cameras)], k, t, t, data, "jpeg", WIDTH, HEIGHT))
            sent_s = time.perf_counter() - start
            latencies = []
            while time.perf_counter() - start < timeout_s:
                t_req = time.perf_counter()
                status = ctl.status()
                latencies.append((time.perf_counter() - t_req) * 1e3)
                if status["counters"]["messages"] >= bombs:
                    break
                time.sleep(0.01)
            intake_s = time.perf_counter() - start
            after = memory_mb(serve.pid)
        counters = status["counters"]
        return {
            "bombs": bombs,
            "bomb_bytes": len(data),
            "send_s": sent_s,
            "intake_s": intake_s,
            "counted": counters["messages"],
            "frames_accepted": counters["frames_accepted"],
            "rejected": counters["rejected"],
            "control_replies": len(latencies),
            "control_first_ms": latencies[0],
            "control_max_ms": max(latencies),
            "rss_before_mb": before["VmRSS"],
            "rss_peak_mb": after["VmHWM"],
            "ring_bytes": status.get("memory", {}).get("ring_bytes"),
        }
    finally:
        serve.terminate()
        serve.wait(30)


def under_load(seconds: float, rate: float, overrides: list[str]) -> dict:
    serve, endpoints = start_serve(overrides)
    try:
        cmd = [sys.executable, "-m", "alpamayo.cli", "camera-sim", "--endpoint", endpoints["input"][0]]
        cmd += ["--seconds", str(seconds), "--rate", str(rate), "--cameras", ",".join(DEFAULT_CAMERAS)]
        sim = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        latencies = []
        with ControlClient(endpoints["control"], timeout_s=10.0) as ctl:
            while ctl.status()["counters"]["frames_accepted"] == 0 and sim.poll() is None:
                time.sleep(0.05)
            while sim.poll() is None:
                start = time.perf_counter()
                status = ctl.status()
                latencies.append((time.perf_counter() - start) * 1e3)
                time.sleep(0.01)
        latencies.sort()
        return {
            "frames": status["counters"]["frames_accepted"],
            "control_replies": len(latencies),
            "control_p50_ms": latencies[len(latencies) // 2],
            "control_p99_ms": latencies[int(0.99 * (len(latencies) - 1))],
            "control_max_ms": latencies[-1],
        }
    finally:
        serve.terminate()
        serve.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bombs", type=int, default=64)
    p.add_argument("--timeout", type=float, default=60.0, help="s to wait for the node to count every bomb")
    p.add_argument("--load-seconds", type=float, default=0.0, help="also time control under camera-sim load")
    p.add_argument("--load-rate", type=float, default=10.0, help="camera-sim frames per second per camera")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="serve config override")
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args()
    r = run(args.bombs, args.timeout, args.set)
    print(
        f"## {r['bombs']} lying JPEGs ({r['bomb_bytes']} B each, header {WIDTH}x{HEIGHT}) into serve --no-model"
    )
    print(
        f"counted {r['counted']} in {r['intake_s']:.2f} s: {r['frames_accepted']} accepted, rejected {r['rejected']}"
    )
    print(
        f"control replies: {r['control_replies']}, first {r['control_first_ms']:.1f} ms, "
        f"max {r['control_max_ms']:.1f} ms"
    )
    print(f"serve RSS: {r['rss_before_mb']:.0f} MB before, peak {r['rss_peak_mb']:.0f} MB")
    if r["ring_bytes"] is not None:
        print(f"frame rings hold {r['ring_bytes']} bytes")
    if args.load_seconds > 0:
        r["load"] = under_load(args.load_seconds, args.load_rate, args.set)
        ld = r["load"]
        print(
            f"## control under camera-sim: 4 x 1920x1080 rgb8 at {args.load_rate:g} Hz for {args.load_seconds:g} s "
            f"({ld['frames']} frames taken in)"
        )
        print(
            f"control replies: {ld['control_replies']}, p50 {ld['control_p50_ms']:.1f} ms, "
            f"p99 {ld['control_p99_ms']:.1f} ms, max {ld['control_max_ms']:.1f} ms"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
