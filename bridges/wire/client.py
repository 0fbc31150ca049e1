"""Client side of the node: a publisher for camera drivers, a subscriber for trajectory consumers, and a
control client. Each owns one socket on a shared (or given) ZeroMQ context; all are context managers.

    with FramePublisher("tcp://127.0.0.1:5555") as pub:
        pub.wait_for_subscriber(5.0)
        pub.send(encode_ego(t_ns, xyz, quat_xyzw))
        pub.send(encode_frame("camera_front_wide_120fov", frame_id, t_sof_ns, t_eof_ns, rgb))
    with TrajectorySubscriber("tcp://127.0.0.1:5556") as sub:
        msg = sub.recv(timeout_s=1.0)          # TrajectoryMessage or None
    ControlClient("tcp://127.0.0.1:5557").status()
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, ClassVar, TypeVar, cast

import msgpack
import zmq

from bridges.wire.protocol import TrajectoryMessage, decode_trajectory
from bridges.wire.sockets import CurveClientKeys, attach, make_socket

# Frames a publisher queues per subscriber before ZeroMQ drops new ones: a stalled node must never
# back-pressure the camera (PUB never blocks), and a short queue keeps what does arrive recent.
PUBLISHER_HWM = 8
ZERO_COPY_BYTES = 65536  # pyzmq's copy_threshold: smaller messages are cheaper to copy than to track
# How long `FramePublisher.close` waits, beyond the socket's LINGER, for libzmq to release the zero-copy frames
# it still holds. libzmq drops what is unsent when LINGER expires, so this is only a margin for a loaded host.
RELEASE_MARGIN_S = 5.0

ClientT = TypeVar("ClientT", bound="_Client")


class _Client:
    """One socket of kind KIND with the project's options (plus OPTIONS), bound or connected; `hwm` overrides
    the high-water mark (messages queued per peer)."""

    KIND: int
    OPTIONS: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        endpoint: str,
        bind: bool = False,
        curve: CurveClientKeys | None = None,
        ctx: zmq.Context | None = None,
        hwm: int | None = None,
    ):
        options = self.OPTIONS if hwm is None else {**self.OPTIONS, "hwm": hwm}
        self._sock = make_socket(ctx or zmq.Context.instance(), self.KIND, **options)
        if curve is not None:
            curve.apply(self._sock)
        self._configure()
        self.endpoint = attach(self._sock, endpoint, bind)

    def _configure(self) -> None:
        """Socket options specific to the subclass, set before bind/connect."""

    def close(self) -> None:
        self._sock.close()

    def __enter__(self: ClientT) -> ClientT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FramePublisher(_Client):
    """Publishes camera frames and ego poses, one ZeroMQ frame per message built by
    `bridges.wire.protocol.encode_frame` / `encode_ego`.

    An XPUB socket, so `wait_for_subscriber` can tell when the node's subscription has arrived (messages sent
    before that are dropped by PUB/SUB: the "slow joiner").

    Frames of ZERO_COPY_BYTES or more are sent zero-copy: libzmq's I/O thread reads them from the message's own
    buffer after `send` returns, while pyzmq holds the reference. pyzmq drops every such reference when the
    interpreter exits (its garbage collector's atexit hook), even while libzmq is still writing the buffer to a
    subscriber: a process that exited right after its last send aborted with libzmq's `Bad address
    (src/tcp.cpp:227)` (or SIGSEGV), in 4 of 5 runs of 8 rgb8 4K frames to a slow subscriber. So every zero-copy
    send is tracked, and `close` (also the end of a `with` block) returns only once libzmq has released them
    all: sent, or dropped when the socket's LINGER expires."""

    KIND = zmq.XPUB
    OPTIONS: ClassVar[dict[str, Any]] = {"hwm": PUBLISHER_HWM}

    def _configure(self) -> None:
        self._sock.xpub_verbose = 1  # report every subscription, also a node re-subscribing after a reconnect
        self._in_flight: deque[zmq.MessageTracker] = deque()

    def wait_for_subscriber(self, timeout_s: float) -> bool:
        """True once a subscriber has subscribed (within timeout_s seconds). XPUB also passes on the
        unsubscription (first byte 0) of a subscriber that went away; that one is skipped."""
        deadline = time.monotonic() + timeout_s
        while self._sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            if self._sock.recv()[:1] == b"\x01":
                return True
        return False

    def send(self, message: bytes | bytearray | memoryview) -> int:
        """Send one message; never blocks (frames beyond the HWM are dropped). Returns its size in bytes.
        A zero-copy message's buffer must not be modified until `close` has returned."""
        if len(message) < ZERO_COPY_BYTES:
            self._sock.send(message)
            return len(message)
        self._in_flight.append(self._sock.send(message, copy=False, track=True))
        while self._in_flight and self._in_flight[0].done:
            self._in_flight.popleft()
        return len(message)

    def close(self) -> None:
        """Close the socket, then wait until libzmq has released every zero-copy frame (at most the socket's
        LINGER plus RELEASE_MARGIN_S). RuntimeError if it has not: the process must not exit then. Closing
        again does nothing."""
        if self._sock.closed:
            return
        # pyzmq types every socket option attribute int | bytes | str; LINGER is an int
        linger_s = max(cast(int, self._sock.linger), 0) / 1000
        self._sock.close()
        deadline = time.monotonic() + linger_s + RELEASE_MARGIN_S
        while self._in_flight:
            try:
                self._in_flight[0].wait(max(deadline - time.monotonic(), 0.0))
            except zmq.NotDone:
                raise RuntimeError(
                    f"libzmq still holds {len(self._in_flight)} frame(s) {linger_s + RELEASE_MARGIN_S:g} s "
                    f"after closing {self.endpoint}"
                ) from None
            self._in_flight.popleft()


class TrajectorySubscriber(_Client):
    """Receives the node's trajectory messages."""

    KIND = zmq.SUB

    def _configure(self) -> None:
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")

    def recv(self, timeout_s: float) -> TrajectoryMessage | None:
        """The next message, or None after timeout_s seconds."""
        if not self._sock.poll(int(timeout_s * 1000)):
            return None
        return decode_trajectory(self._sock.recv())


class ControlClient(_Client):
    """Requests to the node's control socket. REQ with relaxed, correlated requests: after a lost reply the
    next request can still be sent (zguide's Lazy Pirate without recreating the socket)."""

    KIND = zmq.REQ

    def __init__(
        self,
        endpoint: str,
        timeout_s: float = 2.0,
        curve: CurveClientKeys | None = None,
        ctx: zmq.Context | None = None,
    ):
        super().__init__(endpoint, False, curve, ctx)
        self.timeout_s = timeout_s

    def _configure(self) -> None:
        self._sock.req_relaxed = 1
        self._sock.req_correlate = 1

    def request(self, cmd: str) -> dict[str, Any]:
        """Send {"cmd": cmd}; returns the reply map. Raises TimeoutError if no reply within timeout_s."""
        self._sock.send(msgpack.packb({"cmd": cmd}))
        if not self._sock.poll(int(self.timeout_s * 1000)):
            raise TimeoutError(f"no reply to {cmd!r} from {self.endpoint} within {self.timeout_s:g} s")
        return msgpack.unpackb(self._sock.recv(), raw=False)

    def status(self) -> dict[str, Any]:
        return self.request("status")

    def reset(self) -> dict[str, Any]:
        return self.request("reset")

    def shutdown(self) -> dict[str, Any]:
        return self.request("shutdown")
