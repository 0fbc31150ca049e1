"""The node over real ZeroMQ sockets on loopback: windows and outputs, control, size limits, CURVE."""

from __future__ import annotations

import re

import msgpack
import numpy as np
import pytest

from alpamayo.cli import main
from bridges.camera_sim import CameraSim
from bridges.node.server import NO_MODEL, InferenceNode, StaleLog
from bridges.wire.client import ControlClient, FramePublisher
from bridges.wire.protocol import TrajectoryMessage, encode_ego, encode_frame
from bridges.wire.sockets import CurveClientKeys, create_keys
from tests.bridge_nodes import (
    CAMERAS,
    HEIGHT,
    WIDTH,
    answering_window,
    burst_publisher,
    node_config,
    running_node,
    wait_until,
)

IMAGE = np.zeros((HEIGHT, WIDTH, 3), np.uint8)


def test_intake_only_node_answers_each_window_with_the_frames_it_used():
    # 60 messages in 0.2 s: a burst publisher, so a loaded machine delays them but ZeroMQ drops none
    with running_node(None, node_config()) as c, burst_publisher(c) as pub:
        stats = CameraSim(pub, list(CAMERAS), WIDTH, HEIGHT, speedup=10).run(ticks=20)
        assert stats.frames == 40
        msg = wait_until(
            lambda: answering_window(c.subscriber.recv(1.0)), 5.0, "an output answering a window"
        )
        assert msg.valid is False and msg.invalid_reasons == [NO_MODEL]
        assert [w.name for w in msg.cameras] == ["left", "front"]
        ids = msg.cameras[0].frame_ids
        assert ids == list(range(ids[0], ids[0] + 4)) and ids[0] >= 12  # 10 Hz slots; 1.5 s of ego first
        assert msg.t0_ns == msg.cameras[0].t_sof_ns[-1]
        assert msg.token_ids == [] and msg.x == []
        # every message was sent; under load the node may still be reading the last few
        sent = (60, 40, 20)
        wait_until(
            lambda: (
                (c.counters()["messages"], c.counters()["frames_accepted"], c.counters()["ego_accepted"])
                == sent
            ),
            5.0,
            "every sent message counted",
        )
        status = c.control.status()
        assert status["ok"] and status["alive"] and not status["ready"]
        assert status["not_ready_reasons"][0] == NO_MODEL
        counters = status["counters"]
        assert (counters["messages"], counters["frames_accepted"], counters["ego_accepted"]) == sent
        assert counters["rejected_total"] == 0


def test_control_reset_and_shutdown_and_bad_requests():
    with running_node(None, node_config()) as c:
        for k in range(3):
            c.publisher.send(encode_frame("left", k, (k + 1) * 100_000_000, (k + 1) * 100_000_000, IMAGE))
        wait_until(lambda: c.counters()["frames_accepted"] == 3, 5.0, "3 frames")
        assert c.control.status()["streams"]["left"]["buffered"] == 3
        reply = c.control.reset()
        assert reply["ok"] and reply["cmd"] == "reset" and reply["streams"]["left"]["buffered"] == 0
        # after a reset a camera may start again at any frame id
        c.publisher.send(encode_frame("left", 0, 50, 50, IMAGE))
        wait_until(lambda: c.counters()["frames_accepted"] == 4, 5.0, "the restarted frame")
        assert c.counters()["rejected_total"] == 0
        assert c.control.request("reboot") == {
            "ok": False,
            "error": "cmd 'reboot' is not one of: status, reset, shutdown",
        }
        assert c.node.control_reply(b"\xc1")["error"].startswith("request is not valid msgpack")
        assert c.node.control_reply(msgpack.packb([1]))["ok"] is False
        assert c.counters()["control_rejected"] == {"command": 2, "malformed": 1}
        assert not c.node.wait(0)
        assert c.control.shutdown()["ok"]
        assert c.node.wait(1.0)
        assert "shutting down" in c.control.status()["not_ready_reasons"]


def test_oversize_messages_are_counted_or_disconnected_and_the_node_keeps_serving():
    with running_node(None, node_config()) as c:
        limit = c.node.limits.max_message_bytes
        c.publisher.send(bytes(limit + 1))  # over the protocol limit, under ZMQ_MAXMSGSIZE: rejected, counted
        wait_until(lambda: c.counters()["rejected"].get("too_large") == 1, 5.0, "the too_large rejection")
        c.publisher.send(bytes(2 * limit))  # over ZMQ_MAXMSGSIZE: libzmq drops the connection
        wait_until(lambda: c.counters()["input_disconnects"] == 1, 5.0, "the disconnect")
        assert c.counters()["peer_disconnects"] == 0  # the node hung up, not the peer
        assert c.publisher.wait_for_subscriber(5.0)  # the publisher reconnects and the node re-subscribes
        c.publisher.send(encode_ego(1, [0, 0, 0], [0, 0, 0, 1]))
        wait_until(lambda: c.counters()["ego_accepted"] == 1, 5.0, "a message after the reconnect")
        assert c.counters()["messages"] == 2
        assert c.control.status()["last_error"]["reason"] == "too_large"


