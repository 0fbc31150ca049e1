"""Camera frames to trajectory with `--backend ttnn` on a Blackhole p150 (marked `blackhole`), and the same
checks at the `accuracy` recipe with `--tt-mode golden` (marked `golden`: `alpamayo.tt.golden`, no card).

`AlpamayoVLA` on the demo checkpoint runs its vision tower and text backbone on the device and is compared
with the torch backend (float32, CPU) on two consecutive 10 Hz ticks of four cameras: greedy decoding, the
same prompt and frames. The device must produce the torch backend's trajectory tokens for >= 95% of the 128
(recipe `accuracy`); the ADE between the two 6.4 s trajectories (the drift the device adds) is reported, and
so are the agreement and drift of the `performance` recipe, whose bfp4 MLP moves these random weights further
(its rounding cost is what `alpamayo precision` reports). The second tick must encode only each camera's new
frame: the per-frame feature cache works the same on both backends. The device stages land in the
runtime's tracer, so each prediction's timings carry them beside the pipeline stages. K = 6 expert samples
(plain, with the lookup draft and with a DFlash draft on the device) run in one device pass and are compared with the torch backend's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from alpamayo.generation import Sampling
from alpamayo.model_spec import ModelSpec
from alpamayo.runtime import AlpamayoVLA
from planner.metrics import ade
from tests.test_runtime import CAMERAS, frames_at, straight_history
from tests.tt_modes import device_cases

TOKEN_AGREEMENT = 0.95
REASONING_CAP = 32


@pytest.fixture(scope="module")
def torch_predictions(demo_checkpoint):
    # The discrete-token decoder on both backends: the demo checkpoint's expert is its torch default, and this
    # test compares the 128 trajectory tokens.
    vla = AlpamayoVLA.from_spec(
        ModelSpec(checkpoint=demo_checkpoint, max_reasoning_tokens=REASONING_CAP, decoder="tokens")
    )
    out = []
    for tick in (3, 4):
        frames, times = frames_at(tick)
        out.append(vla.predict(frames, straight_history(), frame_times_ns=times).samples[0])
    return out


def tt_mode(mode: str) -> str:
    """The `BackendOptions.tt_mode` of a `device_cases` mode."""
    return "device" if mode == "card" else "golden"


@pytest.mark.parametrize("case", device_cases(["accuracy", "performance"]))
def test_device_trajectory_tokens_match_the_torch_backend(
    demo_checkpoint, torch_predictions, case, record_figure
):
    mode, recipe = case
    vla = AlpamayoVLA.from_spec(
        ModelSpec(
            checkpoint=demo_checkpoint,
            backend="ttnn",
            recipe=recipe,
            tt_mode=tt_mode(mode),
            max_reasoning_tokens=REASONING_CAP,
            decoder="tokens",
        )
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
    decode = "tt.decode_untraced" if mode == "golden" else "tt.decode_trace_execute"  # golden: no traces
    assert {decode, "tt.device_to_host"} <= stages  # tick 4 adds one new frame per camera
    if recipe == "accuracy":
        assert min(agreement) >= TOKEN_AGREEMENT, f"trajectory token agreement {agreement}"


K_SAMPLES = 6  # eval's default K
# The argmax with ties broken alike on every row, while K > 1 stays allowed: top_k = 1 keeps every token tied
# at the top (as transformers), top_p = 1e-6 then keeps the first of them. The K rows then reason alike on each
# backend, and each row's flow-matching noise (seeded per row) still gives K different trajectories. Ties are
# real on the device: its logits are bf16, and the demo's random head is near-uniform between two tokens
# (the golden mode drew either at exact ties with top_k = 1 alone, and its rows diverged).
ARGMAX = Sampling(temperature=0.6, top_p=1e-6, top_k=1)


@pytest.fixture(scope="module")
def draft_specs(demo_checkpoint, tmp_path_factory):
    """--draft values by name: none, lookup, and dflash over a random tiny draft in z-lab's layout."""
    from alpamayo.config.loader import load_model_config
    from tests.dflash_checkpoints import dflash_config, save_dflash

    path = tmp_path_factory.mktemp("dflash")
    save_dflash(path, dflash_config(load_model_config(demo_checkpoint).text, block_size=8), seed=4)
    return {"none": "none", "lookup": "lookup", "dflash": f"dflash:{path}"}


