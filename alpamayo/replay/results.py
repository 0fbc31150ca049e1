"""What a replay produced, per tick and per run, in one form for lock-step and real-time modes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from alpamayo.profiling import Tracer


@dataclass
class TickResult:
    """One answered tick. Trajectories are metres in the t0 ego frame: predicted [K, 64, 3] (sample 0 first),
    recorded future [64, 3] or None, history [16, 3]. stages_ms: stage -> ms for this tick; e2e_ms: publish end
    minus the tick's start (lock-step) or the node's frame_age_ms (real-time: its output time minus the arrival
    of the window's newest frames); decode_tokens: tokens the first sample generated after the prompt
    (reasoning + trajectory)."""

    seq: int
    t0_ns: int
    warmup: bool
    predicted_xyz: np.ndarray
    future_xyz: np.ndarray | None
    history_xyz: np.ndarray
    errors_m: dict[str, float] | None
    invalid_reasons: list[str]
    stages_ms: dict[str, float]
    e2e_ms: float
    decode_tokens: int
    trajectory_tokens: int
    # speculative decoding: per block of every sample row, the tokens it produced (empty: no draft)
    accepted_lengths: list[int] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.invalid_reasons


@dataclass
class ReplayRun:
    """A replay's ticks and spans. `ticks_offered` counts the drive's ticks in the window (answered or not);
    `skipped` the mid-drive ticks skipped for missing inputs, by reason; `dropped` the ticks the node never
    answered (real-time only); `info` the run settings and environment, recorded in every output."""

    mode: str
    ticks: list[TickResult]
    tracer: Tracer
    ticks_offered: int
    wall_s: float
    info: dict[str, Any]
    skipped: Counter = field(default_factory=Counter)
    dropped: int = 0

    @property
    def measured(self) -> list[TickResult]:
        return [t for t in self.ticks if not t.warmup]
