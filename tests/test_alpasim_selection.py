"""Plan selection with AlpaSim's strategies on plans whose closest candidate is known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from bridges.alpasim.selection import MIN_OVERLAP_STEPS, select_sample

T = 100_000 * np.arange(1, 65)


def _lines(offsets_y: list[float], speed: float = 5.0) -> np.ndarray:
    x = speed * T / 1e6
    return np.stack([np.stack([x, np.full_like(x, y), np.zeros_like(x)], -1) for y in offsets_y])


def test_strategies_pick_the_candidate_nearest_the_previous_plan():
    cand = _lines([2.0, -0.5, 1.0])
    # the previous plan ran 0.1 s earlier along y = -0.4: candidate 1 in 3D and laterally
    prev_t, prev = T - 100_000, _lines([-0.4])[0]
    assert select_sample("ALWAYS_FIRST", cand, T, prev_t, prev) == 0
    assert select_sample("CLOSEST_3D", cand, T, prev_t, prev) == 1
    assert select_sample("CLOSEST_LATERAL", cand, T, prev_t, prev) == 1
    # a candidate that is laterally right but 3 m behind loses in 3D, not laterally
    behind = cand.copy()
    behind[2, :, 1] = -0.4
    behind[2, :, 0] -= 3.0
    assert select_sample("CLOSEST_LATERAL", behind, T, prev_t, prev) == 2
    assert select_sample("CLOSEST_3D", behind, T, prev_t, prev) == 1
    # first cycle of a session: nothing to be consistent with
    assert select_sample("CLOSEST_3D", cand, T, None, None) == 0


def test_too_little_overlap_and_unknown_strategy_are_refused():
    cand = _lines([0.0, 1.0])
    old_t = T[: MIN_OVERLAP_STEPS - 1]  # covers 3 of the new waypoints
    with pytest.raises(ValueError, match="overlaps 3 of the new waypoints, need at least 4"):
        select_sample("CLOSEST_3D", cand, T, old_t, _lines([0.0])[0][: MIN_OVERLAP_STEPS - 1])
    with pytest.raises(ValueError, match="selection must be one of"):
        select_sample("BEST", cand, T, None, None)