@pytest.fixture(scope="module")
def torch_k_predictions(demo_checkpoint, draft_specs):
    """The torch backend's K = 6 expert predictions of tick 3 by draft (plain, the lookup draft, a DFlash
    draft), each made when a test first asks for it; its verify is bounded as the device's (32 rows x tokens:
    blocks of 5 for 6 rows), so the blocks are the same."""
    from alpamayo.tt.text.decode import MAX_ROWS

    made: dict[str, Any] = {}

    def prediction(draft: str) -> Any:
        if draft not in made:
            vla = AlpamayoVLA.from_spec(
                ModelSpec(
                    checkpoint=demo_checkpoint, max_reasoning_tokens=REASONING_CAP, draft=draft_specs[draft]
                )
            )
            vla.vlm.text.max_verify_rows = MAX_ROWS
            frames, times = frames_at(3)
            made[draft] = vla.predict(
                frames,
                straight_history(),
                num_samples=K_SAMPLES,
                seed=0,
                frame_times_ns=times,
                sampling=ARGMAX,
            )
        return made[draft]

    return prediction


@pytest.mark.parametrize(
    "case", device_cases(["none", "lookup", "dflash"], golden=lambda draft: draft == "dflash")
)
def test_k_samples_on_the_device_match_the_torch_backend(
    demo_checkpoint, torch_k_predictions, draft_specs, case, record_figure
):
    """K = 6 samples in one device pass (K rows of one decode program, with or without a draft's K-row verify
    blocks: lookup, or DFlash with its layers on the device, then one expert step over the K cache slots)
    against the torch backend: the K rows of one program reason alike (the same prompt, the argmax), accepted
    lengths equal to torch's wherever a row's reasoning is (acceptance under top_k = 1 is the argmax), and each
    row's reasoning agreement with torch and waypoint drift recorded (the expert's own bound is
    tests/test_tt_expert_device.py's). Reasoning tokens are not held to the trajectory test's 95%: the demo's
    random head is near-uniform between two tokens, which bf16 logits tie (golden mode: 29 of 32 equal to the
    float32 torch backend's, and the torch backend on the recipe-rounded weights differs from both at 2-3
    other steps, each between the same two tokens)."""
    mode, draft = case
    expected = torch_k_predictions(draft)
    vla = AlpamayoVLA.from_spec(
        ModelSpec(
            checkpoint=demo_checkpoint,
            backend="ttnn",
            recipe="accuracy",
            tt_mode=tt_mode(mode),
            max_reasoning_tokens=REASONING_CAP,
            draft=draft_specs[draft],
        )
    )
    try:
        frames, times = frames_at(3)
        got = vla.predict(
            frames, straight_history(), num_samples=K_SAMPLES, seed=0, frame_times_ns=times, sampling=ARGMAX
        )
    finally:
        vla.close()
    assert got.decoder == "expert" and len(got.samples) == K_SAMPLES
    agreement, drift = [], []
    for b, (e, g) in enumerate(zip(expected.samples, got.samples, strict=True)):
        n = max(len(e.reasoning_token_ids), len(g.reasoning_token_ids))
        same = sum(x == y for x, y in zip(e.reasoning_token_ids, g.reasoning_token_ids, strict=False))
        agreement.append(same / n)
        drift.append(float(ade(g.xyz, e.xyz)))
        if draft != "none" and e.reasoning_token_ids == g.reasoning_token_ids:
            assert got.accepted_lengths[b] == expected.accepted_lengths[b], f"row {b}"
    record_figure(f"K={K_SAMPLES} draft {draft}: reasoning tokens equal to torch's per row", str(agreement))
    record_figure(f"K={K_SAMPLES} draft {draft}: waypoint ADE to torch per row, metres", str(drift))
    if draft != "none":
        record_figure(f"K={K_SAMPLES} {draft}: mean accepted length", got.mean_accepted_length)
    rows = {tuple(g.reasoning_token_ids) for g in got.samples}
    assert len(rows) == 1, f"the K rows of one program reasoned differently: {rows}"
