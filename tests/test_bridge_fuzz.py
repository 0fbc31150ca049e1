"""Fuzzing the node's input path: 10,000+ hostile messages; the node must still serve and account for all.

The node runs the demo checkpoint's model: after the fuzz it must still predict a valid trajectory.

Most messages go through `InferenceNode.ingest` in-process (the exact code the intake thread runs per socket
message, so the rate is high on 2 cores); a share goes over the real SUB socket. Messages are hypothesis-
generated headers and payloads plus random mutations of valid frames and poses.
"""

from __future__ import annotations

import io
import time
from collections import Counter

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from alpamayo.model_spec import ModelSpec
from alpamayo.runtime import AlpamayoVLA
from bridges.wire.client import FramePublisher
from bridges.wire.protocol import (
    EGO_FIELDS,
    FRAME_FIELDS,
    REJECTION_REASONS,
    ProtocolError,
    decode_trajectory,
    encode_ego,
    encode_frame,
    join_message,
    unpack_header,
)
from tests.bridge_nodes import CAMERAS, HEIGHT, WIDTH, answering_window, node_config, running_node, wait_until
from tests.images import broken_table_jpeg, lying_jpeg

MS = 1_000_000
LIMITS = node_config().limits.protocol
HYPOTHESIS_EXAMPLES = 2500
MUTATIONS_IN_PROCESS = 6500
MUTATIONS_OVER_SOCKETS = 1500
SOCKET_BATCH = 100  # sent back to back; the fuzz publisher's high-water mark holds a whole batch


def valid_messages() -> list[bytes]:
    """Valid frames (all encodings, both cameras) and poses covering 0.5 s: never a complete window, so the
    fuzz cannot trigger predictions."""
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG")
    out = []
    for k in range(4):
        t = 10_000 * MS + k * 100 * MS
        out.append(encode_frame("left", k, t, t + MS, image))
        out.append(encode_frame(1, k, t, t + MS, image[:, :, ::-1], "bgr8"))
        out.append(
            encode_frame("front", 100 + k, t + 5 * MS, t + 6 * MS, buf.getvalue(), "jpeg", WIDTH, HEIGHT)
        )
        out.append(encode_ego(t, [1.0 * k, 0.5, 0.0], [0.0, 0.0, 0.0, 1.0], [10.0, 0.0, 0.0]))
    return [bytes(m) for m in out]


VALUES = [
    None,
    True,
    -1,
    0,
    2**32,
    2**63 - 1,
    1.5,
    float("nan"),
    float("inf"),
    "",
    "rgb8",
    "front",
    b"\x00",
    [],
    {},
]


def mutate(message: bytes, rng: np.random.Generator) -> bytes:
    """One random corruption of a valid message."""
    header, offset = unpack_header(memoryview(message))
    payload = message[offset:]
    op = rng.integers(10)
    if op == 0:  # flip bytes anywhere
        data = bytearray(message)
        for i in rng.integers(0, len(data), rng.integers(1, 8)):
            data[i] ^= int(rng.integers(1, 256))
        return bytes(data)
    if op == 1:  # truncate
        return message[: int(rng.integers(0, len(message)))]
    if op == 2:  # append bytes
        return message + rng.bytes(int(rng.integers(1, 64)))
    if op == 8:  # pad past the size limit
        return message + bytes(LIMITS.max_message_bytes)
    if op == 9:  # poison one number of an array field
        arrays = [k for k, v in header.items() if isinstance(v, list) and v]
        if arrays:
            key = str(rng.choice(arrays))
            header[key][int(rng.integers(len(header[key])))] = float(rng.choice([np.nan, np.inf, -np.inf]))
    if op == 3:  # a field takes a value of another type or range
        header[str(rng.choice(list(header)))] = VALUES[rng.integers(len(VALUES))]
    elif op == 4:  # drop a field
        del header[str(rng.choice(list(header)))]
    elif op == 5:  # add a field
        header[str(rng.choice(["x", "camera_id", "seq", *FRAME_FIELDS, *EGO_FIELDS]))] = 1
    elif op == 6:  # corrupt the payload
        data = bytearray(payload)
        for i in rng.integers(0, max(len(data), 1), 16) if data else []:
            data[i] = int(rng.integers(0, 256))
        payload = bytes(data[: int(rng.integers(0, len(data) + 1))]) if rng.random() < 0.5 else bytes(data)
    else:  # shift a number
        numeric = [k for k, v in header.items() if type(v) is int]
        if numeric:
            key = str(rng.choice(numeric))
            header[key] += int(rng.choice([-(2**40), -1, 1, 2**40]))
    try:
        return bytes(join_message(header, memoryview(payload)))
    except (TypeError, ValueError, OverflowError):  # msgpack cannot pack it: send raw bytes instead
        return message[::-1]


headers = st.dictionaries(
    st.sampled_from(sorted({*FRAME_FIELDS, *EGO_FIELDS, "extra"})),
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**64), 2**64 - 1),
        st.floats(allow_nan=True),
        st.text(max_size=12),
        st.binary(max_size=12),
        st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=5),
        st.sampled_from(["frame", "ego", "rgb8", "bgr8", "jpeg", "left", "front"]),
    ),
    max_size=12,
)


