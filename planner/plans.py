"""What the decoding of one prediction yields per sample (`GeneratedPlan`) and how far it may go (`PlanLimits`).

The decoding loop (`alpamayo.decoding.loop`) produces them; the planner's pipeline turns them into trajectories.
They live here, with their consumer, because the decoding sits above the backends' contract (which returns
them from a trajectory decoder) while the planner sits below it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class PlanLimits:
    """max_reasoning_tokens: cap before `<|traj_future_start|>` is forced (Alpamayo's test script uses 256);
    tokens_per_future: trajectory tokens per sample (2 per waypoint)."""

    max_reasoning_tokens: int = 256
    tokens_per_future: int = 128

    def __post_init__(self) -> None:
        if self.max_reasoning_tokens < 0 or self.tokens_per_future < 1:
            raise ValueError(
                f"max_reasoning_tokens must be >= 0 and tokens_per_future >= 1, got "
                f"{self.max_reasoning_tokens} and {self.tokens_per_future}"
            )

    @property
    def decode_positions(self) -> int:
        """KV-cache positions the generation appends after the prompt (every generated token but the last)."""
        return self.max_reasoning_tokens + self.tokens_per_future


@dataclass
class GeneratedPlan:
    """One sample: reasoning token ids (without `<|traj_future_start|>`), whether the cap forced the end of the
    reasoning, and the trajectory as future bins [tokens_per_future] and their token ids."""

    reasoning_token_ids: list[int]
    reasoning_capped: bool
    future_bins: np.ndarray
    future_token_ids: list[int]
    accepted_lengths: list[int] = field(default_factory=list)  # per speculative block: tokens it produced
