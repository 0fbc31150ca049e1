"""How soon a peer sees the node hang up on it, with the node telling the disconnect's cause apart.

`bridges.node.disconnects` keeps a duplicate of each input connection's fd until the node's control thread has
handled the DISCONNECTED event, so the peer's view of the hang-up waits for that thread. This measures the
cost side by side in one run: a raw ZMTP peer (`tests.bridge_nodes.silent_zmtp_peer`) completes the handshake,
sends the header of a message over ZMQ_MAXMSGSIZE, and times until its socket reads end of stream or a
reset, `--rounds` times against each of

  * a bare libzmq SUB socket with the node's options (what libzmq alone does), and
  * an intake-only `InferenceNode` (`predictor=None`) with the default test config.

    python -m benchmarks.node_hangup [--rounds 30]    (from the checkout root: it imports `tests`)

Measured on the idle 2-core machine (30 rounds, three runs): bare SUB median 0.18-0.22 ms (max 0.3), node
0.61-0.63 ms (max 0.75): the node adds 0.4 ms, the control thread's wake-up; all 30 hang-ups were counted
as `input_disconnects`.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import zmq

from bridges.node.server import MAXMSGSIZE_FACTOR, InferenceNode
from bridges.wire.sockets import make_socket
from tests.bridge_nodes import node_config, silent_zmtp_peer

SETTLE_S = 0.02  # after the handshake, before the oversize header goes out


def hangup_ms(endpoint: str, size: int) -> float:
    """Milliseconds from sending a ZMTP long-frame header announcing `size` bytes until the peer sees the close."""
    peer = silent_zmtp_peer(endpoint)
    try:
        time.sleep(SETTLE_S)
        start = time.perf_counter()
        peer.sendall(b"\x02" + size.to_bytes(8, "big") + bytes(64))
        try:
            while peer.recv(65536):
                pass
        except ConnectionResetError:
            pass
        return (time.perf_counter() - start) * 1e3
    finally:
        peer.close()


def bare_sub(max_message_bytes: int, rounds: int) -> list[float]:
    ctx = zmq.Context()
    sub = make_socket(ctx, zmq.SUB, max_message_bytes=max_message_bytes)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind("tcp://127.0.0.1:*")
    endpoint = sub.getsockopt_string(zmq.LAST_ENDPOINT)
    stop = threading.Event()

    def intake() -> None:  # the application thread polls, as the node's intake thread does
        while not stop.is_set():
            sub.poll(50)

    thread = threading.Thread(target=intake)
    thread.start()
    try:
        return [hangup_ms(endpoint, 2 * max_message_bytes) for _ in range(rounds)]
    finally:
        stop.set()
        thread.join()
        sub.close(0)
        ctx.term()


def node(rounds: int) -> tuple[list[float], dict]:
    with InferenceNode(None, node_config()) as n:
        limit = n.limits.max_message_bytes
        times = [hangup_ms(n.endpoints["input"][0], 2 * limit) for _ in range(rounds)]
        time.sleep(0.2)
        return times, n.counters.as_dict()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    ours, counters = node(args.rounds)
    limit = int(MAXMSGSIZE_FACTOR * node_config().limits.protocol.max_message_bytes)
    bare = bare_sub(limit, args.rounds)
    for name, times in (("bare libzmq SUB", bare), ("node", ours)):
        print(
            f"{name:>16}: hang-up seen after median {statistics.median(times):.2f} ms, max {max(times):.2f} ms"
        )
    print(f"the node adds {statistics.median(ours) - statistics.median(bare):.2f} ms (median)")
    print(
        f"node counters: input_disconnects {counters['input_disconnects']}, peer {counters['peer_disconnects']}"
    )


if __name__ == "__main__":
    main()