@pytest.fixture(scope="module")
def vla(demo_checkpoint):
    return AlpamayoVLA.from_spec(ModelSpec(checkpoint=demo_checkpoint, max_reasoning_tokens=4))


def test_node_survives_fuzzing_and_accounts_for_every_message(vla, record_figure):
    config = node_config(
        warmup={"runs": 0},
        timing={"stale_after_ms": 600_000},
        camera_formats={"left": {"width": WIDTH, "height": HEIGHT, "encoding": "rgb8"}},
    )
    with running_node(vla, config) as c:
        node = c.node
        reasons: Counter[str] = Counter()
        sent = 0

        def ingest(message: bytes) -> None:
            nonlocal sent
            sent += 1
            reasons[node.ingest(message) or "accepted"] += 1

        @settings(
            max_examples=HYPOTHESIS_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(
            header=headers, payload=st.binary(max_size=64), raw=st.binary(max_size=48), as_raw=st.booleans()
        )
        def generated(header, payload, raw, as_raw):
            try:
                message = raw if as_raw else bytes(join_message(header, memoryview(payload)))
            except (TypeError, ValueError, OverflowError):  # unpackable by msgpack (ints beyond 64 bits)
                message = raw
            ingest(message)

        generated()
        rng = np.random.default_rng(0)
        base = valid_messages()
        for _ in range(MUTATIONS_IN_PROCESS):
            ingest(mutate(base[rng.integers(len(base))], rng))
        for message in base:
            ingest(message)  # duplicates by now, or accepted: either way counted

        over_sockets = 0
        with FramePublisher(node.endpoints["input"][0], hwm=10 * SOCKET_BATCH) as publisher:
            assert publisher.wait_for_subscriber(5.0)
            while over_sockets < MUTATIONS_OVER_SOCKETS:
                for _ in range(SOCKET_BATCH):
                    publisher.send(mutate(base[rng.integers(len(base))], rng))
                over_sockets += SOCKET_BATCH
                # drain each batch before the next, so no PUB queue overflows (PUB drops, uncounted)
                wait_until(lambda n=sent + over_sockets: c.counters()["messages"] == n, 10.0, "the batch")

            status = c.control.status()
            counters = status["counters"]
            assert status["alive"]
            assert counters["predictions"] == 0  # the fuzz itself never formed a window
            assert sent + over_sockets >= 10_000
            assert counters["messages"] == sent + over_sockets
            accepted = counters["frames_accepted"] + counters["ego_accepted"]
            assert accepted + counters["rejected_total"] == counters["messages"]
            assert sum(counters["rejected"].values()) == counters["rejected_total"]
            assert set(counters["rejected"]) <= set(REJECTION_REASONS)
            in_process = Counter({k: v for k, v in reasons.items() if k != "accepted"})
            assert all(counters["rejected"][k] >= v for k, v in in_process.items())
            assert counters["rejected_total"] - sum(in_process.values()) <= over_sockets
            assert set(in_process) == set(REJECTION_REASONS), (
                f"never rejected: {set(REJECTION_REASONS) - set(in_process)}"
            )
            record_figure("messages (in-process + over sockets)", f"{sent} + {over_sockets}")
            record_figure(
                "rejected by reason", ", ".join(f"{k} {v}" for k, v in sorted(counters["rejected"].items()))
            )

            # A clean stream after a reset is windowed and answered with a valid trajectory.
            assert c.control.reset()["ok"]
            black = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
            for k in range(17):
                t = 10_000 * MS + k * 100 * MS
                publisher.send(encode_ego(t, [1.0 * k, 0.5, 0.0], [0.0, 0.0, 0.0, 1.0]))
                for camera in CAMERAS:
                    publisher.send(encode_frame(camera, 1000 + k, t, t, black))
            msg = wait_until(
                lambda: answering_window(c.subscriber.recv(0.5)), 300.0, "an output for the clean stream"
            )
        # The demo checkpoint's default decoder, the action expert: 64 waypoints, no trajectory tokens.
        assert msg.valid and len(msg.x) == 64 and msg.decoder == "expert" and msg.token_ids == []
        # Newest wins: the node answers whichever complete window was newest when it was free. The first
        # complete window (1.6 s of ego history) ends at 11.5 s, the last one sent at 11.6 s.
        k0 = (msg.t0_ns - 10_000 * MS) // (100 * MS)
        assert msg.t0_ns in (11_500 * MS, 11_600 * MS)
        assert [w.frame_ids for w in msg.cameras] == [[1000 + k0 - 3 + i for i in range(4)]] * len(CAMERAS)


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.binary(max_size=256))
def test_trajectory_decoder_rejects_arbitrary_bytes_with_protocol_errors_only(data):
    # 256 random bytes are never a 15-field trajectory map: each is rejected, as malformed, and nothing else
    # escapes (a msgpack or Python error would fail the test)
    with pytest.raises(ProtocolError) as info:
        decode_trajectory(data)
    assert info.value.reason == "malformed", str(info.value)


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(
    st.dictionaries(st.text(max_size=8), st.integers(-(2**63), 2**64 - 1) | st.text(max_size=4) | st.none())
)
def test_trajectory_decoder_rejects_arbitrary_maps(d):
    # keys of up to 8 characters cannot name every field (`frame_drop_perc` has 15): each map of kind
    # trajectory is rejected, naming the fields it lacks
    with pytest.raises(ProtocolError) as info:
        decode_trajectory(msgpack.packb({**d, "kind": "trajectory"}))
    assert info.value.reason == "missing_field" and "frame_drop_perc" in str(info.value), str(info.value)


