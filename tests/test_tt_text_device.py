"""The ttnn text backbone on a Blackhole p150 against the torch reference (marked `blackhole`), and the same
checks at the `accuracy` recipe in the ttnn golden mode (marked `golden`: `alpamayo.tt.golden`, no card).

Runs on random tiny checkpoints built here (both presets) and, when `ALPAMAYO_TT_CHECKPOINT` names a Qwen3-VL
checkpoint directory, on that checkpoint (recipe from `ALPAMAYO_TT_RECIPE`, default performance; packed
weights cached in `ALPAMAYO_TT_CACHE` if set). The torch reference runs in float32 for the tiny checkpoints and
in bfloat16 for the real one, on the recipe-rounded weights (`alpamayo.tt.quantized.QuantizedCheckpoint`,
bit-exact with ttnn's packer), so the thresholds
measure the device implementation; what the recipe's rounding costs is recorded beside them. Figures land in
the "measured figures" table at the end of the run.

The tiny cases include a Qwen3-VL-MoE model (`TT_TINY["moe"]`): its sparse layers run the ttnn MoE block.

Per-layer checks feed the reference's own input to one device layer (`layer_prefill` / `layer_decode`), so
each layer's figure is that layer's error alone. Every PCC gate is `alpamayo.numerics.assert_agrees`: PCC and,
beside it, the relative error that PCC allows for noise (PCC cannot see a wrong scale or offset).
"""

from __future__ import annotations

import os

import pytest
import torch

from alpamayo.config.loader import load_model_config
from alpamayo.generation import greedy_continue
from alpamayo.numerics import agreement, assert_agrees, pcc
from alpamayo.plan.precision import load_precision
from alpamayo.plan.programs.text import plan_text
from alpamayo.precision.reference import layer_io
from alpamayo.profiling import Tracer
from alpamayo.text import TextModel
from alpamayo.text.inputs import text_position_ids
from tests.hf_checkpoints import TOKEN_IDS
from tests.routing import NEAR_TIE, router_margins
from tests.tt_checkpoints import (
    CACHE_ENV,
    REAL_ENV,
    TT_TINY,
    real_recipe,
    reference_and_device,
    save_tt_checkpoint,
)
from tests.tt_modes import card_only, case_device, device_cases
from tests.tt_text_seams import kv_cache_host, layer_decode, layer_prefill, wrapped_decode_layers

CASES = [f"{name}-{recipe}" for name in TT_TINY for recipe in ("accuracy", "performance")] + ["real"]
LAYER_PCC, LOGITS_PCC, KV_PCC, TOP1 = 0.99, 0.97, 0.999, 0.95
PROMPT_LEN = 126  # decode positions 126..129 cross a tile and a 128-row flash-decode chunk


@pytest.fixture(scope="module")
def device():
    """Device 0 for this module's models (closed at the end of the module, so other modules can open it)."""
    from alpamayo.tt.device import close_device, open_device

    trace = 64 << 20  # the tiny models' plans need ~10 MiB
    if os.environ.get(REAL_ENV):
        recipe = load_precision(real_recipe())
        trace = max(trace, plan_text(load_model_config(os.environ[REAL_ENV]), recipe).trace_region_bytes)
    dev = open_device(trace)
    yield dev
    close_device(dev)


class Case:
    """A checkpoint on the device and in the torch reference (recipe-rounded weights), with a prompt."""

    def __init__(self, name, path, recipe, ref_dtype, device):
        self.name, self.path, self.precision = name, path, load_precision(recipe)
        self.ref, self.tt = reference_and_device(
            path, self.precision, device, ref_dtype, os.environ.get(CACHE_ENV)
        )
        vocab = self.ref.text_cfg.vocab_size
        self.prompt = torch.randint(
            0, min(vocab, 256), (PROMPT_LEN,), generator=torch.Generator().manual_seed(7)
        )

    def __repr__(self) -> str:
        return f"Case({self.name})"


@pytest.fixture(scope="module", params=device_cases(CASES))
def case(request, tmp_path_factory):
    param, device = case_device(request)
    if param == "real":
        path = os.environ.get(REAL_ENV)
        if not path:
            pytest.skip(f"set {REAL_ENV} to a Qwen3-VL checkpoint directory to run the real-checkpoint tests")
        c = Case("real", path, real_recipe(), torch.bfloat16, device)
    else:
        name, recipe = param.rsplit("-", 1)
        path = tmp_path_factory.mktemp(param)
        save_tt_checkpoint(path, name, seed=17)
        c = Case(param, path, recipe, torch.float32, device)
    yield c
    c.tt.close()


