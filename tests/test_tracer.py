"""The span tracer and its Chrome trace export."""

from __future__ import annotations

import json
import threading

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
