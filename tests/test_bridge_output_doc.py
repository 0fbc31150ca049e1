"""The output message as docs/protocol.md documents it: bytes decoded with plain msgpack, every key and type
checked against the doc's own table (tests/protocol_doc.py), so the doc and the wire cannot drift apart.

The other output tests round-trip through `decode_trajectory`, which would follow a renamed key wherever
`to_dict` renamed it; a subscriber written from the doc would not.
"""

from __future__ import annotations

import msgpack
import pytest

from bridges.camera_sim import CameraSim
from bridges.node.server import NO_MODEL
from bridges.wire.protocol import TrajectoryMessage, encode_trajectory
from tests.bridge_nodes import CAMERAS, HEIGHT, WIDTH, node_config, running_node, wait_until
from tests.protocol_doc import (
    FULL_TRAJECTORY,
    PROTOCOL_DOC,
    doc_problems,
    inner_keys,
    output_table,
    plain_subscriber,
    received,
    type_check,
)


def test_the_table_is_read_from_the_doc():
    table = output_table()
    assert len(table) == 15 and list(table)[:2] == ["v", "kind"]
    assert (
        table["frame_age_ms"]["type"] == "float or nil" and table["frame_age_ms"]["unit"] == "ms, node clock"
    )
    assert inner_keys(table["cameras"]) == {"name", "index", "frame_ids", "t_sof_ns"}
    assert inner_keys(table["waypoints"]) == {"t", "x", "y", "z", "heading"}


@pytest.mark.parametrize(
    ("text", "good", "bad"),
    [
        ("int", [0, -3, 2**63 - 1], [True, 1.0, "1", None]),
        ("float", [0.0, 1.5], [1, True, None]),
        ("int or nil", [5, None], [5.0, False]),
        ("float or nil", [5.0, None], [5, "5"]),
        ("bool", [True, False], [0, 1, None]),
        ("array of str", [[], ["a"]], [["a", 1], "a", None]),
        ("array of int", [[], [1, 2]], [[1.0], [True]]),
        ("array of maps", [[], [{}]], [[[]], {}]),
        ("map of arrays", [{}, {"t": []}], [{"t": 1.0}, []]),
        ("map str -> float", [{}, {"a": 1.0}], [{"a": 1}, {1: 1.0}]),
    ],
)
def test_type_cells_mean_what_a_typed_consumer_reads(text, good, bad):
    check = type_check(text)
    assert all(check(v) for v in good), text
    assert not any(check(v) for v in bad), text


def test_encoded_messages_follow_the_doc():
    assert doc_problems(encode_trajectory(FULL_TRAJECTORY)) == []
    invalid = TrajectoryMessage(seq=4, t0_ns=None, valid=False, invalid_reasons=["ego: stale"])
    assert doc_problems(encode_trajectory(invalid)) == []


def test_a_key_or_type_off_the_doc_is_named(tmp_path):
    d = msgpack.unpackb(encode_trajectory(FULL_TRAJECTORY), raw=False)
    d["age_ms"] = d.pop("frame_age_ms")
    d["seq"] = True
    d["waypoints"]["yaw"] = d["waypoints"].pop("heading")
    assert doc_problems(msgpack.packb(d)) == [
        "key 'age_ms' is not in docs/protocol.md's table",
        "documented key 'frame_age_ms' is missing",
        "'seq' = True is not of the documented type 'int'",
        "waypoints keys ['t', 'x', 'y', 'yaw', 'z'] != documented ['heading', 't', 'x', 'y', 'z']",
    ]
    # and the doc is what decides: the same bytes against a doc whose table renamed the field
    doc = tmp_path / "protocol.md"
    doc.write_text(PROTOCOL_DOC.read_text().replace("| `frame_age_ms` |", "| `age_ms` |", 1))
    assert doc_problems(encode_trajectory(FULL_TRAJECTORY), output_table(doc)) == [
        "key 'frame_age_ms' is not in docs/protocol.md's table",
        "documented key 'age_ms' is missing",
    ]


def test_a_running_node_publishes_what_the_doc_says():
    """The bytes of an intake-only node's PUB socket, read with a plain ZeroMQ SUB and plain msgpack: the output
    answering a window (cameras filled, no model) and every other output before it."""
    seen: list[bytes] = []
    with running_node(None, node_config()) as c, plain_subscriber(c.node.endpoints["output"]) as sub:
        # the PUB drops until the subscription lands; the node publishes once per period meanwhile
        wait_until(lambda: sub.poll(100), 10.0, "a first output on a plain SUB socket")
        CameraSim(c.publisher, list(CAMERAS), WIDTH, HEIGHT, speedup=10).run(ticks=20)
        data = wait_until(lambda: received(sub, seen), 10.0, "an output answering a window")
    d = msgpack.unpackb(data, raw=False)
    assert d["invalid_reasons"] == [NO_MODEL] and len(d["cameras"]) == len(CAMERAS)
    assert isinstance(d["frame_age_ms"], float)
    for message in seen:
        assert doc_problems(message) == []
