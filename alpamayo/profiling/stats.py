"""Latency statistics over recorded spans: the per-stage table, achieved rate, drops, and decode speed.

Conventions (see `/shared/reference/bridge.md` section 4):
  * per stage n, mean, p50, p90, p99 and max in ms, with numpy's linear-interpolation percentiles;
  * warm-up ticks (spans stamped `warmup`) are excluded from every figure, and reports say how many;
  * a span with a boolean `cached` arg is counted under "<stage> (cached)" or "<stage> (encoded)", because a
    vision-cache hit and a real encode differ by orders of magnitude and a mixed mean describes neither;
  * decode speed as in tt-metal's tables: TTFT (ms, inputs to first generated token) and t/s/u (decode tokens
    per second per user = 1 / inter-token latency); t/s = t/s/u x batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from alpamayo.profiling.tracer import STAGES, Span

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class StageStats:
    """One row of the latency table; times in ms."""

    stage: str
    n: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(name: str, values_ms: Sequence[float]) -> StageStats:
    """Statistics of a non-empty list of durations (ms)."""
    v = np.asarray(values_ms, dtype=np.float64)
    if v.size == 0:
        raise ValueError(f"stage {name!r} has no measured values")
    p50, p90, p99 = np.percentile(v, PERCENTILES)
    return StageStats(name, int(v.size), float(v.mean()), float(p50), float(p90), float(p99), float(v.max()))


def stage_label(span: Span) -> str:
    cached = span.args.get("cached")
    if isinstance(cached, bool):
        return f"{span.name} ({'cached' if cached else 'encoded'})"
    return span.name


def measured(spans: Iterable[Span]) -> list[Span]:
    """The spans outside warm-up ticks."""
    return [s for s in spans if not s.args.get("warmup", False)]


def measured_durations(spans: Iterable[Span]) -> dict[str, list[float]]:
    """Measured span durations (ms) by stage label, in pipeline order (STAGES), unknown stages last."""
    groups: dict[str, list[float]] = {}
    for span in measured(spans):
        groups.setdefault(stage_label(span), []).append(span.ms)
    order = {name: i for i, name in enumerate(STAGES)}

    def key(label: str) -> tuple[int, str]:
        return order.get(label.split(" (")[0], len(STAGES)), label

    return {label: groups[label] for label in sorted(groups, key=key)}


def stage_table(spans: Iterable[Span]) -> list[StageStats]:
    """One row per stage label over the measured spans, in pipeline order (STAGES), unknown stages last."""
    return [summarize(label, values) for label, values in measured_durations(spans).items()]


def simulated_drop_pct(arrivals_ns: Sequence[int], durations_ns: Sequence[int]) -> float:
    """Share (%) of ticks a newest-wins node would skip if ticks arrived at `arrivals_ns` (recording clock)
    and each took its measured duration: a tick still queued when a newer one arrives is dropped."""
    if len(arrivals_ns) != len(durations_ns):
        raise ValueError(f"{len(arrivals_ns)} arrivals but {len(durations_ns)} durations")
    if not arrivals_ns:
        return 0.0
    free_at = arrivals_ns[0]
    dropped = 0
    for i, (arrival, duration) in enumerate(zip(arrivals_ns, durations_ns, strict=True)):
        if arrival < free_at and i + 1 < len(arrivals_ns) and arrivals_ns[i + 1] <= free_at:
            dropped += 1
            continue
        free_at = max(free_at, arrival) + duration
    return 100.0 * dropped / len(arrivals_ns)


@dataclass(frozen=True)
class DecodeStats:
    """Generation speed over measured ticks: TTFT and time to the first trajectory token (ms, from the start
    of preprocessing), and decode tokens per second per user (`batch` samples decode together)."""

    ttft: StageStats
    first_trajectory_token: StageStats
    tokens_per_s_per_user: float
    batch: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_s_per_user * self.batch

    def as_dict(self) -> dict:
        return {
            "ttft_ms": self.ttft.as_dict(),
            "first_trajectory_token_ms": self.first_trajectory_token.as_dict(),
            "tokens_per_s_per_user": self.tokens_per_s_per_user,
            "tokens_per_s": self.tokens_per_s,
            "batch": self.batch,
        }
