"""The control socket against hostile or crowded clients, over real loopback sockets: envelopes of 100,000
frames are dropped unread without a reply while `status` keeps answering, and 300 clients at once are all
answered."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import msgpack
import zmq

from bridges.wire.protocol import CONTROL_REQUEST_FRAMES
from tests.bridge_nodes import node_config, running_node
from tests.test_bridge_hardening import control_latencies_ms

ENVELOPES, FRAMES = 10, 100_000

# A DEALER in its own process (its sends never hold the GIL of the node under test) sends ENVELOPES requests of
# FRAMES routing frames plus a valid status request, back to back, then counts the replies that come within 2 s.
SEND_ENVELOPES = """
import sys, msgpack, zmq
endpoint, envelopes, frames = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.sndhwm, sock.linger = 0, 0
sock.connect(endpoint)
message = [b""] * frames + [msgpack.packb({"cmd": "status"})]
for _ in range(envelopes):
    sock.send_multipart(message)
print("sent", flush=True)
replies = 0
while sock.poll(2000):
    sock.recv_multipart()
    replies += 1
print("replies", replies, flush=True)
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def test_envelopes_are_dropped_unread_without_a_reply_while_status_keeps_answering(record_figure):
    with running_node(None, node_config(warmup={"runs": 0})) as c:
        count = iter(range(200))
        baseline = control_latencies_ms(c.control, lambda s: next(count, None) is None, 60.0)  # 200 at idle
        cmd = [sys.executable, "-c", SEND_ENVELOPES, c.node.endpoints["control"], str(ENVELOPES), str(FRAMES)]
        sender = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            flood = control_latencies_ms(
                c.control, lambda s: s["counters"]["control_rejected"].get("envelope") == ENVELOPES, 120.0
            )
            status = c.control.status()
            assert sender.wait(60) == 0
        finally:
            if sender.poll() is None:
                sender.kill()
        out = sender.stdout.read()
    assert out.split() == ["sent", "replies", "0"]
    counters = status["counters"]
    assert counters["control_rejected"] == {"envelope": ENVELOPES}
    assert status["last_error"]["message"] == (
        f"a control request of {FRAMES + 2} ZeroMQ frames; a request is at most {CONTROL_REQUEST_FRAMES} (the "
        "routing id, 2 routing frames, the request): dropped unread, no reply"
    )
    for name, values in (("idle", baseline), ("envelopes", flood)):
        record_figure(
            f"status under {name}: p50 / p99 / max ms, replies",
            (
                f"{percentile(values, 0.5):.1f} / {percentile(values, 0.99):.1f} / {max(values):.1f}, {len(values)}"
            ),
        )


def listen_overflows() -> int | None:
    """The kernel's TcpExt ListenOverflows counter (connections dropped from a full accept queue), None if
    /proc/net/netstat cannot be read."""
    try:
        lines = [
            line.split()
            for line in Path("/proc/net/netstat").read_text().splitlines()
            if line.startswith("TcpExt:")
        ]
    except OSError:
        return None
    names, values = lines
    return int(values[names.index("ListenOverflows")])


def test_300_control_clients_at_once_are_all_answered(record_figure):
    clients = 300
    with running_node(None, node_config(warmup={"runs": 0})) as c:
        ctx = zmq.Context()
        try:
            before = listen_overflows()
            socks = []
            for _ in range(clients):  # all connect and queue their request before any is answered
                sock = ctx.socket(zmq.REQ)
                sock.linger = 0
                sock.connect(c.node.endpoints["control"])
                sock.send(msgpack.packb({"cmd": "status"}))
                socks.append(sock)
            start = time.perf_counter()
            poller, waiting = zmq.Poller(), set(socks)
            for sock in socks:
                poller.register(sock, zmq.POLLIN)
            replies = []
            while waiting and time.perf_counter() - start < 60:
                for sock, _ in poller.poll(1000):
                    replies.append(msgpack.unpackb(sock.recv()))
                    poller.unregister(sock)
                    waiting.discard(sock)
            elapsed = time.perf_counter() - start
            after = listen_overflows()
        finally:
            ctx.destroy(linger=0)
    assert len(replies) == clients and all(r["ok"] for r in replies)
    record_figure("300 control clients at once: all answered after (s)", elapsed)
    if before is not None:
        record_figure("300 control clients at once: ListenOverflows (whole host)", after - before)
