"""Trajectory tokenizers, their settings from config.json, and token ids resolved through a real tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from alpamayo.errors import ConfigError
from alpamayo.tokenizer import load_tokenizer
from planner.settings import HistoryTokenizerSettings, PlannerSettings, parse_planner_settings
from planner.tokenizers import FutureTokenizer, HistoryTokenizer, TrajectoryVocab

FUTURE = FutureTokenizer()
HISTORY = HistoryTokenizer()
STEP_DX = 8 / 999  # history bin width along x and y (1000 bins over [-4, 4] m)


def straight_history(speed: float) -> np.ndarray:
    """16 poses at 10 Hz ending at the origin, driving along +x at `speed` m/s."""
    x = speed * 0.1 * np.arange(-15, 1)
    return np.stack([x, np.zeros(16), np.zeros(16)], -1)


def test_history_tokens_are_per_step_deltas_with_the_origin_padded():
    bins = HISTORY.encode(straight_history(10.0))
    assert bins.shape == (48,) and bins.dtype == np.int64
    # first delta is xyz[0] - origin = (-15 m, 0, 0): clamped to the lowest x bin, like the released tokenizer
    assert bins[:3].tolist() == [0, round(999 / 2), round(999 / 2)]
    # then 15 steps of +1 m along x: bin round((1 + 4) / 8 * 999)
    assert bins[3::3].tolist() == [round(5 / 8 * 999)] * 15
    assert set(bins[4::3].tolist()) == {500} and set(bins[5::3].tolist()) == {500}


def test_unpadded_history_gives_45_tokens():
    tokenizer = HistoryTokenizer(HistoryTokenizerSettings(pad_origin=False))
    bins = tokenizer.encode(straight_history(10.0))
    assert bins.shape == (45,)
    assert bins.tolist() == HISTORY.encode(straight_history(10.0))[3:].tolist()


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float64, (16, 3), elements=st.floats(-3.9, 3.9)),
)
def test_history_decode_recovers_positions_within_half_a_bin_per_step(steps):
    xyz = np.cumsum(steps, axis=0)  # every delta (including the first, from the origin) within range
    decoded = HISTORY.decode(HISTORY.encode(xyz))
    tolerance = np.arange(1, 17)[:, None] * np.array([STEP_DX, STEP_DX, 20 / 999]) / 2 + 1e-9
    assert np.all(np.abs(decoded - xyz) <= tolerance)


@settings(max_examples=60, deadline=None)
@given(arrays(np.int64, (128,), elements=st.integers(0, 2999)))
def test_future_tokens_to_actions_to_tokens_is_exact(bins):
    actions = FUTURE.decode(bins)
    assert actions.shape == (64, 2)
    np.testing.assert_array_equal(FUTURE.encode(actions), bins)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, (64, 2), elements=st.floats(-1e6, 1e6)))
def test_future_tokens_are_in_range_for_any_finite_actions(actions):
    bins = FUTURE.encode(actions)
    assert bins.min() >= 0 and bins.max() <= 2999


def test_future_tokens_interleave_accel_and_curvature_and_clip_at_ten_sigma():
    actions = np.zeros((64, 2))
    actions[0] = [0.02903 + 0.68104, 0.000269]  # +1 sigma accel, mean curvature
    actions[1] = [100.0, -100.0]  # far outside [-10, 10] sigma
    bins = FUTURE.encode(actions)
    assert bins[0] == round(11 / 20 * 2999) and bins[1] == round(10 / 20 * 2999)
    assert bins[2] == 2999 and bins[3] == 0
    decoded = FUTURE.decode(bins)
    np.testing.assert_allclose(decoded[1], [0.02903 + 10 * 0.68104, 0.000269 - 10 * 0.026148])


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_inputs_are_rejected_by_name_and_index(value):
    actions = np.zeros((64, 2))
    actions[5, 1] = value
    with pytest.raises(ValueError, match=r"actions\[5, 1\] = .*must be finite"):
        FUTURE.encode(actions)
    xyz = straight_history(5.0)
    xyz[2, 0] = value
    with pytest.raises(ValueError, match=r"history xyz\[2, 0\]"):
        HISTORY.encode(xyz)


def test_bins_outside_the_vocabulary_are_rejected():
    with pytest.raises(ValueError, match=r"future bins\[3\] = 3000 is outside the bin range \[0, 2999\]"):
        FUTURE.decode(np.array([0, 0, 0, 3000] + [0] * 124))
    with pytest.raises(ValueError, match=r"future bins must have shape \[128\]"):
        FUTURE.decode(np.zeros(127, dtype=np.int64))


def test_settings_come_from_the_alpamayo_config_keys():
    extra = {
        "traj_tokenizer_cfg": {"num_bins": 3000, "action_space_cfg": {"accel_mean": 0.1, "accel_std": 0.5}},
        "action_space_cfg": {"accel_mean": 9.0, "curvature_std": 0.03},
        "hist_traj_tokenizer_cfg": {"pad_origin_at_beginning": False},
        "tokens_per_history_traj": 45,
        "tokens_per_future_traj": 128,
        "traj_vocab_size": 4000,
    }
    s = parse_planner_settings(extra)
    # the discrete tokenizer's own action-space settings win over the top-level ones
    assert (s.action_space.accel_mean, s.action_space.accel_std) == (0.1, 0.5)
    assert s.action_space.curvature_std == 0.03
    assert s.history.num_tokens == 45 and s.tokens_per_future == 128
    assert parse_planner_settings({}) == PlannerSettings()


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"tokens_per_history_traj": 45}, r"'tokens_per_history_traj' = 45 disagrees .* which give 48"),
        ({"traj_tokenizer_cfg": {"dims_min": [-10, 10]}}, r"'traj_tokenizer_cfg.dims_min' = \[-10.0, 10.0\]"),
        ({"action_space_cfg": {"accel_std": 0}}, r"'action_space_cfg.accel_std' must be a positive"),
        (
            {"hist_traj_tokenizer_cfg": {"num_bins": 1}},
            r"'hist_traj_tokenizer_cfg.num_bins' must be an integer >= 2",
        ),
        ({"hist_traj_tokenizer_cfg": [1]}, r"'hist_traj_tokenizer_cfg' must be a JSON object"),
    ],
)
def test_bad_settings_name_the_field(extra, message):
    with pytest.raises(ConfigError, match=message):
        parse_planner_settings(extra, "ckpt/config.json")


def test_vocab_ids_are_resolved_by_string_through_the_tokenizer(demo_checkpoint):
    tokenizer = load_tokenizer(demo_checkpoint)
    vocab = TrajectoryVocab.from_tokenizer(tokenizer)
    for b in (0, 1, 2999):
        assert vocab.future_ids[b] == tokenizer.convert_tokens_to_ids(f"<i{b}>")
    assert vocab.history_ids[0] == tokenizer.convert_tokens_to_ids("<i3000>")
    assert vocab.history_ids[999] == tokenizer.convert_tokens_to_ids("<i3999>")
    assert vocab.marker("traj_future_start") == tokenizer.convert_tokens_to_ids("<|traj_future_start|>")
    assert tokenizer.convert_ids_to_tokens(int(vocab.future_ids[7])) == "<i7>"
    np.testing.assert_array_equal(vocab.future_bins(vocab.future_ids[[5, 0, 2999]]), [5, 0, 2999])
    with pytest.raises(ValueError, match=r"token id \d+ at position 1 is not a future-trajectory token"):
        vocab.future_bins([vocab.future_ids[0], vocab.history_ids[0]])
    with pytest.raises(ValueError, match=r"outside the model's embedding table \[0, 4000\)"):
        TrajectoryVocab.from_tokenizer(tokenizer, vocab_size=4000)


def test_a_tokenizer_without_trajectory_tokens_is_rejected():
    from tests.hf_checkpoints import build_tokenizer

    with pytest.raises(ValueError, match=r"4007 trajectory token\(s\) missing .* first \['<i0>'"):
        TrajectoryVocab.from_tokenizer(build_tokenizer())
