"""`alpamayo serve` and `alpamayo camera-sim` as two processes (the two-terminal demo), and SIGTERM."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
import time

from bridges.client import ControlClient, TrajectorySubscriber
from tests.bridge_nodes import CAMERAS, answering_window, wait_until

LOOPBACK = "tcp://127.0.0.1:*"


def start_serve(*args: str) -> tuple[subprocess.Popen, dict]:
    """`alpamayo serve` on free loopback ports; returns the process and its endpoints (from its output)."""
    cameras = "{" + ", ".join(f"{n}: {i}" for n, i in CAMERAS.items()) + "}"
    cmd = [sys.executable, "-m", "alpamayo.cli", "serve", "--input", LOOPBACK, "--output", LOOPBACK]
    cmd += ["--control", LOOPBACK, "--set", f"cameras={cameras}", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("serving: "):
            return proc, ast.literal_eval(line.removeprefix("serving: "))
    proc.wait()
    raise AssertionError("serve exited before serving:\n" + "".join(lines))


def camera_sim(endpoint: str, seconds: float, *args: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "alpamayo.cli",
        "camera-sim",
        "--endpoint",
        endpoint,
        "--seconds",
        str(seconds),
    ]
    cmd += ["--cameras", ",".join(CAMERAS), "--width", "64", "--height", "48", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_serve_and_camera_sim_stream_and_sigterm_exits_cleanly():
    serve, endpoints = start_serve("--no-model")
    sim = None
    try:
        with TrajectorySubscriber(endpoints["output"]) as sub, ControlClient(endpoints["control"]) as ctl:
            assert ctl.status()["alive"]
            sim = camera_sim(endpoints["input"][0], 3.0)
            msg = wait_until(lambda: answering_window(sub.recv(0.5)), 30.0, "an output answering a window")
            assert [c.name for c in msg.cameras] == list(CAMERAS)
            assert sim.wait(30) == 0
            assert "camera-sim: sent 30 ticks, 60 frames" in sim.stdout.read()
            assert ctl.status()["counters"]["frames_accepted"] == 60
        start = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(10) == 0
        assert time.monotonic() - start < 5.0
        output = serve.stdout.read()
        assert output.rstrip().endswith("stopped"), output
        assert "Traceback" not in output
    finally:
        for proc in (serve, sim):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