def test_curve_admits_allow_listed_clients_only(tmp_path):
    _, node_secret = create_keys(tmp_path / "node", "node")
    cam_public, cam_secret = create_keys(tmp_path / "cam", "cam")
    _, intruder_secret = create_keys(tmp_path / "intruder", "intruder")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / cam_public.name).write_bytes(cam_public.read_bytes())
    config = node_config(curve={"server_secret_key": str(node_secret), "authorized_keys": str(allowed)})
    server_public = tmp_path / "node" / "node.key"
    camera = CurveClientKeys.from_files(cam_secret, server_public)
    intruder = CurveClientKeys.from_files(intruder_secret, server_public)
    # the camera's own keys, but another server's public key: its handshake fails on decryption
    wrong_server = CurveClientKeys(
        camera.public, camera.secret, CurveClientKeys.from_files(intruder_secret, cam_public).server_public
    )
    with running_node(None, config, curve=camera) as c:
        endpoint = c.node.endpoints["input"][0]
        for keys in (intruder, None, wrong_server):  # not allow-listed, plain (no CURVE), wrong server key
            before = c.counters()["auth_failures"]
            with FramePublisher(endpoint, curve=keys) as bad:
                assert not bad.wait_for_subscriber(0.3)
                bad.send(encode_ego(1, [0, 0, 0], [0, 0, 0, 1]))
                wait_until(
                    lambda b=before: c.counters()["auth_failures"] > b, 5.0, f"a failed handshake of {keys}"
                )
        c.publisher.send(encode_ego(1, [0, 0, 0], [0, 0, 0, 1]))
        wait_until(lambda: c.counters()["ego_accepted"] == 1, 5.0, "the allowed client's pose")
        counters = c.counters()
        assert counters["messages"] == 1
        assert counters["peer_disconnects"] == 0  # a failed handshake is not a peer's disconnect
        ctl = ControlClient(c.node.endpoints["control"], timeout_s=0.5, curve=intruder)
        with ctl, pytest.raises(TimeoutError, match="no reply to 'status'"):
            ctl.status()
        assert c.control.status()["ok"]


def test_unreadable_curve_keys_are_errors_naming_the_file(tmp_path, capsys):
    _, node_secret = create_keys(tmp_path / "node", "node")
    node_public = tmp_path / "node" / "node.key"
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    config = node_config(curve={"server_secret_key": str(node_secret), "authorized_keys": str(allowed)})
    for content, message in [
        (None, f"CURVE allow-list {allowed} holds no *.key file: it would admit no client"),
        ("not a key\n", f"CURVE key file {allowed / 'cam.key'} cannot be read: No public key found"),
        ('public-key = "short"\n', "holds a key of 5 characters, expected 40 (Z85)"),
    ]:
        if content is not None:
            (allowed / "cam.key").write_text(content)
        with pytest.raises(ValueError, match=re.escape(message)):
            InferenceNode(None, config).start()

    # A client's key files, through the CLI: exit code 2 and the file named, no traceback.
    ctl = ["node-ctl", "status", "--control", "tcp://127.0.0.1:9", "--curve-server-key", str(node_public)]
    for key, message in [
        (tmp_path / "absent.key_secret", "does not exist"),
        (node_public, "holds no secret key (use the NAME.key_secret file)"),
    ]:
        assert main([*ctl, "--curve-key", str(key)]) == 2
        assert f"error: CURVE key file {key} {message}" in capsys.readouterr().err


def test_an_unexpected_exception_is_counted_and_the_threads_carry_on(monkeypatch):
    with running_node(None, node_config()) as c:
        accept = c.node.state.accept
        calls = []

        def fail_once(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("injected fault")
            return accept(*args, **kwargs)

        monkeypatch.setattr(c.node.state, "accept", fail_once)
        c.publisher.send(encode_ego(1, [0, 0, 0], [0, 0, 0, 1]))
        c.publisher.send(encode_ego(2, [0, 0, 0], [0, 0, 0, 1]))
        wait_until(lambda: c.counters()["ego_accepted"] == 1, 5.0, "the second pose")
        status = c.control.status()
        assert status["alive"] and status["counters"]["internal_errors"] == 1
        assert status["last_error"]["message"] == "intake: RuntimeError: injected fault"
        monkeypatch.setattr(c.node, "control_reply", lambda body: 1 / 0)
        assert c.control.status() == {"ok": False, "error": "internal error, see the node's log"}


def test_start_fails_cleanly_on_a_taken_port():
    with running_node(None, node_config()) as c:
        taken = c.node.endpoints["control"]
        node = InferenceNode(None, node_config(control={"endpoint": taken}))
        with pytest.raises(ValueError, match=f"cannot bind {taken}: Address already in use"):
            node.start()
        assert node.stop()  # nothing started: a no-op


def test_stale_outputs_are_logged_when_the_stale_streams_change_and_then_every_period():
    def stale(*reasons: str) -> TrajectoryMessage:
        return TrajectoryMessage(seq=0, t0_ns=None, valid=False, invalid_reasons=list(reasons))

    waiting = ("camera 'left': nothing received yet", "ego: nothing received yet")
    log = StaleLog(every_s=10.0)
    lines = [log.line(stale(*waiting), t / 10) for t in range(30)]  # 3 s of 10 Hz stale outputs
    assert lines[0] is not None and all(line is None for line in lines[1:])
    # the left camera arrived, the ego stream is still missing: new
    assert log.line(stale("ego: nothing received yet"), 3.0) is not None
    assert log.line(stale("ego: stale, last message 900 ms ago (limit 500 ms)"), 3.1) is None  # same stream
    line = log.line(stale("ego: stale, last message 10900 ms ago (limit 500 ms)"), 13.0)
    assert line is not None and line.endswith("[1 like it since the last line]")
    log.clear()  # a window was answered in between: the next stale output is news
    assert log.line(stale("ego: nothing received yet"), 13.1) is not None
