"""Who ended an input connection: the peer, or libzmq on the node's behalf.

libzmq 4.3.5 without the draft API reports a peer's ordinary close, its own drop of a peer whose message is
over ZMQ_MAXMSGSIZE, and a heartbeat timeout with one identical DISCONNECTED monitor event (measured; nothing
in it says why). The node wants them apart: `input_disconnects` counts the hang-ups it caused, and
`peer_disconnects` the peers that left. What the event does give is the connection's file descriptor, as
ACCEPTED and CONNECTED do when the connection opens. So `DisconnectCauses` keeps a duplicate of each input
connection's fd (`os.dup`: another handle on the same kernel socket) from its opening event to its DISCONNECTED,
then looks at the socket once through a peek that consumes nothing (MSG_PEEK | MSG_DONTWAIT):

  * end of stream, or a reset: the peer closed first, and libzmq only saw it go -> PEER;
  * bytes still waiting (the rest of an oversize message), or none and the socket still open (a peer that
    stopped answering heartbeats): libzmq hung up on a live peer -> NODE.

Only the duplicate keeps the socket open after libzmq closes its own fd, so it is closed right after the peek:
the peer sees the hang-up 0.4 ms later (median at idle, `benchmarks/node_hangup.py`: the control thread's
wake-up). The peek never takes data libzmq would have read: libzmq has stopped reading by then. libzmq reads
8 KB at a time, so an oversize message leaves bytes waiting even if its peer closes at once, unless the whole
message fits in one read (a limit under 5.5 KB, far below any camera frame's).

An fd number is reused as soon as it is closed. If a connection opened and closed before its opening event was
handled, the duplicate may be of the next connection on that number; the DISCONNECTED then finds libzmq's fd
still on the duplicate's socket after `SETTLE_S` and the close is counted as UNKNOWN (the node reports it with
the peers'). Linux and any POSIX kernel with MSG_PEEK / MSG_DONTWAIT; a transport without fds (inproc) has no
such events.
"""

from __future__ import annotations

import errno
import os
import resource
import socket
import time
from enum import Enum

# How long a DISCONNECTED waits for libzmq to close its own fd (it does so right after sending the event, in the
# same I/O-thread call, so microseconds) before deciding that the duplicate belongs to a newer connection.
SETTLE_S = 0.02


class Cause(Enum):
    PEER = "peer"  # the peer closed or reset the connection
    NODE = "node"  # libzmq dropped a live peer: a message over ZMQ_MAXMSGSIZE, or a heartbeat timeout
    UNKNOWN = "unknown"  # the connection was gone before the node could watch it


class DisconnectCauses:
    """Duplicated fds of the open input connections, keyed by libzmq's fd number. Not thread-safe: the node's
    control thread, which reads the monitor events, is the only caller.

    At most `limit` connections are watched (default a quarter of the process's open-file limit, 256 of the
    usual 1024): each costs one more fd, and a peer opening hundreds of connections must not run libzmq out
    of fds sooner than it would without the node watching. Beyond it, a close counts as UNKNOWN."""

    def __init__(self, limit: int | None = None) -> None:
        self._open: dict[int, socket.socket] = {}
        self.limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4 if limit is None else limit

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, fd: int) -> None:
        """ACCEPTED / CONNECTED with this fd: keep a duplicate of it."""
        stale = self._open.pop(fd, None)
        if stale is not None:  # that number's DISCONNECTED never came: let its socket go
            stale.close()
        if len(self._open) >= self.limit:
            return
        try:
            dup = os.dup(fd)
        except OSError:  # closed already: the connection lasted less than the event's latency
            return
        try:
            # The duplicate shares the open file description, and so its flags, with libzmq: socket() on an fd
            # sets at most O_NONBLOCK, which libzmq's fds have anyway, and nothing here sets anything else.
            self._open[fd] = socket.socket(fileno=dup)
        except OSError:  # the number is not a socket's (any more)
            os.close(dup)

    def closed(self, fd: int) -> Cause:
        """DISCONNECTED with this fd: who ended it. The duplicate is closed."""
        dup = self._open.pop(fd, None)
        if dup is None:
            return Cause.UNKNOWN
        if not _released(fd, dup):
            self._open[fd] = dup  # libzmq still has this socket open: it is a newer connection's
            return Cause.UNKNOWN
        try:
            return _peek(dup)
        finally:
            dup.close()

    def close(self) -> None:
        """Close every duplicate (the node is stopping)."""
        for dup in self._open.values():
            dup.close()
        self._open.clear()


def _same_socket(fd: int, dup: socket.socket) -> bool:
    try:
        a, b = os.fstat(fd), os.fstat(dup.fileno())
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _released(fd: int, dup: socket.socket) -> bool:
    """True once libzmq's `fd` no longer refers to the duplicate's socket (closed, or reused for another)."""
    deadline = time.monotonic() + SETTLE_S
    while _same_socket(fd, dup):
        if time.monotonic() > deadline:
            return False
        # The event usually arrives before libzmq's close: 50 us naps measured 0.4 ms added hang-up latency,
        # 500 us naps 0.85 ms.
        time.sleep(0.00005)
    return True


def _peek(dup: socket.socket) -> Cause:
    try:
        data = dup.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return Cause.NODE  # open and quiet: the peer is still there
    except OSError as e:
        if e.errno in (errno.ECONNRESET, errno.EPIPE, errno.ETIMEDOUT):
            return Cause.PEER  # reset by the peer (or its host gone and TCP gave up)
        return Cause.UNKNOWN
    return Cause.PEER if data == b"" else Cause.NODE