@torch.inference_mode()
def reference_decode_io(ref: TextModel, token: int, position: int) -> list:
    """(input, output) [H] of every reference decoder layer for `token` at cache index `position`."""
    cos, sin = ref.rope.cos_sin_1d(torch.tensor([position + ref.rope_delta]), ref.dtype)
    ios, x = [], ref.embed(torch.tensor([token]))[None]
    for layer in ref.layers:
        y = layer(x, cos, sin, ref.cache, position)
        ios.append((x[0, 0].clone(), y[0, 0].clone()))
        x = y
    ref.cache_len = position + 1
    return ios


def test_prefill_layers_and_kv_cache_match_the_reference(case, record_figure):
    ref, tt = case.ref, case.tt
    ref.setup_cache(256)
    tt.setup_cache(256)
    positions = text_position_ids(PROMPT_LEN)
    ios = layer_io(ref, ref.embed(case.prompt), positions)
    worst, worst_kv = 1.0, 1.0
    for i, (x, y) in enumerate(ios):
        p = assert_agrees(
            y, layer_prefill(tt, i, x, positions), min_pcc=LAYER_PCC, what=f"prefill layer {i}"
        ).pcc
        k, v = kv_cache_host(tt, i, PROMPT_LEN)
        kv = min(
            assert_agrees(
                ref.cache.k[i][0, :, :PROMPT_LEN], k, min_pcc=KV_PCC, what=f"layer {i} K cache"
            ).pcc,
            assert_agrees(
                ref.cache.v[i][0, :, :PROMPT_LEN], v, min_pcc=KV_PCC, what=f"layer {i} V cache"
            ).pcc,
        )
        worst, worst_kv = min(worst, p), min(worst_kv, kv)
    record_figure("prefill worst layer PCC", worst)
    record_figure("KV cache worst PCC", worst_kv)


def test_decode_layers_match_the_reference_at_several_positions(case, record_figure):
    ref, tt = case.ref, case.tt
    ref.setup_cache(256)
    tt.setup_cache(256)
    ref.prefill(case.prompt)
    tt.prefill(case.prompt)
    worst, ties, checks = 1.0, 0, 0
    for step, position in enumerate(range(PROMPT_LEN, PROMPT_LEN + 4)):
        token = int(case.prompt[step])
        with router_margins(ref) as margins:
            ios = reference_decode_io(ref, token, position)
        for i, (x, y) in enumerate(ios):
            out = layer_decode(tt, i, x, position)  # always run: it writes the layer's K/V row
            if i in margins and float(margins[i][0]) < NEAR_TIE:  # an MoE routing either way is right
                ties += 1
                continue
            p = assert_agrees(y, out, min_pcc=LAYER_PCC, what=f"decode layer {i} at position {position}").pcc
            worst, checks = min(worst, p), checks + 1
    record_figure("decode worst layer PCC (positions 126..129)", worst)
    record_figure("decode layer checks skipped at MoE routing near-ties", f"{ties} of {ties + checks}")
    assert 2 * checks >= ties + checks


@pytest.mark.parametrize("length", [PROMPT_LEN, 300])
def test_prefill_logits_match_the_reference(case, length, record_figure):
    ref, tt = case.ref, case.tt
    ref.setup_cache(length)
    tt.setup_cache(length)
    ids = torch.cat([case.prompt] * 3)[:length]
    expected, actual = ref.prefill(ids), tt.prefill(ids)
    logits = agreement(expected, actual)
    record_figure(f"prefill logits PCC (L={length})", logits.pcc)
    record_figure(f"prefill logits relative error (L={length})", logits.relative)
    if case.name != "real":  # what the recipe's rounding costs on top: against the unrounded float32 model
        plain = TextModel.from_checkpoint(case.path)
        plain.setup_cache(length)
        record_figure(
            f"prefill logits PCC vs unrounded weights (L={length})", pcc(plain.prefill(ids), actual)
        )
    assert_agrees(expected, actual, min_pcc=LOGITS_PCC, what=f"prefill logits (L={length})")
    hidden = assert_agrees(
        ref.prefill_hidden(ids), tt.prefill_hidden(ids), min_pcc=LOGITS_PCC, what="prefill final hidden"
    )
    record_figure(f"prefill final hidden PCC (L={length})", hidden.pcc)


def test_teacher_forced_top1_agreement_over_128_tokens(case, record_figure):
    ref, tt = case.ref, case.tt
    n = 128
    ref.setup_cache(PROMPT_LEN + n)
    tt.setup_cache(PROMPT_LEN + n)
    expected = greedy_continue(ref, ref.prefill(case.prompt), n)  # the reference's own argmax at every step
    logits, agree = tt.prefill(case.prompt), 0
    for j in range(n):
        agree += int(torch.argmax(logits)) == expected[j]
        if j + 1 < n:
            logits = tt.decode(expected[j])  # teacher forcing: the reference token, whatever the device chose
    record_figure("teacher-forced top-1 agreement (128 tokens)", agree / n)
    assert agree / n >= TOP1


