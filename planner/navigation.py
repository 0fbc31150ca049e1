"""Route waypoints -> the navigation text Alpamayo 1.5 conditions on ("Turn left in 20m", "Continue straight").

The rule is the one NVIDIA's AlpaSim driver applies (`route_to_nav_text`, `NVlabs/alpasim`,
`src/driver/src/alpasim_driver/models/nav_text.py`), so a drive replayed here and the same route in AlpaSim
give the model the same text:

- rows with a NaN x or y are padding and are dropped; a point within 1 mm of the point before it (a repeated
  last waypoint) defines no bearing and is dropped too;
- the road's initial heading is the chord from the first to the last point within `min_lookahead_m` of the
  rig origin (or the first segment when fewer than two points lie that close), so a road at a constant yaw
  to the ego, or a parallel lane, reads straight;
- the first segment whose far end lies in [`min_lookahead_m`, `distance_lookahead_m`] and whose heading
  differs from the initial heading by more than `turn_angle_deg` is the turn; its far end's distance from
  the rig origin, rounded half to even (at least 1 m), is the distance reported.

Turns are told by heading change rather than lateral offset because a fixed lateral threshold is about 24
degrees of heading at 5 m but only about 3 degrees at 40 m. The wording is the wording the model was trained
on, so it is fixed.
"""

from __future__ import annotations

import numpy as np

STRAIGHT = "Continue straight"

# Shorter than this, a step defines no bearing (resampled routes repeat their last waypoint as padding).
MIN_STEP_M = 1e-3


def route_to_nav_text(
    route_in_rig: np.ndarray,
    *,
    min_lookahead_m: float = 5.0,
    turn_angle_deg: float = 30.0,
    distance_lookahead_m: float = 40.0,
) -> str | None:
    """The navigation text for a route ahead of the ego.

    route_in_rig: [N, 2] or [N, 3] metres in the rig frame at t0 (x forward, y left; z is ignored), in route
    order; NaN rows are padding. min_lookahead_m: turns whose far end is nearer are ignored (the ego is already
    in them); turn_angle_deg: heading change, degrees, that separates a turn from lane curvature;
    distance_lookahead_m: turns whose far end is further are ignored (reported on a later tick).

    Returns "Turn left in {N}m", "Turn right in {N}m" or "Continue straight"; None when no waypoint is usable
    (the model then runs without navigation text).
    """
    route = np.asarray(route_in_rig, dtype=np.float64)
    if route.size == 0:
        return None
    if route.ndim != 2 or route.shape[1] < 2:
        raise ValueError(f"route_in_rig must have shape [N, 2] or [N, 3], got {list(route.shape)}")
    xy = route[:, :2]
    xy = xy[~np.isnan(xy).any(axis=1)]
    if len(xy) == 0:
        return None
    step_lengths = np.hypot(*np.diff(xy, axis=0).T)
    xy = xy[np.concatenate([[True], step_lengths > MIN_STEP_M])]
    # One segment cannot tell a turn from a road at an angle to the ego, or from a lane offset.
    if len(xy) < 3:
        return STRAIGHT

    reach = np.hypot(xy[:, 0], xy[:, 1])  # [N] distance of each point from the rig origin
    near = np.flatnonzero(reach <= min_lookahead_m)
    chord = xy[near[-1]] - xy[near[0]] if len(near) >= 2 else xy[1] - xy[0]
    if np.hypot(*chord) < MIN_STEP_M:
        chord = xy[1] - xy[0]
    road_heading = np.arctan2(chord[1], chord[0])

    steps = np.diff(xy, axis=0)  # segment k: xy[k] -> xy[k + 1]
    turn = np.remainder(np.arctan2(steps[:, 1], steps[:, 0]) - road_heading + np.pi, 2 * np.pi) - np.pi
    far_end = reach[1:]
    turning = (
        (far_end >= min_lookahead_m)
        & (far_end <= distance_lookahead_m)
        & (np.abs(turn) > np.radians(turn_angle_deg))
    )
    hits = np.flatnonzero(turning)
    if len(hits) == 0:
        return STRAIGHT
    first = hits[0]
    side = "left" if turn[first] > 0 else "right"
    return f"Turn {side} in {max(1, round(float(far_end[first])))}m"
