"""The inference node: camera frames and ego poses in over ZeroMQ, trajectories out.

Python API (what `alpamayo serve` and real-time replay use):

    node = InferenceNode(predictor, NodeConfig(...), tracer=Tracer()).start()
    node.endpoints       # {"input": [...], "output": ..., "control": ...}, bound `:*` ports resolved
    node.status()        # liveness, readiness, counters, per-stream state, last error (as the control reply)
    node.ingest(buf)     # feed one message in-process, through the same validation and counters as the socket
    node.wait(timeout)   # True once a shutdown was requested (control `shutdown`, or request_shutdown(why))
    node.stop()          # stop intake, cancel the prediction at its next step, publish why it stopped, close

With `predictor=None` the node runs intake-only: sockets, validation, windows, counters and control work, and
each window is answered with a valid=false output ("no model loaded"); the node never reports ready. This is
for checking sensor wiring before a model is loaded (`alpamayo serve --no-model`) and for timing the node's
own work (benchmarks/node_overhead.py).

Threads: the intake thread owns the input SUB socket and drains it continuously (validate, update the frame
rings; JPEGs stay compressed), so the newest frames are kept while the model runs. The control thread owns
the control ROUTER socket and the socket monitors, so `status` is answered within milliseconds whatever the
input load (benchmarks/node_hardening.py). The predict thread warms the model up, then takes the newest
complete window whenever t0 advances, has its JPEG frames decoded by the `DecodePool` (off the intake
thread, within a time budget), predicts and publishes on the PUB socket. While no window can be formed (inputs
stale, or fresh but not alignable) it publishes a valid=false message once per period instead, naming the
reason (logged sparingly, see `StaleLog`).
"""

from __future__ import annotations

import functools
import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from alpamayo.prediction import (
    FRAMES_PER_CAMERA,
    HISTORY_STEPS,
    Cancellation,
    EgoHistory,
    Prediction,
    PredictionCancelled,
    Predictor,
)
from alpamayo.profiling import Tracer
from bridges.node.config import NodeConfig
from bridges.node.disconnects import Cause, DisconnectCauses
from bridges.node.window import InputState, Selection, StoredFrame, Window
from bridges.wire.jpeg import DecodePool, JpegError
from bridges.wire.protocol import (
    CONTROL_COMMANDS,
    CONTROL_REQUEST_FRAMES,
    MAX_CONTROL_BYTES,
    MAX_ROUTING_FRAMES,
    CameraTable,
    ProtocolError,
    TrajectoryMessage,
    WireFrame,
    decode_message,
    encode_trajectory,
)
from bridges.wire.sockets import CurveServer, attach, make_socket

log = logging.getLogger(__name__)

POLL_MS = 50  # intake and control poll timeout: how quickly their threads notice stop()
# messages (or parts of a multipart one) drained before the intake thread polls again; control frames read
# before the control thread polls its monitors again
DRAIN_BATCH = 256
# Connections the kernel queues for the control socket before libzmq accepts them (listen(2)'s backlog; the
# kernel caps it at net.core.somaxconn, 4096 since Linux 5.4). libzmq's default of 100 overflowed in 2 of 5
# runs of 300 clients connecting at once, and those clients waited the 1 s SYN retransmit (issue 45).
CONTROL_BACKLOG = 1024
NO_MODEL = "no model loaded (intake-only node)"
# While no window forms (cameras not connected yet, a stream gone) a stale output goes out every period, 10 per
# second: each is logged only when the set of stale streams changes, and otherwise once this often with the
# count in between, so a node waiting for its cameras does not bury its log.
STALE_LOG_EVERY_S = 10.0
# Receiving sockets disconnect peers whose message exceeds the protocol limit by half again (bridge.md §3.2):
# messages between 1x and 1.5x still reach the validator, so most oversize input is counted, not just dropped.
MAXMSGSIZE_FACTOR = 1.5
# Socket-monitor events of a failed handshake: a key not on the allow-list (AUTH), a mechanism mismatch such
# as a plain client at a CURVE node or a wrong server key (PROTOCOL, measured with libzmq 4.3.5), or a peer
# that is not ZMTP at all (NO_DETAIL). libzmq then reports the connection's DISCONNECTED right after it.
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH,
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
)
# What the monitors report: connections opening and closing (with their fds), and failed handshakes.
MONITORED = functools.reduce(
    operator.or_, HANDSHAKE_FAILED, zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
)