def test_traced_decode_is_identical_to_untraced_decode(case):
    tt = case.tt
    card_only(tt, "traced against untraced decode")
    tokens = [int(t) for t in case.prompt[:12]]
    tt.setup_cache(PROMPT_LEN + len(tokens))
    runs = []
    for traced in (True, False):
        tt.prefill(case.prompt)
        runs.append([tt.decode(t, traced=traced) for t in tokens])
    for step, (a, b) in enumerate(zip(*runs, strict=True)):
        assert torch.equal(a, b), f"step {step}: traced and untraced logits differ"


def test_decode_replays_run_no_python(case):
    """The decode layers' Python runs at compile and capture only; replays never call it again."""
    tt = case.tt
    card_only(tt, "trace replays")
    calls = []

    def counted(layer):
        def run(i, x, *args):
            calls.append(i)
            return layer(i, x, *args)

        return run

    tt.setup_cache(PROMPT_LEN + 4)  # drops any earlier trace
    tt.prefill(case.prompt)
    baseline = [tt.decode(t, traced=False) for t in (3, 5, 7)]
    tt.prefill(case.prompt)
    with wrapped_decode_layers(tt, counted):
        seam = [tt.decode(t) for t in (3, 5, 7)]
    assert calls == [i for _ in range(2) for i in range(tt.text_cfg.num_hidden_layers)]
    assert all(torch.equal(a, b) for a, b in zip(baseline, seam, strict=True))


def test_profiling_spans_cover_every_stage(case):
    tt = case.tt
    card_only(tt, "the trace's profiling spans")
    tt.tracer = Tracer()
    try:
        tt.setup_cache(PROMPT_LEN + 4)
        tt.prefill(case.prompt)
        for t in (1, 2, 3):
            tt.decode(t)
        names = {s.name for s in tt.tracer.spans}
    finally:
        tt.tracer = Tracer(enabled=False)
    assert {
        "tt.prefill_setup",
        "tt.prefill_layers",
        "tt.prefill_head",
        "tt.decode_compile_and_capture",
        "tt.decode_trace_execute",
        "tt.host_to_device",
        "tt.device_to_host",
    } <= names


@pytest.fixture(scope="module", params=device_cases(["image"], golden=lambda _: True))
def image_case(request, tmp_path_factory):
    """A TT-shaped checkpoint with a vision tower, one 64x96 image prompt, transformers' features and positions."""
    _, device = case_device(request)

    path = tmp_path_factory.mktemp("tt-image")
    hf = save_tt_checkpoint(path, "gqa2", seed=23)
    n_img = (4 * 6) // 4
    ids = torch.tensor(
        [TOKEN_IDS["<|im_start|>"], *b"user\n", TOKEN_IDS["<|vision_start|>"]]
        + [TOKEN_IDS["<|image_pad|>"]] * n_img
        + [TOKEN_IDS["<|vision_end|>"], *b"Describe this image.", TOKEN_IDS["<|im_end|>"]]
    )
    grid = torch.tensor([[1, 4, 6]])
    pixels = torch.randn(24, 3 * 2 * 16 * 16, generator=torch.Generator().manual_seed(0))
    mask = ids == TOKEN_IDS["<|image_pad|>"]
    with torch.no_grad():
        visual = hf.model.visual(pixels, grid_thw=grid)
        positions, _ = hf.model.get_rope_index(
            ids.view(1, -1),
            mask.to(torch.int32).view(1, -1),
            image_grid_thw=grid,
            attention_mask=torch.ones(1, ids.numel(), dtype=torch.long),
        )
    precision = load_precision("accuracy")
    ref, tt = reference_and_device(path, precision, device)
    embeds = ref.embed(ids).clone()
    embeds[mask] = visual.pooler_output
    yield dict(
        ref=ref,
        tt=tt,
        embeds=embeds,
        positions=positions[:, 0],
        mask=mask,
        deepstack=list(visual.deepstack_features),
    )
    tt.close()


def test_image_prompt_with_deepstack_matches_the_reference(image_case, record_figure):
    ref, tt, c = image_case["ref"], image_case["tt"], image_case
    args = (c["embeds"], c["positions"], c["mask"], c["deepstack"])
    ref.setup_cache(64)
    tt.setup_cache(64)
    got = assert_agrees(ref.prefill(*args), tt.prefill(*args), min_pcc=LOGITS_PCC, what="image prompt logits")
    record_figure("image prompt logits PCC", got.pcc)
    assert tt.rope_delta == ref.rope_delta < 0
    for token in (11, 12, 13):  # decode positions carry the prompt's rope delta
        assert_agrees(
            ref.decode(token), tt.decode(token), min_pcc=LOGITS_PCC, what=f"decode logits of {token}"
        )
