"""Test access to one untraced velocity of a `TTActionExpert` (per-step PCC against the torch expert on a card).

This drives the device expert's own step code at a chosen time of the schedule; it is not part of the product.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from alpamayo.tt.expert import step_times


def velocity(
    tt: Any, x: torch.Tensor, t: float, offsets: int | Sequence[int], rope_delta: int, steps: int
) -> torch.Tensor:
    """One untraced velocity v(x, t) [K, 64, 2] float32 of the `TTActionExpert` `tt`; t must be one of the
    `steps`-step schedule's times."""
    x, offsets = tt._check(torch.as_tensor(x), offsets)
    times = step_times(steps)
    k = int(torch.argmin((times - t).abs()))
    if abs(float(times[k]) - t) > 1e-6:
        raise ValueError(f"t = {t} is not a time of the {steps}-step schedule {times.tolist()}")
    state = tt._setup(tt.text.max_batch, steps)
    tt._write_noise(state, x)
    tt._prepare(state, offsets, rope_delta)
    tt.ttnn.copy(state.t_rows[k], state.buffers.t)
    v = tt._velocity(state)
    out = tt._download_actions(v, x.shape[0])
    tt.free(v)
    return out
