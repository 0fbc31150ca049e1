"""Choosing the driven plan among K sampled ones, with the strategies of AlpaSim's driver
(`trajectory_selection.py` in NVlabs/alpasim): the first sample, or the one closest (3D, or laterally) to the
plan driven on the previous cycle, so the ego does not jump between modes from one cycle to the next."""

from __future__ import annotations

import numpy as np

SELECTIONS = ("ALWAYS_FIRST", "CLOSEST_3D", "CLOSEST_LATERAL")
# The previous plan must still cover this many of the new waypoints to be compared against (AlpaSim's value).
MIN_OVERLAP_STEPS = 4


def select_sample(
    strategy: str,
    candidates_xyz: np.ndarray,
    candidate_t_us: np.ndarray,
    previous_t_us: np.ndarray | None,
    previous_xyz_in_rig_t0: np.ndarray | None,
    skip_first: int = 0,
    max_points: int = 64,
) -> int:
    """Index of the candidate to drive.

    candidates_xyz [K, T, 3] metres, rig frame at t0; candidate_t_us [T] increasing; previous_t_us [P] and
    previous_xyz_in_rig_t0 [P, 3]: the plan chosen on the previous cycle re-expressed in the rig frame at t0
    (None on a session's first cycle). Distances average waypoints ``skip_first .. skip_first+max_points`` of
    the overlap. Raises ValueError when the previous plan overlaps fewer than MIN_OVERLAP_STEPS waypoints.
    """
    if strategy not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {strategy!r}")
    if strategy == "ALWAYS_FIRST" or previous_t_us is None or previous_xyz_in_rig_t0 is None:
        return 0
    overlap = int(np.count_nonzero(candidate_t_us <= previous_t_us[-1]))
    if overlap < MIN_OVERLAP_STEPS:
        raise ValueError(
            f"the previous plan overlaps {overlap} of the new waypoints, need at least {MIN_OVERLAP_STEPS}: "
            "drive is called less often than the plan horizon"
        )
    t = candidate_t_us[:overlap].astype(np.float64)
    tp = previous_t_us.astype(np.float64)
    prev = np.stack([np.interp(t, tp, previous_xyz_in_rig_t0[:, i]) for i in range(3)], axis=-1)
    cand = candidates_xyz[:, :overlap]
    if strategy == "CLOSEST_3D":
        dist = np.linalg.norm(cand - prev, axis=-1)
    else:  # lateral offset approximated by y in the rig frame at t0, as AlpaSim does
        dist = np.abs(cand[:, :, 1] - prev[:, 1])
    start = min(skip_first, dist.shape[1] - 1)
    end = min(start + max_points, dist.shape[1])
    return int(dist[:, start:end].mean(axis=1).argmin())