@dataclass
class NodeCounters:
    """Cumulative node counts. Every input message is either accepted (frame or ego) or rejected by reason:
    messages == frames_accepted + ego_accepted + rejected_total (a message whose processing raised an
    unexpected exception is counted in internal_errors instead)."""

    messages: int = 0
    frames_accepted: int = 0
    ego_accepted: int = 0
    rejected_total: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    predictions: int = 0
    prediction_errors: int = 0
    predictions_cancelled: int = 0  # stopped at a step boundary by a shutdown (warm-up predictions too)
    published: int = 0
    published_invalid: int = 0
    # Input connections ended after a completed handshake, told apart by `bridges.node.disconnects`: by the node
    # (libzmq dropped a live peer: a message over ZMQ_MAXMSGSIZE, or a heartbeat timeout), or by the peer (an
    # ordinary close or reset, and the rare connection gone before the node could watch it).
    input_disconnects: int = 0
    peer_disconnects: int = 0
    auth_failures: int = 0  # failed handshakes on any node socket (HANDSHAKE_FAILED), whatever the mechanism
    control_requests: int = 0
    # control requests answered with an error ("malformed": not a msgpack map; "command": an unknown cmd) or,
    # "envelope", dropped unread without a reply (more frames than a REQ or DEALER client sends)
    control_rejected: dict[str, int] = field(default_factory=dict)
    internal_errors: int = 0  # unexpected exceptions in a node thread (bugs); logged with their traceback

    def as_dict(self) -> dict[str, Any]:
        return {k: dict(v) if isinstance(v, dict) else v for k, v in vars(self).items()}


