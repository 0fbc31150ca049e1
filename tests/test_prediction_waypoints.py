"""`Prediction.waypoints`: the sample trajectory every output sends (the node's message, the AlpaSim poses)."""

from __future__ import annotations

import numpy as np
import pytest

from alpamayo.prediction import FUTURE_STEPS, Prediction, TrajectorySample


def sample(xyz: np.ndarray, heading: np.ndarray) -> TrajectorySample:
    return TrajectorySample("", [], [], np.zeros((FUTURE_STEPS, 2)), xyz, heading)


def test_waypoints_are_the_samples_in_float64():
    rng = np.random.default_rng(0)
    first = sample(rng.normal(size=(FUTURE_STEPS, 3)).astype(np.float32), np.zeros(FUTURE_STEPS, np.float32))
    second = sample(rng.normal(size=(FUTURE_STEPS, 3)), rng.normal(size=FUTURE_STEPS))
    prediction = Prediction([first, second])
    xyz, heading = prediction.waypoints()
    assert xyz.dtype == heading.dtype == np.float64
    np.testing.assert_array_equal(xyz, first.xyz.astype(np.float64))
    xyz, heading = prediction.waypoints(1)
    assert xyz is second.xyz and heading is second.heading  # float64 already: no copy


@pytest.mark.parametrize(
    ("xyz_shape", "heading_shape", "message"),
    [
        ((FUTURE_STEPS, 2), (FUTURE_STEPS,), "waypoints [64, 2], heading [64] for 64 times"),
        ((FUTURE_STEPS - 1, 3), (FUTURE_STEPS - 1,), "waypoints [63, 3], heading [63] for 64 times"),
        ((FUTURE_STEPS, 3), (FUTURE_STEPS, 1), "waypoints [64, 3], heading [64, 1] for 64 times"),
    ],
)
def test_waypoints_that_do_not_match_the_times_are_named(xyz_shape, heading_shape, message):
    prediction = Prediction([sample(np.zeros(xyz_shape), np.zeros(heading_shape))])
    with pytest.raises(ValueError) as e:
        prediction.waypoints()
    assert str(e.value) == message
