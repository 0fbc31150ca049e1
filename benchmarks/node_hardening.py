"""`alpamayo serve` under hostile loads: `status` latency (p50 / p99 / max) over the control socket while each
load runs, the stop latency from each state, and 300 control clients at once.

Each scenario starts `alpamayo serve` as a child process on loopback ports (default config: 4 cameras, limits
3840x2160) and asks `status` in a loop from this process while the load runs in other child processes:

  idle           nothing but the `status` poller (the baseline);
  bombs          N lying JPEGs (1.8 KB each, header 3840x2160: `tests.images.lying_jpeg`, 24.9 MB each once
                 decoded) back to back; also the serve process's peak memory (VmHWM);
  input envelopes  N multipart messages of 100,000 parts (each a valid ego pose) to the input socket;
  control envelopes  N requests of 100,000 routing frames to the control socket (dropped unread, no reply);
  1080p + fuzz   `alpamayo camera-sim` streaming 4 cameras of 1920x1080 rgb8 at 10 Hz into the intake-only node
                 while a fuzzer sends mutated frames and poses (flipped bytes, truncations, random bytes) at
                 `--fuzz-rate` messages/s;
  prediction     the demo checkpoint (built into a temporary directory) with a 4096-token reasoning cap,
                 predicting continuously on camera-sim's 4 cameras.

Stops: SIGTERM during the imports (at the first torch module `-X importtime` reports), when idle, during the
warm-up, mid-prediction (after `--stop-after` s of it; the default `timing.shutdown_timeout_s`), and
`alpamayo node-ctl shutdown` (node-ctl's own time and the node's exit after it): seconds from the signal or
the command to the process's exit, and its exit status. Clients: `--clients` REQ clients connect and ask
`status` at once, `--client-runs` times; all replies' time and the host's TcpExt ListenOverflows.

    python -m benchmarks.node_hardening [--only idle,control-envelopes,...] [--seconds 10] [--json out.json]    (from the checkout root)

`--set` goes to every `alpamayo serve`.
"""

from __future__ import annotations

import argparse
import ast
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import zmq

from bridges.node.config import DEFAULT_CAMERAS
from bridges.wire.client import ControlClient, FramePublisher
from bridges.wire.protocol import encode_frame
from tests.images import lying_jpeg
from tests.test_bridge_serve import camera_sim as test_camera_sim
from tests.test_bridge_serve import sigterm_during_imports

LOOPBACK = "tcp://127.0.0.1:*"
WIDTH, HEIGHT = 3840, 2160
PERIOD_NS = 100_000_000
SETTLE_S = 1.0  # envelopes: the node's counts unchanged this long after the sender ends the run
SCENARIOS = (
    "idle",
    "bombs",
    "input-envelopes",
    "control-envelopes",
    "1080p-fuzz",
    "prediction",
    "clients",
    "stops",
)


def start_serve(overrides: list[str], *args: str) -> tuple[subprocess.Popen, dict]:
    """`alpamayo serve` (intake-only unless `args` name a checkpoint) and its endpoints."""
    cmd = [sys.executable, "-m", "alpamayo.cli", "serve", *(args or ["--no-model"]), "--quiet"]
    cmd += [arg for item in overrides for arg in ("--set", item)]
    cmd += ["--input", LOOPBACK, "--output", LOOPBACK, "--control", LOOPBACK]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("serving: "):
            return proc, ast.literal_eval(line.removeprefix("serving: "))
    raise RuntimeError(f"serve exited with {proc.wait()} before serving")


def end(*procs: subprocess.Popen | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak) of process `pid`, MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}


def poll_status(
    ctl: ControlClient, until: Callable[[dict], bool], timeout_s: float
) -> tuple[list[float], dict]:
    """`status` every 10 ms until `until(status)` or timeout_s; each reply's latency (ms) and the last status."""
    latencies, start = [], time.perf_counter()
    while True:
        t = time.perf_counter()
        status = ctl.status()
        latencies.append((time.perf_counter() - t) * 1e3)
        if until(status) or time.perf_counter() - start > timeout_s:
            return latencies, status
        time.sleep(0.01)


