"""Helpers for tests that run an `InferenceNode` on loopback: ephemeral ports, small frames, clients."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from alpamayo.prediction import Predictor
from alpamayo.profiling import Tracer
from bridges.node.config import NodeConfig
from bridges.node.server import InferenceNode
from bridges.wire.client import ControlClient, FramePublisher, TrajectorySubscriber
from bridges.wire.protocol import TrajectoryMessage
from bridges.wire.sockets import CurveClientKeys

CAMERAS = {"left": 0, "front": 1}
WIDTH, HEIGHT = 64, 48
T = TypeVar("T")


def node_config(**sections: dict[str, Any]) -> NodeConfig:
    """Loopback endpoints on free ports (`:*`), two small cameras; `sections` override per section."""
    data: dict[str, Any] = {
        "input": {"endpoints": ["tcp://127.0.0.1:*"]},
        "output": {"endpoint": "tcp://127.0.0.1:*"},
        "control": {"endpoint": "tcp://127.0.0.1:*"},
        "cameras": dict(CAMERAS),
        "limits": {"max_width": WIDTH, "max_height": HEIGHT},
        "warmup": {"runs": 1, "width": WIDTH, "height": HEIGHT},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return NodeConfig.from_dict(data)


def silent_zmtp_peer(endpoint: str) -> socket.socket:
    """A raw TCP peer at a `tcp://HOST:PORT` endpoint that completes a ZMTP 3.1 NULL handshake as a PUB (64-byte
    greeting, then a READY command with Socket-Type) and then never sends another byte, so it never answers
    the node's heartbeat PINGs: a frozen process, or a host gone without a FIN. Returned once the node's
    greeting has arrived; the caller closes it."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5.0)
    greeting = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 1]) + b"NULL".ljust(20, b"\x00") + bytes(32)
    ready = b"\x05READY" + b"\x0bSocket-Type" + (3).to_bytes(4, "big") + b"PUB"
    sock.sendall(greeting + bytes([0x04, len(ready)]) + ready)
    received = b""
    while len(received) < len(greeting):
        chunk = sock.recv(len(greeting) - len(received))
        assert chunk, "the node closed the connection during the ZMTP greeting"
        received += chunk
    assert received[:1] == b"\xff" and received[10] == 3, f"not a ZMTP 3 greeting: {received!r}"
    return sock


def read_zmtp_command(sock: socket.socket) -> bytes:
    """The next ZMTP command's body from a raw peer (READY, PING, ...): flags 0x04 (short) or 0x06 (long), the
    size (1 or 8 bytes), then the body, whose first byte is the name's length."""

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the node closed the connection"
            data += chunk
        return data

    flags = exactly(1)[0]
    assert flags & 0x04, f"a message frame (flags {flags:#x}), not a command"
    size = int.from_bytes(exactly(8 if flags & 0x02 else 1), "big")
    return exactly(size)


def burst_publisher(c: Clients) -> FramePublisher:
    """A second publisher that queues a whole test's burst. The fixture's holds 8 messages, like a camera's, and
    the node's input queue 32: a burst of more, sent while a loaded machine keeps the node's intake off the CPU,
    is partly dropped by ZeroMQ (PUB never blocks), which the node cannot count."""
    pub = FramePublisher(c.node.endpoints["input"][0], hwm=1000)
    assert pub.wait_for_subscriber(5.0)
    return pub


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str) -> T:
    """Poll `predicate` until it returns something truthy; fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.01)


def answering_window(msg: TrajectoryMessage | None) -> TrajectoryMessage | None:
    """The output if it answers a window (outputs before the first window report missing inputs)."""
    return msg if msg is not None and msg.t0_ns is not None else None


@dataclass
class Clients:
    node: InferenceNode
    publisher: FramePublisher
    subscriber: TrajectorySubscriber
    control: ControlClient

    def counters(self) -> dict[str, Any]:
        return self.node.status()["counters"]


@contextmanager
def running_node(
    predictor: Predictor | None,
    config: NodeConfig,
    tracer: Tracer | None = None,
    curve: CurveClientKeys | None = None,
) -> Iterator[Clients]:
    """A started node plus a connected publisher (subscription confirmed), subscriber and control client;
    everything is closed and the node stopped on exit."""
    node = InferenceNode(predictor, config, tracer).start()
    with ExitStack() as stack:
        stack.callback(node.stop)
        publisher = stack.enter_context(FramePublisher(node.endpoints["input"][0], curve=curve))
        subscriber = stack.enter_context(TrajectorySubscriber(node.endpoints["output"], curve=curve))
        control = stack.enter_context(ControlClient(node.endpoints["control"], curve=curve))
        assert publisher.wait_for_subscriber(5.0), "the node never subscribed to the publisher"
        yield Clients(node, publisher, subscriber, control)
