"""Route -> navigation text, AlpaSim's rule (`route_to_nav_text` in NVlabs/alpasim's driver): geometric cases
whose answers follow from the rule's definition (see `planner/navigation.py`)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from planner.navigation import STRAIGHT, route_to_nav_text


def polyline(*corners: tuple[float, float], step: float = 1.0) -> np.ndarray:
    """[N, 3] waypoints every `step` metres along straight legs through `corners` (z = 0)."""
    points = [np.asarray(corners[0], dtype=np.float64)]
    for a, b in pairwise(corners):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        count = round(float(np.hypot(*(b - a))) / step)
        points += [a + (b - a) * k / count for k in range(1, count + 1)]
    xy = np.stack(points)
    return np.concatenate([xy, np.zeros((len(xy), 1))], axis=1)


def rotated(route: np.ndarray, degrees: float) -> np.ndarray:
    """`route` rotated about the rig origin (the ego yawed against the road by -`degrees`)."""
    c, s = np.cos(np.radians(degrees)), np.sin(np.radians(degrees))
    out = route.copy()
    out[:, :2] = route[:, :2] @ np.array([[c, s], [-s, c]])
    return out


def test_straight_road_continues_straight():
    assert route_to_nav_text(polyline((0, 0), (60, 0))) == STRAIGHT


@pytest.mark.parametrize("yaw_deg", [20.0, 45.0, -60.0, 170.0])
def test_straight_road_at_a_yaw_to_the_ego_is_straight(yaw_deg):
    # Every segment shares the near-zone chord's heading, whatever that heading is.
    assert route_to_nav_text(rotated(polyline((0, 0), (60, 0)), yaw_deg)) == STRAIGHT


def test_parallel_lane_offset_is_straight():
    # A lane 3.5 m to the left: the near chord runs along +x, so no segment deviates.
    assert route_to_nav_text(polyline((0, 3.5), (60, 3.5))) == STRAIGHT


def test_left_turn_at_20m():
    # The first segment heading +y ends at (20, 1), sqrt(401) = 20.02 m from the rig: reported as 20 m.
    assert route_to_nav_text(polyline((0, 0), (20, 0), (20, 30))) == "Turn left in 20m"


def test_right_turn_at_20m():
    assert route_to_nav_text(polyline((0, 0), (20, 0), (20, -30))) == "Turn right in 20m"


def test_turn_distance_is_the_far_end_of_the_first_turning_segment():
    # 2 m spacing: the first +y segment ends at (30, 2), 30.07 m away.
    assert route_to_nav_text(polyline((0, 0), (30, 0), (30, 20), step=2.0)) == "Turn left in 30m"


@pytest.mark.parametrize("yaw_deg", [150.0, -150.0, 179.0])
def test_turn_on_a_road_at_a_yaw_wraps_the_heading_change(yaw_deg):
    # Rotating the whole scene about the rig keeps every distance and every heading change.
    route = rotated(polyline((0, 0), (20, 0), (20, 30)), yaw_deg)
    assert route_to_nav_text(route) == "Turn left in 20m"


def test_turn_nearer_than_the_lookahead_is_ignored():
    # Turning at x = 2 m: the near zone (points within 5 m) spans (0, 0) -> (2, 4), a chord at 63.4 degrees,
    # so the +y road beyond deviates by 26.6 degrees: under 30, no turn left to announce.
    assert route_to_nav_text(polyline((0, 0), (2, 0), (2, 40))) == STRAIGHT


def test_gentle_curve_under_the_turn_angle_is_straight():
    # A 25-degree bend at 20 m stays below the 30-degree turn angle; 35 degrees exceeds it.
    bend = (20 + 30 * np.cos(np.radians(25)), 30 * np.sin(np.radians(25)))
    assert route_to_nav_text(polyline((0, 0), (20, 0), bend)) == STRAIGHT
    sharp = (20 + 30 * np.cos(np.radians(35)), 30 * np.sin(np.radians(35)))
    assert route_to_nav_text(polyline((0, 0), (20, 0), sharp)).startswith("Turn left in ")


def test_turn_beyond_40m_is_not_reported():
    assert route_to_nav_text(polyline((0, 0), (45, 0), (45, 30))) == STRAIGHT
    # At x = 40 the first +y segment ends at (40, 1), 40.01 m away: just beyond the lookahead.
    assert route_to_nav_text(polyline((0, 0), (40, 0), (40, 30))) == STRAIGHT
    assert route_to_nav_text(polyline((0, 0), (39, 0), (39, 30))) == "Turn left in 39m"
    assert route_to_nav_text(polyline((0, 0), (45, 0), (45, 30)), distance_lookahead_m=50.0) == (
        "Turn left in 45m"
    )


def test_nan_rows_are_padding():
    route = polyline((0, 0), (20, 0), (20, 30))
    nan = np.full((5, 3), np.nan)
    padded = np.concatenate([route[:10], nan[:2], route[10:], nan])
    assert route_to_nav_text(padded) == "Turn left in 20m"
    half_nan = route.copy()
    half_nan[3, 1] = np.nan  # a row with any NaN coordinate is dropped whole
    assert route_to_nav_text(half_nan) == "Turn left in 20m"


def test_no_usable_waypoint_gives_none():
    assert route_to_nav_text(np.zeros((0, 3))) is None
    assert route_to_nav_text(np.full((8, 3), np.nan)) is None


def test_repeated_last_waypoints_define_no_heading():
    # A zero-length step has heading atan2(0, 0) = 0, which on a road at 45 degrees would read as a 45-degree
    # right turn; the repeats are dropped instead.
    route = rotated(polyline((0, 0), (30, 0)), 45.0)
    padded = np.concatenate([route, np.repeat(route[-1:], 10, axis=0)])
    assert route_to_nav_text(padded) == STRAIGHT


def test_fewer_than_three_distinct_points_is_straight():
    assert route_to_nav_text(np.array([[10.0, 5.0, 0.0]])) == STRAIGHT
    two = np.array([[0.0, 0.0, 0.0], [10.0, 10.0, 0.0], [10.0, 10.0, 0.0], [10.0, 10.0, 0.0]])
    assert route_to_nav_text(two) == STRAIGHT


def test_two_column_routes_are_accepted_and_bad_shapes_refused():
    assert route_to_nav_text(polyline((0, 0), (20, 0), (20, 30))[:, :2]) == "Turn left in 20m"
    with pytest.raises(ValueError, match=r"shape \[N, 2\] or \[N, 3\], got \[5\]"):
        route_to_nav_text(np.zeros(5))
