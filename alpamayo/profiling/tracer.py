"""Span tracer: every pipeline stage is timed into one `Tracer`, which exports a Chrome/Perfetto trace.

Timestamps are `time.perf_counter_ns()` (monotonic) unless a span is recorded with explicit times (e.g. a
camera's start-of-frame, for end-to-end age). One Chrome-trace track (tid) per stage name, because Perfetto
requires slices on one track to nest and overlapping frames of different stages would not. Spans of one stage
can overlap each other too (the node's `e2e_age`: the next window's frames arrive while the current prediction
runs), so such a stage spreads over as many tracks as it needs, `e2e_age`, `e2e_age (2)`, ...
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# Stage names used across the project, in pipeline order (the profile table and trace tracks follow it).
STAGES = (
    "receive",
    "decode",
    "preprocess",
    "vision",
    "prefill",
    "draft",  # speculative decoding: one span per block, the draft proposing it (alpamayo.drafts)
    "verify",  # and the target scoring it in one forward
    "reasoning_decode",
    "trajectory_decode",
    "expert",  # the action expert's flow-matching sampling (its Euler steps are `expert_step` spans)
    "rollout",
    "serialise",
    "publish",
    "e2e_age",
)


@dataclass
class Span:
    """One timed stage: [start_ns, start_ns + dur_ns) on the perf_counter clock, with free-form args."""

    name: str
    start_ns: int
    dur_ns: int
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def ms(self) -> float:
        return self.dur_ns / 1e6


class Tracer:
    """Thread-safe span recorder. A disabled tracer records nothing and costs one attribute check per span.

    Inside `with tracer.tick(i, warmup=...)` every span the same thread records carries args `tick` (and
    `warmup`), so per-tick tables, timelines and warm-up exclusion need no cooperation from the stages.
    """

    def __init__(self, enabled: bool = True, max_spans: int | None = None):
        """max_spans: keep only the newest spans (a long-running node would otherwise grow without bound)."""
        if max_spans is not None and max_spans < 1:
            raise ValueError(f"max_spans must be None or >= 1, got {max_spans}")
        self.enabled = enabled
        self._spans: deque[Span] = deque(maxlen=max_spans)
        self._evicted = 0  # spans pushed out of a bounded tracer; marks count them too
        self._lock = threading.Lock()
        self._context = threading.local()

    @contextmanager
    def tick(self, index: int, warmup: bool = False) -> Iterator[None]:
        """Stamp spans recorded by this thread in the body with tick=index (and warmup=True if warm-up)."""
        self._context.stamp = {"tick": index, "warmup": True} if warmup else {"tick": index}
        try:
            yield
        finally:
            self._context.stamp = {}

    @contextmanager
    def span(self, name: str, **args: Any) -> Iterator[dict[str, Any]]:
        """Time the body as stage `name`; the yielded dict can take more args while the body runs."""
        start = time.perf_counter_ns()
        try:
            yield args
        finally:
            if self.enabled:
                self.record(name, start, time.perf_counter_ns() - start, **args)

    def record(self, name: str, start_ns: int, dur_ns: int, **args: Any) -> None:
        """Add a span timed elsewhere (device timers, end-to-end age from a camera timestamp)."""
        if not self.enabled:
            return
        if dur_ns < 0:
            raise ValueError(f"span {name!r} has negative duration {dur_ns} ns")
        stamp = getattr(self._context, "stamp", {})
        with self._lock:
            if len(self._spans) == self._spans.maxlen:
                self._evicted += 1
            self._spans.append(Span(name, int(start_ns), int(dur_ns), {**stamp, **args}))

    @property
    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def mark(self) -> int:
        """The number of spans recorded so far, for `totals_ms`."""
        with self._lock:
            return self._evicted + len(self._spans)

    def totals_ms(self, mark: int = 0) -> dict[str, float]:
        """Total ms per stage over the spans recorded after the first `mark` (a `tracer.mark()` taken earlier);
        stages recorded once per frame (vision) add up."""
        with self._lock:
            # Only the newest spans, read from the right end: copying the whole (growing) deque made each
            # lock-step tick's totals cost O(spans recorded so far).
            new = min(len(self._spans), self._evicted + len(self._spans) - mark)
            spans = list(itertools.islice(reversed(self._spans), max(0, new)))[::-1]
        totals: dict[str, float] = {}
        for span in spans:
            totals[span.name] = totals.get(span.name, 0.0) + span.ms
        return totals

    def clear(self) -> None:
        with self._lock:
            self._evicted += len(self._spans)
            self._spans.clear()

    def durations_ms(self, name: str) -> list[float]:
        return [s.ms for s in self.spans if s.name == name]

    def chrome_trace(self, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Chrome Trace Event JSON object (complete 'X' events, microseconds): one named track per stage, plus
        `<stage> (2)`, `<stage> (3)`, ... for spans of a stage that overlap an earlier one without nesting."""
        spans = sorted(self.spans, key=lambda s: s.start_ns)
        present = {s.name for s in spans}
        names = [n for n in STAGES if n in present] + sorted(present - set(STAGES))
        origin = spans[0].start_ns if spans else 0
        # per stage: the end (us) of each of its tracks' last span
        lanes: dict[str, list[float]] = {n: [] for n in names}
        placed: list[tuple[Span, float, float, int]] = []
        for s in spans:
            ts, dur = (s.start_ns - origin) / 1e3, max(s.dur_ns / 1e3, 0.001)
            ends = lanes[s.name]
            lane = next((i for i, end in enumerate(ends) if end <= ts), len(ends))
            ends[lane : lane + 1] = [ts + dur]
            placed.append((s, ts, dur, lane))
        tid: dict[tuple[str, int], int] = {}
        for n in names:
            for lane in range(len(lanes[n])):
                tid[n, lane] = len(tid) + 1
        events: list[dict[str, Any]] = [
            {
                "ph": "M",
                "name": "thread_name",
                "pid": 1,
                "tid": t,
                "args": {"name": n if lane == 0 else f"{n} ({lane + 1})"},
            }
            for (n, lane), t in tid.items()
        ]
        events += [
            {
                "ph": "X",
                "name": s.name,
                "cat": "stage",
                "pid": 1,
                "tid": tid[s.name, lane],
                "ts": ts,
                "dur": dur,
                "args": s.args,
            }
            for s, ts, dur, lane in placed
        ]
        return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata or {}}