def test_hostile_jpegs_and_clocks_over_sockets_are_accounted_and_control_stays_responsive(record_figure):
    """Over the real sockets, one stream of: JPEGs whose header lies about their size, bit-flipped JPEGs,
    JPEGs that fail only when decoded, frames from the future and a frame_id jump, beside good frames and
    poses that form windows (so what passes intake gets decoded). `status` is timed throughout."""
    ticks, lying, future = 1200, 150, 20
    rng = np.random.default_rng(2)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)).save(buf, format="JPEG")
    good = buf.getvalue()
    black = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    lying_at = set(rng.choice(ticks, lying, replace=False).tolist())
    broken_at = set(rng.choice(sorted(set(range(ticks)) - lying_at), 20, replace=False).tolist())
    future_at = set(range(ticks // (2 * future), ticks, ticks // future))
    config = node_config(limits={"max_width": 3840, "max_height": 2160}, timing={"stale_after_ms": 600_000})
    latencies: list[float] = []
    with running_node(None, config) as c, FramePublisher(c.node.endpoints["input"][0], hwm=1000) as pub:
        assert pub.wait_for_subscriber(5.0)
        sent = 0
        for k in range(ticks):
            t = 10_000 * MS + k * 100 * MS
            frame_id = k if k < ticks // 2 else k + 10**6  # one id jump half-way
            messages = [encode_ego(t, [1.0 * k, 0, 0], [0, 0, 0, 1]), encode_frame("left", k, t, t, black)]
            if k in lying_at:
                w, h = int(rng.integers(640, 3841)), int(rng.integers(480, 2161))
                messages.append(encode_frame("front", frame_id, t, t, lying_jpeg(w, h, k), "jpeg", w, h))
            else:
                data = broken_table_jpeg(good) if k in broken_at else bytearray(good)
                if k not in broken_at:  # one bit flipped anywhere after SOI
                    data[int(rng.integers(2, len(data)))] ^= 1 << int(rng.integers(8))
                messages.append(encode_frame("front", frame_id, t, t, bytes(data), "jpeg", WIDTH, HEIGHT))
            if k in future_at:
                ahead = t + 3600 * 10**9
                messages.append(encode_frame("left", 10**9 + k, ahead, ahead, black))
            for m in messages:
                pub.send(m)
            sent += len(messages)
            if k % 50 == 49:  # drain each batch (PUB drops beyond its high-water mark), timing control
                deadline = time.monotonic() + 20.0
                while c.counters()["messages"] < sent and time.monotonic() < deadline:
                    start = time.perf_counter()
                    c.control.status()
                    latencies.append((time.perf_counter() - start) * 1e3)
        status = wait_until(
            lambda: (s := c.control.status())["counters"]["messages"] == sent and s, 20.0, "every message"
        )
        outputs = wait_until(lambda: c.subscriber.recv(1.0), 5.0, "an output")
    counters, front = status["counters"], status["streams"]["front"]
    assert counters["frames_accepted"] + counters["ego_accepted"] + counters["rejected_total"] == sent
    assert counters["internal_errors"] == 0 and outputs is not None
    rejected = counters["rejected"]
    assert set(rejected) <= {"jpeg_decode", "payload_size", "future", "duplicate", "backwards"}
    assert rejected["future"] == len(future_at)
    assert front["id_restarts"] == 1
    flipped = ticks - lying - len(broken_at)
    # Only the frames a window uses are decoded, and windows form at the node's pace, not per message: how many
    # broken-table JPEGs reach a decode depends on the load (every one that does fails: test_bridge_hardening).
    assert front["decode_failures"] <= len(broken_at) + flipped
    at_intake = (
        rejected.get("jpeg_decode", 0) + rejected.get("payload_size", 0) - lying - front["decode_failures"]
    )
    assert at_intake >= 0
    record_figure(
        f"{flipped} bit-flipped JPEGs",
        f"{at_intake} rejected at intake, {front['decode_failures']} at decode (broken tables included), "
        f"the rest decode (JPEG has no checksum)",
    )
    record_figure(
        "control replies under the stream: n, p50 / max ms",
        (f"{len(latencies)}, {np.percentile(latencies, 50):.1f} / {max(latencies):.1f}"),
    )
    # every request was answered within the client's timeout during the stream (control has its own thread);
    # how fast is a speed, measured by benchmarks/node_hardening.py (`--load-seconds`), recorded here only
