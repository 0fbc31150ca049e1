"""`Cancellation`: a prediction stops at its next step boundary (vision encode, decode step, verify block, Euler
step) with `PredictionCancelled`, and the model predicts as before afterwards. The boundaries are counted, not
timed: the model's own calls set the cancellation at a chosen step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alpamayo.expert.sampler import euler_sample
from alpamayo.model_spec import ModelSpec
from alpamayo.prediction import Cancellation, PredictionCancelled
from alpamayo.runtime import AlpamayoVLA
from tests.test_runtime import straight_history

CAP = 16  # reasoning tokens: the demo model rarely ends its reasoning early, so a prediction has many steps


def frames_at(tick: int) -> tuple[dict[int, list[np.ndarray]], dict[int, list[int]]]:
    """One small camera's 4-frame window ending at `tick`, and its frame times."""
    ks = range(tick - 3, tick + 1)
    frames = [np.random.default_rng(k).integers(0, 256, (64, 96, 3), dtype=np.uint8) for k in ks]
    return {1: frames}, {1: [k * 100_000_000 for k in ks]}


def cancel_on_call(owner: object, name: str, calls: int, cancel: Cancellation) -> list[int]:
    """Wrap `owner.name` (on the instance) so that its `calls`-th call cancels `cancel` (after running); returns
    the list the wrapper appends each call's number to."""
    inner, seen = getattr(owner, name), []

    def wrapped(*args, **kwargs):
        seen.append(len(seen) + 1)
        out = inner(*args, **kwargs)
        if len(seen) == calls:
            cancel.cancel()
        return out

    setattr(owner, name, wrapped)
    return seen


@pytest.fixture(scope="module")
def vla(demo_checkpoint):
    """The demo's default decoder, the action expert: the reasoning's decode steps, then Euler steps (the
    trajectory tokens' decode steps are the same loop's)."""
    return AlpamayoVLA.from_spec(ModelSpec(checkpoint=demo_checkpoint, max_reasoning_tokens=CAP))


def test_a_cancelled_prediction_stops_at_the_next_decode_step_and_the_model_predicts_as_before(vla):
    frames, times = frames_at(3)
    ego = straight_history()
    expected = vla.predict(frames, ego, frame_times_ns=times)
    cancel = Cancellation()
    seen = cancel_on_call(vla.vlm, "decode", 3, cancel)
    try:
        with pytest.raises(PredictionCancelled):
            vla.predict(frames, ego, frame_times_ns=times, cancel=cancel)
        assert seen == [1, 2, 3]  # the step after the cancelling one never ran
    finally:
        del vla.vlm.decode
    again = vla.predict(frames, ego, frame_times_ns=times)
    assert again.best.reasoning_token_ids == expected.best.reasoning_token_ids
    np.testing.assert_array_equal(again.best.xyz, expected.best.xyz)


def test_a_cancelled_prediction_stops_before_the_next_vision_encode(vla):
    frames, _ = frames_at(3)  # no frame times: every frame is encoded
    cancel = Cancellation()
    seen = cancel_on_call(vla.vlm, "encode_pixels", 2, cancel)
    try:
        with pytest.raises(PredictionCancelled):
            vla.predict(frames, straight_history(), cancel=cancel)
    finally:
        del vla.vlm.encode_pixels
    assert seen == [1, 2]


def test_a_speculative_prediction_stops_at_the_next_verify_block(demo_checkpoint):
    vla = AlpamayoVLA.from_spec(
        ModelSpec(checkpoint=demo_checkpoint, max_reasoning_tokens=CAP, draft="lookup")
    )
    frames, times = frames_at(3)
    cancel = Cancellation()
    seen = cancel_on_call(vla.vlm, "verify", 2, cancel)
    with pytest.raises(PredictionCancelled):
        vla.predict(frames, straight_history(), frame_times_ns=times, cancel=cancel)
    assert seen == [1, 2]


def test_euler_sampling_stops_at_the_next_step():
    cancel, steps = Cancellation(), []

    def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        steps.append(float(t[0]))
        if len(steps) == 4:
            cancel.cancel()
        return torch.ones_like(x)

    with pytest.raises(PredictionCancelled):
        euler_sample(torch.zeros(2, 64, 2), 10, velocity, cancel=cancel)
    assert steps == pytest.approx([0.0, 0.1, 0.2, 0.3])
