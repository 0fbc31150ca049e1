"""The span tracer and its Chrome trace export."""

from __future__ import annotations

import json
import threading
from collections import defaultdict

import pytest

from alpamayo.profiling import Tracer


def test_spans_are_recorded_with_args_and_exported_one_track_per_stage():
    tracer = Tracer()
    with tracer.span("vision", camera=1) as args:
        args["cached"] = False
    with tracer.span("prefill"):
        pass
    tracer.record("e2e_age", 0, 5_000_000, frame_id=7)
    trace = json.loads(json.dumps(tracer.chrome_trace({"backend": "torch"})))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in events] == ["e2e_age", "vision", "prefill"]
    assert {e["name"]: e["args"] for e in events}["vision"] == {"camera": 1, "cached": False}
    tracks = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert len(set(tracks.values())) == 3
    assert all(e["tid"] == tracks[e["name"]] and e["dur"] > 0 for e in events)
    assert trace["metadata"] == {"backend": "torch"}
    assert tracer.durations_ms("e2e_age") == [5.0]


def assert_tracks_nest(trace: dict) -> dict[int, str]:
    """Every track's slices nest or follow each other (what Perfetto needs to draw them); returns the track
    names by tid. Every slice has a positive duration and sits on a track named for its stage."""
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert len(set(tracks.values())) == len(tracks)
    by_track: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            assert e["dur"] > 0 and tracks[e["tid"]].split(" (")[0] == e["name"], e
            by_track[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for tid, slices in by_track.items():
        open_ends: list[float] = []
        for start, end in sorted(slices):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], (
                f"track {tracks[tid]!r}: slices overlap without nesting"
            )
            open_ends.append(end)
    return tracks


def test_overlapping_spans_of_one_stage_spread_over_tracks_that_perfetto_can_draw():
    # The node's end-to-end age: the next window's frames arrive (and its span starts) while the current
    # prediction is still running, so consecutive spans overlap by up to a frame period.
    tracer = Tracer()
    for k in range(4):
        tracer.record("e2e_age", k * 900_000_000, 1_000_000_000, seq=k)
        tracer.record("prefill", k * 900_000_000, 100_000_000)
    tracer.record("e2e_age", 10_000_000_000, 1_000_000)  # after all of them: back on the first track
    trace = json.loads(json.dumps(tracer.chrome_trace()))
    tracks = assert_tracks_nest(trace)
    assert sorted(tracks.values()) == ["e2e_age", "e2e_age (2)", "prefill"]
    lanes = [tracks[e["tid"]] for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "e2e_age"]
    assert lanes == ["e2e_age", "e2e_age (2)", "e2e_age", "e2e_age (2)", "e2e_age"]


def test_disabled_tracer_records_nothing():
    tracer = Tracer(enabled=False)
    with tracer.span("decode"):
        pass
    tracer.record("publish", 0, 1)
    assert tracer.spans == []


def test_negative_duration_is_rejected():
    with pytest.raises(ValueError, match="negative duration"):
        Tracer().record("publish", 10, -1)


def test_concurrent_recording_keeps_every_span():
    tracer = Tracer()

    def work():
        for _ in range(500):
            with tracer.span("receive"):
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(tracer.durations_ms("receive")) == 2000


def test_bounded_tracer_keeps_the_newest_spans_and_marks_stay_valid():
    tracer = Tracer(max_spans=3)
    for i in range(5):
        tracer.record("vision", i, 1_000_000)
    mark = tracer.mark()
    assert mark == 5 and [s.start_ns for s in tracer.spans] == [2, 3, 4]
    tracer.record("prefill", 9, 2_000_000)
    tracer.record("vision", 10, 1_000_000)
    assert tracer.totals_ms(mark) == {"prefill": 2.0, "vision": 1.0}
    tracer.clear()
    assert tracer.spans == [] and tracer.mark() == 7 and tracer.totals_ms(mark) == {}
    with pytest.raises(ValueError, match="max_spans must be None or >= 1"):
        Tracer(max_spans=0)
