"""`FramePublisher`'s zero-copy buffers outlive the process's last send: a publisher process that exits right
after sending large rgb8 frames exits 0 (libzmq aborted with `Bad address (src/tcp.cpp:227)` when pyzmq freed a
buffer at exit that libzmq was still writing), and every frame a subscriber receives is the frame sent."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from bridges.wire.protocol import unpack_header
from tests.bridge_nodes import CAMERAS
from tests.test_bridge_serve import start_serve, stop

FRAMES = 8  # the publisher's HWM: all of them can be queued when the process exits
RUNS = 3  # before the fix 4 of 5 slow-subscriber runs and 1 of 2 camera-sim runs aborted

# Sends FRAMES distinct frames (every byte of frame i is i + 1) and exits as soon as the publisher is closed.
PUBLISH_AND_EXIT = """
import sys
import numpy as np
from bridges.wire.client import FramePublisher
from bridges.wire.protocol import encode_frame
endpoint, width, height, frames = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with FramePublisher(endpoint) as pub:
    assert pub.wait_for_subscriber(30.0), "no subscriber"
    for i in range(frames):
        image = np.full((height, width, 3), i + 1, np.uint8)
        pub.send(encode_frame(0, i, i * 100_000_000, i * 100_000_000 + 1, image))
"""


@pytest.mark.parametrize("width,height", [(1920, 1080), (3840, 2160)], ids=["1080p", "4k"])
def test_a_publisher_exiting_under_a_slow_subscriber_exits_0_and_delivers_intact_frames(width, height):
    ctx = zmq.Context()
    try:
        for _ in range(RUNS):
            sub = ctx.socket(zmq.SUB)
            sub.linger, sub.rcvhwm = 0, 1
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            port = sub.bind_to_random_port("tcp://127.0.0.1")
            cmd = [sys.executable, "-c", PUBLISH_AND_EXIT, f"tcp://127.0.0.1:{port}", str(width), str(height)]
            pub = subprocess.Popen([*cmd, str(FRAMES)], stderr=subprocess.PIPE, text=True)
            received = []
            try:
                while pub.poll() is None:
                    if sub.poll(10):
                        view = memoryview(sub.recv())
                        header, offset = unpack_header(view)
                        payload = np.frombuffer(view[offset:], np.uint8)
                        assert payload.size == width * height * 3
                        frame_id = header["frame_id"]
                        assert (payload == frame_id + 1).all(), f"frame {frame_id} corrupted"
                        received.append(frame_id)
                        # the slow subscriber: libzmq is still sending when the publisher exits
                        time.sleep(0.02)
            finally:
                stop(pub)
                sub.close()
            assert pub.returncode == 0, pub.stderr.read()
            assert received and received == sorted(set(received))
    finally:
        ctx.term()


def test_camera_sim_at_the_documented_1080p_rgb8_exits_0_with_a_node_connected():
    """docs/protocol.md's run: `camera-sim --width 1920 --height 1080 --rate 10` (rgb8) into a running node."""
    serve, endpoints = start_serve("--no-model")
    try:
        for _ in range(RUNS):
            cmd = [sys.executable, "-m", "alpamayo.cli", "camera-sim", "--endpoint", endpoints["input"][0]]
            cmd += ["--cameras", ",".join(CAMERAS), "--width", "1920", "--height", "1080", "--rate", "10"]
            sim = subprocess.run([*cmd, "--seconds", "1"], capture_output=True, text=True, timeout=60)
            assert sim.returncode == 0, sim.stdout + sim.stderr
            assert f"camera-sim: sent 10 ticks, {10 * len(CAMERAS)} frames" in sim.stdout
    finally:
        stop(serve)
