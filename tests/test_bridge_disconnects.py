"""`DisconnectCauses` on real loopback TCP connections: the accepted socket's fd plays libzmq's, closing it plays
libzmq's close after DISCONNECTED, and the client plays the peer."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from bridges.node.disconnects import Cause, DisconnectCauses


@contextmanager
def loopback() -> Iterator[Callable[[], tuple[socket.socket, socket.socket]]]:
    """A factory of (client, accepted) TCP pairs on one loopback listener; all closed on exit."""
    listener = socket.create_server(("127.0.0.1", 0))
    made: list[socket.socket] = [listener]

    def pair() -> tuple[socket.socket, socket.socket]:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        made.extend((client, accepted))
        return client, accepted

    try:
        yield pair
    finally:
        for sock in made:
            sock.close()


@pytest.fixture
def causes() -> Iterator[DisconnectCauses]:
    tracker = DisconnectCauses()
    yield tracker
    tracker.close()


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
def test_a_peer_that_closed_first_is_the_peer(causes, reset):
    with loopback() as pair:
        client, accepted = pair()
        fd = accepted.fileno()
        causes.opened(fd)
        if reset:  # SO_LINGER 0: the close sends a RST instead of a FIN
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        accepted.close()  # libzmq saw the end of stream (or the reset) and closed its fd
        assert causes.closed(fd) is Cause.PEER
        assert len(causes) == 0


@pytest.mark.parametrize("pending", [b"", b"the rest of an oversize message"])
def test_a_hang_up_on_a_live_peer_is_the_node_and_reaches_the_peer_afterwards(causes, pending):
    with loopback() as pair:
        client, accepted = pair()
        fd = accepted.fileno()
        causes.opened(fd)
        client.sendall(pending)
        accepted.close()  # libzmq dropped the peer; the duplicate still holds the socket
        client.settimeout(0.2)
        with pytest.raises(TimeoutError):
            client.recv(1)  # no FIN yet: the peer cannot have closed in the meantime
        assert causes.closed(fd) is Cause.NODE
        client.settimeout(5.0)
        try:
            assert client.recv(1) == b""  # ... and once looked at, the hang-up reaches the peer
        except ConnectionResetError:
            assert pending  # unread bytes turn the close into a reset
        assert len(causes) == 0


def test_the_fd_number_reused_after_the_duplicate_was_taken_is_harmless(causes):
    with loopback() as pair:
        first, accepted = pair()
        fd = accepted.fileno()
        causes.opened(fd)
        first.close()
        _, newer = pair()
        os.dup2(newer.fileno(), fd)  # the closed connection's number now names a live, newer connection
        assert causes.closed(fd) is Cause.PEER  # judged on the duplicate, the first connection's socket
        accepted.detach()
        os.close(fd)


def test_a_duplicate_taken_after_the_fd_was_reused_is_not_judged(causes):
    with loopback() as pair:
        first, accepted = pair()
        fd = accepted.fileno()
        first.close()
        _, newer = pair()
        os.dup2(newer.fileno(), fd)  # the opening event of `first` is handled only now, on the newer socket
        causes.opened(fd)
        # libzmq's fd still names the duplicate's socket, so it is not `first`'s
        assert causes.closed(fd) is Cause.UNKNOWN
        assert len(causes) == 1  # kept for the newer connection, whose own events follow
        newer.close()
        accepted.detach()
        os.close(fd)  # the newer connection is hung up on while its client is alive
        assert causes.closed(fd) is Cause.NODE


def test_an_fd_closed_before_its_opening_event_is_unknown(causes):
    with loopback() as pair:
        _, accepted = pair()
        fd = accepted.fileno()
        accepted.close()
        causes.opened(fd)
        assert causes.closed(fd) is Cause.UNKNOWN


def test_connections_beyond_the_limit_are_not_watched():
    causes = DisconnectCauses(limit=1)
    with loopback() as pair:
        (_, first), (_, second) = pair(), pair()
        causes.opened(first.fileno())
        causes.opened(second.fileno())  # over the limit: no duplicate, so no fd spent on it
        assert len(causes) == 1
        fd = second.fileno()
        second.close()
        assert causes.closed(fd) is Cause.UNKNOWN
    causes.close()