def stats(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    pick = lambda q: ordered[round(q * (len(ordered) - 1))]  # noqa: E731
    return {"replies": len(ordered), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": ordered[-1]}


def camera_sim(endpoint: str, seconds: float) -> subprocess.Popen:
    """`alpamayo camera-sim`: the default 4 cameras, 1920x1080 rgb8 at 10 Hz."""
    size = ["--width", "1920", "--height", "1080", "--rate", "10"]
    return test_camera_sim(endpoint, seconds, "--cameras", ",".join(DEFAULT_CAMERAS), *size)


# ------------------------------------------------------------------------------------------------ loads


def idle(seconds: float, overrides: list[str]) -> dict[str, Any]:
    serve, endpoints = start_serve(overrides)
    try:
        with ControlClient(endpoints["control"]) as ctl:
            start = time.perf_counter()
            latencies, _ = poll_status(ctl, lambda s: time.perf_counter() - start > seconds, seconds + 5)
        return stats(latencies)
    finally:
        end(serve)


def bombs(count: int, timeout_s: float, overrides: list[str]) -> dict[str, Any]:
    serve, endpoints = start_serve(overrides)
    try:
        with (
            FramePublisher(endpoints["input"][0], hwm=10 * count) as pub,
            ControlClient(endpoints["control"], timeout_s=timeout_s) as ctl,
        ):
            if not pub.wait_for_subscriber(10.0):
                raise RuntimeError("the node never subscribed")
            ctl.status()
            before = memory_mb(serve.pid)
            data = lying_jpeg(WIDTH, HEIGHT)
            cameras = list(DEFAULT_CAMERAS)
            for k in range(count):
                t = 10**12 + (k // len(cameras)) * PERIOD_NS
                pub.send(encode_frame(cameras[k % len(cameras)], k, t, t, data, "jpeg", WIDTH, HEIGHT))
            latencies, status = poll_status(ctl, lambda s: s["counters"]["messages"] >= count, timeout_s)
            after = memory_mb(serve.pid)
        return {
            **stats(latencies),
            "note": f"{status['counters']['messages']} counted, rejected {status['counters']['rejected']}; "
            f"RSS {before['VmRSS']:.0f} MB, peak {after['VmHWM']:.0f} MB",
        }
    finally:
        end(serve)


# Senders in child processes, so that their GIL never delays the replies being timed.
SEND_INPUT_ENVELOPES = """
import sys, zmq
from bridges.wire.protocol import encode_ego
endpoint, envelopes, parts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sock = zmq.Context.instance().socket(zmq.XPUB)
sock.sndhwm, sock.linger = 0, -1  # queue every envelope; exit only once all are sent
sock.connect(endpoint)
assert sock.poll(10_000) and sock.recv() == b"\\x01", "the node never subscribed"
message = [bytes(encode_ego(10**12 + k, [0, 0, 0], [0, 0, 0, 1])) for k in range(parts)]
for _ in range(envelopes):
    sock.send_multipart(message)
sock.close()
"""
SEND_CONTROL_ENVELOPES = """
import sys, msgpack, zmq
endpoint, envelopes, frames = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.sndhwm, sock.linger = 0, -1
sock.connect(endpoint)
message = [b""] * frames + [msgpack.packb({"cmd": "status"})]
for _ in range(envelopes):
    sock.send_multipart(message)
replies = 0
while sock.poll(2000):
    sock.recv_multipart()
    replies += 1
print(replies)
"""


def envelopes(kind: str, count: int, parts: int, timeout_s: float, overrides: list[str]) -> dict[str, Any]:
    """`kind` "input" (multipart messages to the SUB) or "control" (routing frames to the ROUTER)."""
    serve, endpoints = start_serve(overrides)
    sender = None
    try:
        with ControlClient(endpoints["control"], timeout_s=timeout_s) as ctl:
            ctl.status()
            script, target = (
                (SEND_INPUT_ENVELOPES, endpoints["input"][0])
                if kind == "input"
                else (SEND_CONTROL_ENVELOPES, endpoints["control"])
            )
            cmd = [sys.executable, "-c", script, target, str(count), str(parts)]
            sender = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            start, seen, settled_at = time.perf_counter(), None, time.perf_counter()

            def settled(status: dict) -> bool:  # the sender is done and the node's counts stopped moving
                nonlocal seen, settled_at
                counts = (status["counters"]["messages"], status["counters"]["control_rejected"])
                if counts != seen:
                    seen, settled_at = counts, time.perf_counter()
                return sender.poll() is not None and time.perf_counter() - settled_at > SETTLE_S

            latencies, status = poll_status(ctl, settled, timeout_s)
            if sender.wait(timeout_s) != 0:
                raise RuntimeError(f"the envelope sender exited with {sender.returncode}")
        counters = status["counters"]
        note = f"{count} x {parts} frames: intake {settled_at - start - SETTLE_S:.1f} s, "
        if kind == "input":
            note += f"rejected {counters['rejected']}"
        else:
            note += f"rejected {counters['control_rejected']}, replies to the sender {sender.stdout.read().strip()}"
        return {**stats(latencies), "note": note}
    finally:
        end(serve, sender)


# Mutations of valid messages, as tests/test_bridge_fuzz.py makes them, from a child process.
FUZZ = """
import sys, time
import numpy as np
import zmq
from bridges.wire.client import FramePublisher
from bridges.wire.protocol import encode_ego, encode_frame
endpoint, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
rng = np.random.default_rng(0)
image = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
valid = [bytes(encode_frame("camera_front_wide_120fov", 7, 10**9, 10**9, image)),
         bytes(encode_ego(10**9, [1.0, 2.0, 0.0], [0.0, 0.0, 0.0, 1.0]))]
sent = 0
with FramePublisher(endpoint, hwm=1000) as pub:
    assert pub.wait_for_subscriber(10.0)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        msg = bytearray(valid[sent % 2])
        how = sent % 3
        if how == 0:  # flip bytes
            for i in rng.integers(0, len(msg), 4):
                msg[i] = int(rng.integers(0, 256))
        elif how == 1:  # truncate
            msg = msg[: int(rng.integers(0, len(msg)))]
        else:  # random bytes
            msg = bytearray(rng.integers(0, 256, int(rng.integers(1, 512)), dtype=np.uint8).tobytes())
        pub.send(bytes(msg))
        sent += 1
        time.sleep(max(0.0, start + sent / rate - time.perf_counter()))
print(sent)
"""


def stream_and_fuzz(seconds: float, fuzz_rate: float, overrides: list[str]) -> dict[str, Any]:
    serve, endpoints = start_serve(overrides)
    sim = fuzz = None
    try:
        with ControlClient(endpoints["control"], timeout_s=10.0) as ctl:
            sim = camera_sim(endpoints["input"][0], seconds)
            cmd = [sys.executable, "-c", FUZZ, endpoints["input"][0], str(fuzz_rate), str(seconds)]
            fuzz = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            poll_status(ctl, lambda s: s["counters"]["frames_accepted"] > 0 or sim.poll() is not None, 60.0)
            latencies, status = poll_status(ctl, lambda s: sim.poll() is not None, seconds + 60)
            fuzz.wait(60)
        c = status["counters"]
        return {
            **stats(latencies),
            "note": f"{c['frames_accepted']} frames taken in, {fuzz.stdout.read().strip()} fuzz messages sent, "
            f"{c['rejected_total']} rejected",
        }
    finally:
        end(serve, sim, fuzz)


def prediction(seconds: float, checkpoint: str, overrides: list[str]) -> dict[str, Any]:
    serve, endpoints = start_serve([*overrides, *PREDICTING], "--checkpoint", checkpoint)
    sim = None
    try:
        with ControlClient(endpoints["control"], timeout_s=10.0) as ctl:
            sim = camera_sim(endpoints["input"][0], seconds + 120)
            poll_status(ctl, lambda s: s["prediction_running_s"] is not None, 300.0)
            start = time.perf_counter()
            latencies, status = poll_status(
                ctl, lambda s: time.perf_counter() - start > seconds, seconds + 60
            )
        return {
            **stats(latencies),
            "note": f"{status['counters']['predictions']} predictions finished meanwhile",
        }
    finally:
        end(serve, sim)


PREDICTING = ["warmup.runs=0", "model.max_reasoning_tokens=4096", "timing.stale_after_ms=600000"]


# ------------------------------------------------------------------------------------------------ clients


def listen_overflows() -> int:
    lines = [
        line.split()
        for line in Path("/proc/net/netstat").read_text().splitlines()
        if line.startswith("TcpExt:")
    ]
    return int(lines[1][lines[0].index("ListenOverflows")])


def clients(count: int, runs: int, overrides: list[str]) -> list[dict[str, Any]]:
    serve, endpoints = start_serve(overrides)
    out = []
    try:
        for _ in range(runs):
            ctx = zmq.Context()
            before = listen_overflows()
            socks, sent = [], {}
            for _ in range(count):  # every client connects and sends before any reply is read
                sock = ctx.socket(zmq.REQ)
                sock.linger = 0
                sock.connect(endpoints["control"])
                sock.send(msgpack.packb({"cmd": "status"}))
                sent[sock] = time.perf_counter()
                socks.append(sock)
            poller = zmq.Poller()
            for sock in socks:
                poller.register(sock, zmq.POLLIN)
            latencies = []
            deadline = time.perf_counter() + 30
            while len(latencies) < count and time.perf_counter() < deadline:
                for sock, _ in poller.poll(1000):
                    sock.recv()
                    latencies.append((time.perf_counter() - sent[sock]) * 1e3)
                    poller.unregister(sock)
            out.append({**stats(latencies), "note": f"ListenOverflows +{listen_overflows() - before}"})
            ctx.destroy(linger=0)
        return out
    finally:
        end(serve)


# ------------------------------------------------------------------------------------------------ stops


def stop_during_imports(overrides: list[str]) -> dict[str, Any]:
    status, elapsed, _, _ = sigterm_during_imports(*(arg for item in overrides for arg in ("--set", item)))
    return {"exit_s": elapsed, "status": status}


def stop(serve: subprocess.Popen, sig: signal.Signals | None = signal.SIGTERM) -> dict[str, Any]:
    start = time.perf_counter()
    if sig is not None:
        serve.send_signal(sig)
    code = serve.wait(60)
    tail = serve.stdout.read().rstrip().splitlines()[-1:]
    return {"exit_s": time.perf_counter() - start, "status": code, "note": tail[0] if tail else ""}


def stops(checkpoint: str, stop_after_s: float, overrides: list[str]) -> dict[str, dict[str, Any]]:
    out = {"imports": stop_during_imports(overrides)}
    serve, _ = start_serve(overrides)
    time.sleep(1.0)
    out["idle"] = stop(serve)
    serve, endpoints = start_serve(
        [*overrides, "warmup.runs=100", "model.max_reasoning_tokens=4096"], "--checkpoint", checkpoint
    )
    with ControlClient(endpoints["control"], timeout_s=10.0) as ctl:
        poll_status(ctl, lambda s: (s["prediction_running_s"] or 0) > stop_after_s, 300.0)
    out["warm-up"] = stop(serve)
    serve, endpoints = start_serve([*overrides, *PREDICTING], "--checkpoint", checkpoint)
    sim = camera_sim(endpoints["input"][0], 300)
    try:
        with ControlClient(endpoints["control"], timeout_s=10.0) as ctl:
            poll_status(ctl, lambda s: (s["prediction_running_s"] or 0) > stop_after_s, 300.0)
        out["mid-prediction"] = stop(serve)
    finally:
        end(serve, sim)
    serve, endpoints = start_serve(overrides)
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "alpamayo.cli", "node-ctl", "shutdown", "--control", endpoints["control"]]
    ctl = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    out["node-ctl shutdown (node-ctl)"] = {"exit_s": time.perf_counter() - start, "status": ctl.returncode}
    out["node-ctl shutdown (node, after node-ctl)"] = stop(serve, None)
    return out


# ------------------------------------------------------------------------------------------------ main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help=f"comma-separated scenarios (default all): {', '.join(SCENARIOS)}")
    p.add_argument("--seconds", type=float, default=10.0, help="idle, 1080p-fuzz and prediction: how long")
    p.add_argument("--bombs", type=int, default=64)
    p.add_argument("--envelopes", type=int, default=10, help="envelopes per envelope scenario")
    p.add_argument("--envelope-parts", type=int, default=100_000, help="frames per envelope")
    p.add_argument("--fuzz-rate", type=float, default=1000.0, help="fuzz messages per second")
    p.add_argument("--clients", type=int, default=300)
    p.add_argument("--client-runs", type=int, default=5)
    p.add_argument("--stop-after", type=float, default=2.0, help="s of warm-up / prediction before SIGTERM")
    p.add_argument("--checkpoint", help="the model of prediction and stops (default: the demo checkpoint)")
    p.add_argument("--timeout", type=float, default=120.0, help="s to wait for a load to be counted")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="serve config override")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    only = SCENARIOS if args.only is None else tuple(args.only.split(","))
    unknown = set(only) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(sorted(unknown))}; known: {', '.join(SCENARIOS)}")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint
        if checkpoint is None and {"prediction", "stops"} & set(only):
            from alpamayo.demo_release import make_demo_checkpoint

            checkpoint = str(make_demo_checkpoint(Path(tmp) / "demo", seed=0))
        loads: dict[str, Any] = {}
        runs: dict[str, Callable[[], Any]] = {
            "idle": lambda: idle(args.seconds, args.set),
            "bombs": lambda: bombs(args.bombs, args.timeout, args.set),
            "input-envelopes": lambda: envelopes(
                "input", args.envelopes, args.envelope_parts, args.timeout, args.set
            ),
            "control-envelopes": lambda: envelopes(
                "control", args.envelopes, args.envelope_parts, args.timeout, args.set
            ),
            "1080p-fuzz": lambda: stream_and_fuzz(args.seconds, args.fuzz_rate, args.set),
            "prediction": lambda: prediction(args.seconds, checkpoint, args.set),
        }
        for name in only:
            if name in runs:
                loads[name] = runs[name]()
        results: dict[str, Any] = {"status": loads}
        if "clients" in only:
            results["clients"] = clients(args.clients, args.client_runs, args.set)
        if "stops" in only:
            results["stops"] = stops(checkpoint, args.stop_after, args.set)
    print("| load | status replies | p50 ms | p99 ms | max ms | |")
    print("|---|---|---|---|---|---|")
    rows = [
        *loads.items(),
        *((f"{args.clients} clients, run {i + 1}", r) for i, r in enumerate(results.get("clients", []))),
    ]
    for name, r in rows:
        print(
            f"| {name} | {r['replies']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {r.get('note', '')} |"
        )
    if "stops" in results:
        print("\n| stop from | exit after s | exit status | last line |")
        print("|---|---|---|---|")
        for name, r in results["stops"].items():
            print(f"| {name} | {r['exit_s']:.3f} | {r['status']} | {r.get('note', '')} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