class InferenceNode:
    """See the module docstring. `predictor` is any `alpamayo.prediction.Predictor` (AlpamayoVLA), or None
    for an intake-only node."""

    def __init__(self, predictor: Predictor | None, config: NodeConfig, tracer: Tracer | None = None):
        self.predictor = predictor
        self.config = config
        self.tracer = tracer if tracer is not None else Tracer(enabled=False)
        self.cameras = CameraTable(
            dict(config.cameras), {config.cameras[n]: f for n, f in config.camera_formats.items()}
        )
        self.limits = config.limits.protocol
        self.state = InputState(
            self.cameras, config.timing, config.limits.ring_frames, round(config.limits.ring_mb * 1e6)
        )
        self.decoder: DecodePool | None = None
        self.counters = NodeCounters()
        self.endpoints: dict[str, Any] = {}
        self.warmed_up = False
        self.warmup_s: float | None = None  # how long the warm-up predictions took, once done
        self._warming = threading.Event()  # set while the warm-up predictions run
        self._predicting_since: float | None = None  # monotonic s when the prediction in flight began
        self._lock = threading.Lock()  # counters, last error, last output
        self._last_error: tuple[str, str, float] | None = None  # (reason, message, monotonic time)
        self._last_output: TrajectoryMessage | None = None
        self._seq = 0
        self._stale_log = StaleLog(STALE_LOG_EVERY_S)
        self._predictor_epoch = 0
        self._started_at = 0.0
        self._stopping = threading.Event()
        self._shutdown_requested = threading.Event()
        self._stop_cause = "stop() called"  # what asked for the stop: the final output's reason
        self._cancel = Cancellation()  # set by stop(): the running prediction ends at its next step
        self._cancelled: Window | None = None  # the window whose prediction stop() cancelled (predict thread)
        self.interrupted: str | None = None  # what stop() interrupted: "prediction cancelled", ... or None
        self._new_input = threading.Event()
        self._answered_ns = 0  # perf_counter_ns when a window was last answered (or the node started)
        self._failed_handshake: set[zmq.Socket] = set()  # monitors whose next DISCONNECTED ends a failed one
        # the input connections' fds, to tell who ended each (control thread only)
        self._causes = DisconnectCauses()
        self._input_connections = 0  # open input connections, from their monitor events
        # Connected input endpoints whose connection ended: libzmq 4.3.5 never reconnects after a message over
        # ZMQ_MAXMSGSIZE (a protocol error; measured), so the intake thread, which owns the socket, connects
        # them again (after a close or a heartbeat timeout libzmq was reconnecting anyway, and this only
        # restarts that). The control thread appends; the intake thread pops.
        self._reconnect: deque[str] = deque()
        # Parts received so far of the multipart message being discarded (intake thread only); 0 between messages.
        self._multipart_parts = 0
        # Control thread only: the frames read so far of the request being read, and of an envelope being
        # dropped (0 between requests).
        self._request: list[bytes] = []
        self._envelope_frames = 0
        # endpoint -> (monotonic s of its last "connected again" line, reconnects since): a camera whose every
        # frame is oversize is dropped and reconnected at its frame rate, logged once per STALE_LOG_EVERY_S
        self._reconnect_log: dict[str, tuple[float, int]] = {}
        self._pub_lock = threading.Lock()
        self._pub: zmq.Socket | None = None  # the output socket, None once stopped
        self._ctx: zmq.Context | None = None
        self._curve: CurveServer | None = None
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> InferenceNode:
        """Create and bind/connect the sockets, then start the intake and predict threads."""
        cfg, timing = self.config, self.config.timing
        self._started_at = time.monotonic()
        ctx = self._ctx = zmq.Context()
        if cfg.curve is not None:
            try:
                self._curve = CurveServer(ctx, cfg.curve.server_secret_key, cfg.curve.authorized_keys)
            except (OSError, ValueError):
                self._close_context()
                raise
        opts = dict(linger_ms=timing.linger_ms, heartbeat_ms=timing.heartbeat_ms)
        sub = make_socket(
            ctx,
            zmq.SUB,
            max_message_bytes=int(MAXMSGSIZE_FACTOR * self.limits.max_message_bytes),
            hwm=cfg.input.hwm,
            **opts,
        )
        pub = make_socket(ctx, zmq.PUB, **opts)
        control = make_socket(ctx, zmq.ROUTER, max_message_bytes=MAX_CONTROL_BYTES, **opts)
        control.setsockopt(zmq.BACKLOG, CONTROL_BACKLOG)
        sockets = (sub, pub, control)
        # Monitors before bind/connect: a connecting input's CONNECTED can come at once, and its fd is needed.
        monitors = {sock.get_monitor_socket(MONITORED): sock for sock in sockets}
        try:
            for sock in sockets:
                if self._curve is not None:
                    self._curve.apply(sock)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            self.endpoints = {
                "input": [attach(sub, ep, cfg.input.bind) for ep in cfg.input.endpoints],
                "output": attach(pub, cfg.output.endpoint, cfg.output.bind),
                "control": attach(control, cfg.control.endpoint, True),
            }
        except (ValueError, zmq.ZMQError):
            for sock in (*monitors, *sockets):
                sock.close(0)
            self._close_context()
            raise
        self._pub = pub
        self._answered_ns = time.perf_counter_ns()
        if self.predictor is not None:
            self._warming.set()  # before the predict thread starts, so a stop() at once sees the warm-up
        self.decoder = DecodePool(cfg.limits.decode_threads, cfg.limits.decode_budget_ms)
        self._threads = [
            threading.Thread(target=self._intake_loop, args=(sub,), name="node-intake"),
            threading.Thread(target=self._control_loop, args=(control, monitors, sub), name="node-control"),
            threading.Thread(target=self._predict_loop, name="node-predict", daemon=True),
        ]
        for t in self._threads:
            t.start()
        log.info("node listening: %s", self.endpoints)
        return self

    def request_shutdown(self, cause: str = "shutdown requested") -> None:
        """Ask the owner to stop (what the control `shutdown` command and SIGTERM do); see `wait`. The first
        request's `cause` ("SIGTERM received") is the reason the node's last output gives."""
        # no lock: a second signal can arrive while the main thread is in here
        if not self._shutdown_requested.is_set():
            self._stop_cause = cause
        self._shutdown_requested.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a shutdown is requested or `timeout` s pass; True if requested."""
        return self._shutdown_requested.wait(timeout)

    def stop(self) -> bool:
        """Stop intake and control, cancel the running prediction (or warm-up) at its next step boundary,
        publish a last valid=false output saying why the node stopped (answering the cancelled window, if
        any), close every socket with the configured linger. Returns False if the prediction did not reach a
        step boundary within timing.shutdown_timeout_s and was abandoned, still running."""
        if not self._threads:
            return True
        self.request_shutdown("stop() called")
        phase = self.phase
        self._stopping.set()
        self._cancel.cancel()
        self._new_input.set()
        intake, control, predict = self._threads
        intake.join()
        control.join()
        timeout_s = self.config.timing.shutdown_timeout_s
        predict.join(timeout_s)
        finished = not predict.is_alive()
        if not finished:
            self.interrupted = f"{phase} abandoned"
            log.warning("%s still running after %.1f s: abandoned", phase, timeout_s)
        self._decode_pool().close()
        reason = f"node stopped: {self._stop_cause}"
        if self.interrupted is not None:
            reason += f", {self.interrupted}"
        window = self._cancelled if finished else None
        with self._pub_lock:  # the last output: an abandoned prediction can publish nothing after it
            self._send(self._message(window, [reason], time.perf_counter_ns()), window)
            self._output().close()
            self._pub = None
        self._close_context()
        self._threads = []
        log.info("node stopped")
        return finished

    @property
    def phase(self) -> str:
        """What the predict thread is doing: "warm-up" until the model is warmed up, then "prediction"."""
        return "warm-up" if self._warming.is_set() else "prediction"

    def _close_context(self) -> None:
        if self._curve is not None:
            self._curve.stop()
            self._curve = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def __enter__(self) -> InferenceNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------ intake
    def ingest(self, message: bytes | bytearray | memoryview, recv_ns: int | None = None) -> str | None:
        """Validate and add one input message; returns the rejection reason, or None if accepted."""
        recv_ns = time.perf_counter_ns() if recv_ns is None else recv_ns
        start = time.perf_counter_ns()
        try:
            decoded = decode_message(message, self.limits, self.cameras)
            decode_ms = (time.perf_counter_ns() - start) / 1e6
            self.state.accept(decoded, recv_ns, decode_ms)
        except ProtocolError as e:
            with self._lock:
                self.counters.messages += 1
                self._count_rejection(e.reason, str(e))
            log.debug("rejected (%s): %s", e.reason, e)
            return e.reason
        # The span's kind keeps the names traces have carried (benchmarks/node_overhead.py selects frames by it).
        kind = "CameraFrame" if isinstance(decoded, WireFrame) else "EgoPose"
        self.tracer.record("decode", start, time.perf_counter_ns() - start, kind=kind)
        with self._lock:
            self.counters.messages += 1
            if isinstance(decoded, WireFrame):
                self.counters.frames_accepted += 1
            else:
                self.counters.ego_accepted += 1
        self._new_input.set()
        return None

    def _count_rejection(self, reason: str, message: str) -> None:
        """Count a rejected message and make it the last error. The caller holds `_lock`, together with its
        other counter changes, so that messages == accepted + rejected for every reader."""
        self.counters.rejected_total += 1
        self.counters.rejected[reason] = self.counters.rejected.get(reason, 0) + 1
        self._last_error = (reason, message, time.monotonic())

    def _intake_loop(self, sub: zmq.Socket) -> None:
        try:
            while not self._stopping.is_set():
                if sub.poll(POLL_MS):
                    self._drain(sub)
                while self._reconnect:
                    with self._guard("intake"):
                        self._connect_again(sub, self._reconnect.popleft())
        finally:
            sub.close()

    def _connect_again(self, sub: zmq.Socket, endpoint: str) -> None:
        """Connect to an input endpoint again after its connection ended (see `_reconnect`)."""
        with suppress(zmq.ZMQError):  # the endpoint is no longer registered
            sub.disconnect(endpoint)
        sub.connect(endpoint)
        now = time.monotonic()
        last, since = self._reconnect_log.get(endpoint, (-STALE_LOG_EVERY_S, 0))
        if now - last < STALE_LOG_EVERY_S:
            self._reconnect_log[endpoint] = (last, since + 1)
            return
        more = f" ({since} more times since the last line)" if since else ""
        log.warning("input %s: connected again after its connection ended%s", endpoint, more)
        self._reconnect_log[endpoint] = (now, 0)

    def _drain(self, sub: zmq.Socket) -> None:
        for _ in range(DRAIN_BATCH):
            start = time.perf_counter_ns()
            try:
                frame = sub.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if self._multipart_parts or frame.more:
                self._discard_part(frame.more)
                continue
            recv_ns = time.perf_counter_ns()
            self.tracer.record("receive", start, recv_ns - start, bytes=len(frame))
            with self._guard("intake"):
                self.ingest(frame.buffer, recv_ns)

    def _discard_part(self, more: bool) -> None:
        """Drop one part of a multipart message unparsed; count the message once, as `multipart`, at its last
        part. The protocol takes one ZeroMQ frame per message, and libzmq delivers a multipart message whole
        whatever the receive HWM. Parsing each part as a message kept `status` waiting 549 ms under one
        100,000-part message (issue 27); benchmarks/node_hardening.py --envelopes 5 measured 5 such messages
        parsed in 67 s with status p99 48.6 ms / max 148 ms, and dropped unparsed in 4.5 s with p99 32 ms /
        max 48 ms (2 shared cores, load 12). Parts are dropped DRAIN_BATCH per slice, so the control thread
        runs between slices."""
        self._multipart_parts += 1
        if more:
            return
        parts, self._multipart_parts = self._multipart_parts, 0
        message = f"a message of {parts} ZeroMQ frames; the protocol takes exactly 1 frame per message"
        with self._lock:
            self.counters.messages += 1
            self._count_rejection("multipart", message)
        log.debug("rejected (multipart): %s", message)

    def _count_monitor_event(self, monitor: zmq.Socket, is_input: bool) -> None:
        message = recv_monitor_message(monitor)
        # the value of ACCEPTED, CONNECTED and DISCONNECTED is the connection's fd
        event, fd = message["event"], message["value"]
        if event in (zmq.EVENT_ACCEPTED, zmq.EVENT_CONNECTED):
            if is_input:
                self._causes.opened(fd)
                with self._lock:
                    self._input_connections += 1
            return
        cause = self._causes.closed(fd) if is_input and event == zmq.EVENT_DISCONNECTED else None
        with self._lock:
            if event in HANDSHAKE_FAILED:
                self.counters.auth_failures += 1
                self._failed_handshake.add(monitor)
            elif event == zmq.EVENT_DISCONNECTED:
                if is_input:
                    self._input_connections -= 1
                if monitor in self._failed_handshake:
                    self._failed_handshake.discard(monitor)  # the failed handshake's own disconnect
                elif is_input:
                    if cause is Cause.NODE:
                        self.counters.input_disconnects += 1
                    else:
                        self.counters.peer_disconnects += 1
                    if not self.config.input.bind:
                        # Whoever ended it: reconnecting does not wait on the cause, which a connection that
                        # closed before the node watched it leaves unknown (seen under load).
                        self._reconnect.append(message["endpoint"].decode())

    # ------------------------------------------------------------------------------------------ control
    def _control_loop(
        self, control: zmq.Socket, monitors: dict[zmq.Socket, zmq.Socket], sub: zmq.Socket
    ) -> None:
        poller = zmq.Poller()
        for sock in (control, *monitors):
            poller.register(sock, zmq.POLLIN)
        try:
            while not self._stopping.is_set():
                events = dict(poller.poll(POLL_MS))
                if control in events:
                    self._serve_control(control)
                for monitor, watched in monitors.items():
                    if monitor in events:
                        with self._guard("control"):
                            self._count_monitor_event(monitor, watched is sub)
        finally:
            self._causes.close()
            for monitor in monitors:  # each watched socket stops its monitor when it closes
                monitor.close()
            control.close()

    def _serve_control(self, control: zmq.Socket) -> None:
        """Read control requests frame by frame, DRAIN_BATCH frames per call (the control loop serves the
        socket monitors and notices stop() in between), and answer each complete one. A request is the routing
        id the ROUTER prepends, at most MAX_ROUTING_FRAMES routing frames and the request map (protocol.md,
        "Control"); one with more frames is an envelope no REQ or DEALER client sends: it is dropped unparsed
        as it is read, without a reply (echoing it would amplify it), and counted once at its last frame
        (`control_rejected` "envelope"). Echoing such envelopes took 0.52-0.60 s each (issue 45). libzmq hands
        a message over whole, so a request queued behind an envelope still waits for it to be read, at pyzmq's
        1-12 us a frame (docs/protocol.md, "Envelope limit"; benchmarks/node_hardening.py)."""
        recv = control.recv
        for _ in range(DRAIN_BATCH):
            try:
                frame = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if self._envelope_frames:  # dropping an envelope
                self._envelope_frames += 1
                if not frame.more:
                    self._count_envelope()
            elif frame.more and len(self._request) == CONTROL_REQUEST_FRAMES - 1:
                self._envelope_frames, self._request = len(self._request) + 1, []
            elif frame.more:
                self._request.append(frame.bytes)
            else:
                frames, self._request = [*self._request, frame.bytes], []
                self._answer(control, frames)

    def _answer(self, control: zmq.Socket, frames: list[bytes]) -> None:
        """Reply to one request: its envelope (every frame but the last) back, then the reply map."""
        with self._lock:
            self.counters.control_requests += 1
        reply = {"ok": False, "error": "internal error, see the node's log"}
        with self._guard("control"):
            reply = self.control_reply(frames[-1])
        control.send_multipart([*frames[:-1], msgpack.packb(reply, use_bin_type=True)])

    def _count_envelope(self) -> None:
        frames, self._envelope_frames = self._envelope_frames, 0
        message = (
            f"a control request of {frames} ZeroMQ frames; a request is at most {CONTROL_REQUEST_FRAMES} (the "
            f"routing id, {MAX_ROUTING_FRAMES} routing frames, the request): dropped unread, no reply"
        )
        with self._lock:
            self.counters.control_requests += 1
            self.counters.control_rejected["envelope"] = self.counters.control_rejected.get("envelope", 0) + 1
            self._last_error = ("control_envelope", message, time.monotonic())
        log.debug("control request dropped (envelope): %s", message)

    def control_reply(self, body: bytes) -> dict[str, Any]:
        """Answer one control request: a msgpack map {"cmd": "status" | "reset" | "shutdown"}."""
        try:
            request = msgpack.unpackb(body, raw=False, max_array_len=16, max_map_len=16)
        except (ValueError, TypeError) as e:
            return self._control_error("malformed", f"request is not valid msgpack: {e}")
        cmd = request.get("cmd") if isinstance(request, dict) else None
        if cmd not in CONTROL_COMMANDS:
            return self._control_error("command", f"cmd {cmd!r} is not one of: {', '.join(CONTROL_COMMANDS)}")
        if cmd == "reset":
            self.state.reset()
            log.info("reset: frame rings and ego history cleared")
        elif cmd == "shutdown":
            log.info("shutdown requested over the control socket")
            self.request_shutdown("shutdown requested over the control socket")
        return {"ok": True, "cmd": cmd, **self.status()}

    def _control_error(self, reason: str, message: str) -> dict[str, Any]:
        """The reply to a bad control request, counted under `reason` in `control_rejected`."""
        with self._lock:
            self.counters.control_rejected[reason] = self.counters.control_rejected.get(reason, 0) + 1
        return {"ok": False, "error": message}

    def status(self) -> dict[str, Any]:
        """Liveness (both threads running), readiness (warmed up, inputs fresh, not stopping), how long the
        prediction in flight has run (None when none is), counters, per-stream state, the last error and the
        last output."""
        now = time.perf_counter_ns()
        stale = self.state.stale_reasons(now)
        not_ready = list(stale)
        if self.predictor is None:
            not_ready.insert(0, NO_MODEL)
        elif not self.warmed_up:
            not_ready.insert(0, "model not warmed up yet")
        if self._shutdown_requested.is_set():
            not_ready.insert(0, "shutting down")
        with self._lock:
            counters = self.counters.as_dict()
            connections = self._input_connections
            error, output = self._last_error, self._last_output
            since = self._predicting_since
        return {
            "alive": bool(self._threads) and all(t.is_alive() for t in self._threads),
            "ready": not not_ready,
            "not_ready_reasons": not_ready,
            "uptime_s": time.monotonic() - self._started_at,
            "prediction_running_s": None if since is None else time.monotonic() - since,
            "endpoints": self.endpoints,
            "counters": counters,
            "input_connections": connections,
            "ticks_dropped": self.state.ticks_dropped,
            "frame_drop_perc": self.state.frame_drop_perc(),
            "streams": self.state.snapshot(now),
            "memory": self.state.memory(),
            "waiting_for": self.state.waiting_for,
            "last_error": None
            if error is None
            else {"reason": error[0], "message": error[1], "age_s": time.monotonic() - error[2]},
            "last_output": None
            if output is None
            else {
                "seq": output.seq,
                "t0_ns": output.t0_ns,
                "valid": output.valid,
                "invalid_reasons": output.invalid_reasons,
                "model_execution_ms": output.model_execution_ms,
            },
        }

    # ------------------------------------------------------------------------------------------ predict
    def _predict_loop(self) -> None:
        self._warm_up()
        last_invalid_ns = 0
        while not self._stopping.is_set():
            self._new_input.wait(self.state.period_ns / 2e9)
            self._new_input.clear()
            if self._stopping.is_set():
                return
            with self._guard("predict"):
                last_invalid_ns = self._tick(last_invalid_ns)

    def _tick(self, last_invalid_ns: int) -> int:
        """Predict on a new window, or, while none can be formed, publish valid=false once a period with the
        reason (stale streams, or what `select` found missing); returns when it last did the latter."""
        start = time.perf_counter_ns()
        selection = self.state.select(start)
        window = None if selection is None else self._decode_and_commit(selection, start)
        window_ns = time.perf_counter_ns() - start
        if isinstance(window, Window):
            self.tracer.record("window", start, window_ns, t0_ns=window.t0_ns)
            self._predict(window, window_ns / 1e6)
            self._answered_ns = time.perf_counter_ns()
            return last_invalid_ns
        period = self.state.period_ns
        if start - last_invalid_ns < period:  # reported within the period: nothing to look at until it ends
            return last_invalid_ns
        stale = self.state.stale_reasons(start)
        # Fresh inputs between two windows are normal for up to a period (plus the cameras' sync jitter).
        waited = start - self._answered_ns > period + self.state.sync_ns
        if stale or waited:
            reasons = stale or [window or self.state.waiting_for]
            self._publish(self._message(None, reasons, start), None)
            return start
        return last_invalid_ns

    def _decode_and_commit(self, selection: Selection, now_ns: int) -> Window | str | None:
        """Decode the selection's JPEG frames (`DecodePool`) and commit it. A frame that fails is taken out of
        its ring and its message counted as rejected (`jpeg_decode`); the reason is returned instead."""
        pending = selection.undecoded()
        failures = []
        jpegs = [_jpeg(s.frame) for s in pending]
        for stored, result in zip(pending, self._decode_pool().decode(jpegs), strict=True):
            if isinstance(result, JpegError):
                failures.append(self._reject_decoded(stored, result))
            else:
                stored.frame.image, ms = result
                stored.decode_ms += ms
        if failures:
            return "; ".join(failures)
        return self.state.commit(selection, now_ns)

    def _reject_decoded(self, stored: StoredFrame, error: JpegError) -> str:
        """Move an accepted frame that does not decode to the rejected count (messages == accepted + rejected
        holds throughout)."""
        frame = stored.frame
        message = f"camera {self.cameras.name(frame.camera)!r}: frame_id {frame.frame_id}: jpeg {error}"
        if not self.state.discard(stored):
            return message  # it left the ring while decoding: counted as dropped already
        with self._lock:
            self.counters.frames_accepted -= 1
            self._count_rejection("jpeg_decode", message)
        log.debug("rejected after decoding (jpeg_decode): %s", message)
        return message

    @contextmanager
    def _guard(self, where: str) -> Iterator[None]:
        """Keep a node thread alive through an unexpected exception (a bug): it is logged with its traceback,
        counted in `internal_errors` and reported as the last error, and the thread carries on."""
        try:
            yield
        except Exception as e:
            log.exception("internal error in the %s thread", where)
            self._record_error("internal", f"{where}: {type(e).__name__}: {e}")
            with self._lock:
                self.counters.internal_errors += 1

    def _warm_up(self) -> None:
        """Predictions on mid-grey frames and a straight 10 m/s drive; no frame_times_ns, so nothing is cached.

        First the predictor forgets the frame features it holds: this node's camera streams start now, and a
        model that served before (an earlier node in the process, a replay) keyed its features by camera and
        frame time only, so a new frame at a time it had seen would get another frame's features (found by a
        random-order test run: the second node on one model published waypoints 0.48 m off)."""
        if self.predictor is None:
            return
        self.predictor.reset()
        w = self.config.warmup
        frames = {
            i: [np.full((w.height, w.width, 3), 128, np.uint8)] * FRAMES_PER_CAMERA
            for i in self.cameras.indices.values()
        }
        steps = np.arange(HISTORY_STEPS)
        ego = EgoHistory(
            xyz=np.stack([steps * 1.0, np.zeros(HISTORY_STEPS), np.zeros(HISTORY_STEPS)], axis=1),
            quat_xyzw=np.tile([0.0, 0.0, 0.0, 1.0], (HISTORY_STEPS, 1)),
            t_ns=steps * self.state.period_ns,
        )
        start = time.perf_counter()
        try:
            for _ in range(w.runs):
                self._call_predictor(frames, ego, None)
        except PredictionCancelled:
            self._count_cancelled("warm-up", None)
            return
        except Exception as e:  # a failing model must leave the node up, to report it in `status`
            self._record_error("warmup", f"warm-up prediction failed: {type(e).__name__}: {e}")
            log.error("warm-up failed: %s", e)
            return
        finally:
            self._warming.clear()
        self.warmup_s = time.perf_counter() - start
        self.warmed_up = True
        log.info("warmed up: %d prediction(s) in %.2f s", w.runs, self.warmup_s)

    def _call_predictor(
        self,
        frames: dict[int, list[np.ndarray]],
        ego: EgoHistory,
        frame_times_ns: dict[int, list[int]] | None,
    ) -> Prediction:
        m = self.config.model
        predictor = self.predictor
        if predictor is None:  # callers answer NO_MODEL or skip the warm-up without one
            raise RuntimeError("the node has no predictor to call")
        with self._lock:
            self._predicting_since = time.monotonic()
        try:
            return predictor.predict(
                frames,
                ego,
                route=m.route,
                num_samples=m.num_samples,
                seed=m.seed,
                frame_times_ns=frame_times_ns,
                stream=f"node-epoch-{self._predictor_epoch}",  # the camera streams since they last (re)started
                cancel=self._cancel,
            )
        finally:
            with self._lock:
                self._predicting_since = None

    def _count_cancelled(self, phase: str, window: Window | None) -> None:
        """A prediction (of `window`; None: a warm-up one) that stop() cancelled: stop() publishes its answer."""
        self._cancelled, self.interrupted = window, f"{phase} cancelled"
        with self._lock:
            self.counters.predictions_cancelled += 1
        log.info("%s cancelled at a step boundary", phase)

    def _predict(self, window: Window, window_ms: float) -> None:
        if self.predictor is None:
            self._publish(self._message(window, [NO_MODEL], time.perf_counter_ns()), window)
            return
        if window.epoch != self._predictor_epoch:
            self.predictor.reset()  # streams restarted: cached per-frame features may share times with new frames
            self._predictor_epoch = window.epoch
        start = time.perf_counter()
        try:
            prediction = self._call_predictor(window.frames, window.ego, window.frame_times_ns)
            xyz, heading = prediction.waypoints()
        except PredictionCancelled:
            self._count_cancelled("prediction", window)
            return
        except Exception as e:  # one bad window must not stop the node; it is reported and published
            message = f"prediction failed: {type(e).__name__}: {e}"
            self._record_error("prediction", message)
            with self._lock:
                self.counters.prediction_errors += 1
            self._publish(self._message(window, [message], time.perf_counter_ns()), window)
            return
        model_ms = (time.perf_counter() - start) * 1e3
        now = time.perf_counter_ns()
        reasons = self.state.stale_reasons(now)
        age_ms = (now - window.recv_ns) / 1e6
        if age_ms > self.config.timing.stale_after_ms:
            reasons.append(f"frame age {age_ms:.0f} ms exceeds {self.config.timing.stale_after_ms:.0f} ms")
        if not (np.isfinite(xyz).all() and np.isfinite(heading).all()):
            reasons.append("trajectory has non-finite waypoints")
        msg = self._message(window, reasons, now)
        best = prediction.best
        msg.token_ids = [int(t) for t in best.token_ids]
        msg.t = [float(v) for v in prediction.t_s]
        msg.x, msg.y, msg.z = (xyz[:, k].tolist() for k in range(3))
        msg.heading = heading.tolist()
        msg.reasoning = best.reasoning
        msg.decoder = prediction.decoder
        msg.model_execution_ms = model_ms
        msg.timings_ms = {"decode": window.decode_ms, "window": window_ms, **prediction.timings_ms}
        with self._lock:
            self.counters.predictions += 1
        self._publish(msg, window)

    def _message(self, window: Window | None, reasons: list[str], now_ns: int) -> TrajectoryMessage:
        """An output answering `window` (None: stale inputs), valid when no reason says otherwise, with its
        frame age at `now_ns` (perf_counter clock); `seq` is set when it is published."""
        return TrajectoryMessage(
            seq=0,
            t0_ns=None if window is None else window.t0_ns,
            valid=not reasons,
            invalid_reasons=reasons,
            cameras=[] if window is None else window.cameras,
            frame_age_ms=None if window is None else (now_ns - window.recv_ns) / 1e6,
            frame_drop_perc=self.state.frame_drop_perc(),
        )

    def _publish(self, msg: TrajectoryMessage, window: Window | None) -> None:
        with self._pub_lock:
            if self._pub is None:  # stopped while an abandoned prediction ran
                return
            self._send(msg, window)

    def _output(self) -> zmq.Socket:
        """The output socket; RuntimeError before start() or after stop() (callers check `_pub` first)."""
        if self._pub is None:
            raise RuntimeError("the node's output socket is not open")
        return self._pub

    def _decode_pool(self) -> DecodePool:
        """The JPEG decode pool; RuntimeError before start() (which creates it)."""
        if self.decoder is None:
            raise RuntimeError("the node's JPEG decode pool is not started")
        return self.decoder

    def _send(self, msg: TrajectoryMessage, window: Window | None) -> None:
        """Publish `msg` (answering `window`, or None) and count it; the caller holds `_pub_lock`."""
        msg.seq = self._seq
        self._seq += 1
        with self.tracer.span("serialise", seq=msg.seq):
            data = encode_trajectory(msg)
        with self.tracer.span("publish", seq=msg.seq, bytes=len(data)):
            self._output().send(data)
        end = time.perf_counter_ns()
        if window is not None:
            self.tracer.record(
                "e2e_age", window.recv_ns, end - window.recv_ns, seq=msg.seq, t0_ns=window.t0_ns
            )
        with self._lock:
            self.counters.published += 1
            self.counters.published_invalid += not msg.valid
            self._last_output = msg
            if window is None:
                line = self._stale_log.line(msg, time.monotonic())
            else:
                line = summary(msg)
                self._stale_log.clear()  # inputs came back: the next stale spell is news again
        if line is not None:
            log.info("%s", line)

    def _record_error(self, reason: str, message: str) -> None:
        with self._lock:
            self._last_error = (reason, message, time.monotonic())


class StaleLog:
    """Which stale-input outputs (answering no window) get a log line: the first, each whose stale streams
    differ from the last logged one's, and then one every `every_s` seconds, saying how many went unlogged."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self._streams: tuple[str, ...] | None = None  # stale streams of the last logged output
        self._logged_at = 0.0  # time.monotonic() of that line
        self._skipped = 0

    def line(self, msg: TrajectoryMessage, now_s: float) -> str | None:
        """The log line for stale output `msg` published at `now_s` (monotonic seconds), or None."""
        streams = tuple(reason.split(":", 1)[0] for reason in msg.invalid_reasons)
        if streams == self._streams and now_s - self._logged_at < self.every_s:
            self._skipped += 1
            return None
        skipped = f" [{self._skipped} like it since the last line]" if self._skipped else ""
        self._streams, self._logged_at, self._skipped = streams, now_s, 0
        return summary(msg) + skipped

    def clear(self) -> None:
        self._streams, self._skipped = None, 0


def _jpeg(frame: WireFrame) -> bytes:
    """An undecoded frame's JPEG bytes; RuntimeError if it has none (only JPEG frames arrive undecoded)."""
    if frame.jpeg is None:
        raise RuntimeError(f"camera {frame.camera} frame {frame.frame_id}: undecoded without JPEG bytes")
    return frame.jpeg


def summary(msg: TrajectoryMessage) -> str:
    """One log line per output: validity, timing, the 6.4 s waypoint and the reasoning."""
    head = f"seq={msg.seq} t0_ns={msg.t0_ns} valid={msg.valid}"
    if not msg.valid:
        head += f" ({'; '.join(msg.invalid_reasons)})"
    if not msg.x:
        return head
    return (
        f"{head} model={msg.model_execution_ms:.0f}ms age={msg.frame_age_ms:.0f}ms drop={msg.frame_drop_perc:.0f}% "
        f"end=({msg.x[-1]:.1f}, {msg.y[-1]:.1f}) m @ {msg.t[-1]:.1f} s | {msg.reasoning[:80]!r}"
    )
