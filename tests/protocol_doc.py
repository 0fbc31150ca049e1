"""docs/protocol.md's output-message table, read from the doc itself, and a check of published bytes against
it with nothing but plain `msgpack`: what a subscriber written from the doc (in any language) would see.

The table's `type` column is parsed into a checker per field: `int`, `str`, `bool`, `float` (a msgpack float),
`nil`, `X or Y`, `array of X`, `map of X`, `map str -> X`, and the `meaning` column's inner keys of `cameras`
(`{name, index, frame_ids[4], t_sof_ns[4]}`) and `waypoints` (`` `t` ``, `` `x` ``, ...). A msgpack boolean is
not an int, and an int is not a float: a consumer in a typed language reads them as different types.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import zmq

from bridges.wire.protocol import CameraWindow, TrajectoryMessage

PROTOCOL_DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
OUTPUT_HEADING = "## Output message (node PUB)"

Check = Callable[[Any], bool]

# An output with every field filled: one camera, 128 tokens, 64 waypoints, timings.
FULL_TRAJECTORY = TrajectoryMessage(
    seq=3,
    t0_ns=123,
    valid=True,
    invalid_reasons=[],
    cameras=[CameraWindow("front", 1, [4, 5, 6, 7], [1, 2, 3, 4])],
    token_ids=list(range(128)),
    t=[0.1 * (i + 1) for i in range(64)],
    x=[float(i) for i in range(64)],
    y=[0.5] * 64,
    z=[0.0] * 64,
    heading=[0.01] * 64,
    reasoning="Keep lane; the road ahead is clear.",
    decoder="tokens",
    frame_age_ms=81.5,
    frame_drop_perc=12.5,
    model_execution_ms=75.0,
    timings_ms={"vision": 20.0, "prefill": 30.0},
)


def output_table(doc: Path = PROTOCOL_DOC) -> dict[str, dict[str, str]]:
    """field -> {type, unit, meaning} of the first table under the output message's heading."""
    lines = doc.read_text().splitlines()
    start = lines.index(OUTPUT_HEADING)
    rows: dict[str, dict[str, str]] = {}
    in_table = False
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not in_table:
            assert cells == ["field", "type", "unit", "meaning"], (
                f"{doc}: unexpected output table header {cells}"
            )
            in_table = True
            continue
        if set(cells[0]) <= {"-"}:
            continue
        (name,) = re.fullmatch(r"`(\w+)`", cells[0]).groups()
        rows[name] = {"type": cells[1], "unit": cells[2], "meaning": cells[3]}
    assert rows, f"{doc}: no output table under {OUTPUT_HEADING!r}"
    return rows


def _scalar(name: str) -> Check:
    return {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
        "float": lambda v: isinstance(v, float),
        "nil": lambda v: v is None,
        "maps": lambda v: isinstance(v, dict),
        "arrays": lambda v: isinstance(v, list),
    }[name]


def type_check(text: str) -> Check:
    """A checker for one `type` cell of the table."""
    alternatives = [t.strip() for t in text.split(" or ")]
    if len(alternatives) > 1:
        checks = [type_check(t) for t in alternatives]
        return lambda v: any(c(v) for c in checks)
    if m := re.fullmatch(r"array of (\w+)", text):
        inner = _scalar(m[1])
        return lambda v: isinstance(v, list) and all(inner(x) for x in v)
    if m := re.fullmatch(r"map of (\w+)", text):
        inner = _scalar(m[1])
        return lambda v: isinstance(v, dict) and all(inner(x) for x in v.values())
    if m := re.fullmatch(r"map (\w+) -> (\w+)", text):
        key, value = _scalar(m[1]), _scalar(m[2])
        return lambda v: isinstance(v, dict) and all(key(k) and value(x) for k, x in v.items())
    return _scalar(text)


def inner_keys(row: dict[str, str]) -> set[str]:
    """The documented keys inside a `cameras` entry or the `waypoints` map, from the meaning column."""
    meaning = row["meaning"]
    if m := re.search(r"`\{([^}]*)\}`", meaning):  # cameras: `{name, index, frame_ids[4], t_sof_ns[4]}`
        return {re.sub(r"\[\d+\]$", "", k.strip()) for k in m[1].split(",")}
    return set(re.findall(r"`(\w+)`", meaning.split(":")[0]))  # waypoints: `t` (...), `x`, ... : 64 each


def doc_problems(data: bytes, table: dict[str, dict[str, str]] | None = None) -> list[str]:
    """Every way the published bytes differ from the doc's table: keys missing or extra, values of another
    type, `cameras` entries and `waypoints` with other keys, `kind`/`v` other than documented. [] when none."""
    table = table or output_table()
    d = msgpack.unpackb(data, raw=False)
    if not isinstance(d, dict):
        return [f"not a map: {type(d).__name__}"]
    problems = [f"key {k!r} is not in docs/protocol.md's table" for k in d if k not in table]
    problems += [f"documented key {k!r} is missing" for k in table if k not in d]
    for key in table.keys() & d.keys():
        if not type_check(table[key]["type"])(d[key]):
            problems.append(f"{key!r} = {d[key]!r} is not of the documented type {table[key]['type']!r}")
    if "cameras" in table and isinstance(d.get("cameras"), list):
        keys = inner_keys(table["cameras"])
        problems += [
            f"camera entry keys {sorted(c)} != documented {sorted(keys)}"
            for c in d["cameras"]
            if set(c) != keys
        ]
    if "waypoints" in table and isinstance(d.get("waypoints"), dict):
        keys = inner_keys(table["waypoints"])
        if set(d["waypoints"]) != keys:
            problems.append(f"waypoints keys {sorted(d['waypoints'])} != documented {sorted(keys)}")
        if any(not all(isinstance(x, float) for x in v) for v in d["waypoints"].values()):
            problems.append("waypoints hold values other than floats")
    kind = re.fullmatch(r'`"(\w+)"`', table["kind"]["meaning"])[1]  # `"trajectory"`
    version = int(re.match(r"(\d+) ", table["v"]["meaning"])[1])  # 2 (the output message's version; ...)
    if (d.get("kind"), d.get("v")) != (kind, version):
        problems.append(f"kind/v are {d.get('kind')!r}/{d.get('v')!r}, documented {kind!r}/{version}")
    return problems


@contextmanager
def plain_subscriber(endpoint: str) -> Iterator[zmq.Socket]:
    """A bare ZeroMQ SUB socket on the node's output, subscribed to everything: the bytes as published."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    try:
        yield sub
    finally:
        sub.close()


def received(sub: zmq.Socket, seen: list[bytes], seq: int | None = None) -> bytes | None:
    """Poll `sub` for 100 ms; append what arrived to `seen` and return it if it answers a window (t0_ns set) and,
    with `seq`, is that output. For `wait_until`."""
    if not sub.poll(100):
        return None
    seen.append(sub.recv())
    d = msgpack.unpackb(seen[-1], raw=False)
    answers = d.get("t0_ns") is not None and (seq is None or d.get("seq") == seq)
    return seen[-1] if answers else None
