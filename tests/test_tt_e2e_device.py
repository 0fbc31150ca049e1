"""Camera frames to trajectory with `--backend ttnn` on a Blackhole p150 (marked `blackhole`).

`AlpamayoVLA` on the demo checkpoint runs its vision tower and text backbone on the device and is compared
with the torch backend (float32, CPU) on two consecutive 10 Hz ticks of four cameras: greedy decoding, the
same prompt and frames. The device must produce the torch backend's trajectory tokens for >= 95% of the 128
(recipe `accuracy`); the ADE between the two 6.4 s trajectories (the drift the device adds) is reported, and
so are the agreement and drift of the `performance` recipe, whose bfp4 MLP moves these random weights further
(its rounding cost is what `alpamayo precision` reports). The second tick must encode only each camera's new
frame: the per-frame feature cache works the same on both backends. The device stages land in the
runtime's tracer, so each prediction's timings carry them beside the pipeline stages.
"""

from __future__ import annotations

import numpy as np
import pytest

from alpamayo.backends import BackendOptions
from alpamayo.runtime import AlpamayoVLA
from planner.metrics import ade
from tests.test_runtime import CAMERAS, frames_at, straight_history

pytestmark = pytest.mark.blackhole

TOKEN_AGREEMENT = 0.95
REASONING_CAP = 32


@pytest.fixture(scope="module")
def torch_predictions(demo_checkpoint):
    # The discrete-token decoder on both backends: the demo checkpoint's expert is its torch default, and this
    # test compares the 128 trajectory tokens.
    vla = AlpamayoVLA.from_checkpoint(demo_checkpoint, max_reasoning_tokens=REASONING_CAP, decoder="tokens")
    out = []
    for tick in (3, 4):
        frames, times = frames_at(tick)
        out.append(vla.predict(frames, straight_history(), frame_times_ns=times).samples[0])
    return out


@pytest.mark.parametrize("recipe", ["accuracy", "performance"])
def test_device_trajectory_tokens_match_the_torch_backend(
    demo_checkpoint, torch_predictions, recipe, record_figure
):
    vla = AlpamayoVLA.from_checkpoint(
        demo_checkpoint,
        BackendOptions("ttnn", recipe=recipe),
        max_reasoning_tokens=REASONING_CAP,
        decoder="tokens",
    )
    try:
        agreement, drift, encoded, stages = [], [], [], set()
        for tick, expected in zip((3, 4), torch_predictions, strict=True):
            frames, times = frames_at(tick)
            prediction = vla.predict(frames, straight_history(), frame_times_ns=times)
            (got,) = prediction.samples
            stages |= set(prediction.timings_ms)
            assert len(got.token_ids) == 128 and got.xyz.shape == (64, 3)
            agreement.append(
                float(np.mean([a == b for a, b in zip(expected.token_ids, got.token_ids, strict=True)]))
            )
            drift.append(float(ade(got.xyz, expected.xyz)))
            encoded.append(vla.frames_encoded)
    finally:
        vla.close()
    record_figure(f"{recipe}: trajectory tokens equal to the torch backend's (ticks 3, 4)", str(agreement))
    record_figure(f"{recipe}: ADE drift from the torch backend, metres (ticks 3, 4)", str(drift))
    assert encoded == [4 * len(CAMERAS), 5 * len(CAMERAS)]
    device_stages = {"tt.vision", "tt.prefill_setup", "tt.prefill_layers", "tt.prefill_head"}
    assert {"vision", "prefill", "trajectory_decode", *device_stages, "tt.host_to_device"} <= stages
    assert {"tt.decode_trace_execute", "tt.device_to_host"} <= stages  # tick 4 adds one new frame per camera
    if recipe == "accuracy":
        assert min(agreement) >= TOKEN_AGREEMENT, f"trajectory token agreement {agreement}"
