"""The vision tower on a Blackhole p150 against the torch reference (marked `blackhole`), and the same checks
at the `accuracy` recipe in the ttnn golden mode (marked `golden`, `alpamayo.tt.golden`).

Cases: the demo checkpoint (16-wide heads padded to 32 lanes), a tower with the real models' 72-wide heads
(padded to 128) and an MLP width off the tile grid, both presets, and, with `ALPAMAYO_TT_CHECKPOINT` set, a
real Qwen3-VL checkpoint (recipe `ALPAMAYO_TT_RECIPE`). The reference is `vision.encoder.VisionEncoder` on
the recipe-rounded weights (`QuantizedCheckpoint`; float32 for the tiny towers, bfloat16 for the real one),
so the thresholds measure the device implementation:

  * every block, fed the reference's own input: PCC >= 0.99;
  * the whole tower (image embeddings and every DeepStack level) on three images of two sizes, one of them two
    frames long: PCC >= 0.95;
  * no image attends to another: an image encoded alone gives its features among others (PCC >= 0.999; the
    attention chunks fall differently, so not bit for bit).
"""

from __future__ import annotations

import os

import pytest
import torch

from alpamayo.numerics import assert_agrees
from alpamayo.tt.quantized import QuantizedCheckpoint
from tests.tt_checkpoints import REAL_ENV, VISION_72, real_recipe, save_tt_checkpoint
from tests.tt_modes import case_device, device_cases
from tests.tt_vision_seams import vision_block
from vision.encoder import VisionEncoder, frame_segments
from vision.positions import patch_rows_cols, rotary_cos_sin

TRACE_REGION = 16 << 20  # the `device` fixture's (tests/conftest.py)

BLOCK_PCC, TOWER_PCC, ALONE_PCC = 0.99, 0.95, 0.999
GRID = torch.tensor([[1, 20, 36], [2, 8, 12], [1, 20, 36]])  # a 320x576 frame, a 2-frame clip, another frame
CASES = [f"{name}-{recipe}" for name in ("demo", "heads72") for recipe in ("accuracy", "performance")] + [
    "real"
]


@pytest.fixture(scope="module", params=device_cases(CASES))
def case(request, demo_checkpoint, tmp_path_factory):
    from alpamayo.tt.vision import TTVisionEncoder

    param, device = case_device(request)
    if param == "real":
        path = os.environ.get(REAL_ENV)
        if not path:
            pytest.skip(f"set {REAL_ENV} to a Qwen3-VL checkpoint directory to run the real-checkpoint tests")
        recipe, dtype = real_recipe(), torch.bfloat16
    else:
        name, recipe = param.split("-")
        dtype = torch.float32
        path = demo_checkpoint
        if name == "heads72":
            path = tmp_path_factory.mktemp(param)
            save_tt_checkpoint(path, "gqa2", seed=13, vision=VISION_72)
    rounded = QuantizedCheckpoint(path, recipe)
    ref = VisionEncoder.from_checkpoint(rounded, rounded.config, dtype)
    tt = TTVisionEncoder.from_checkpoint(path, precision=recipe, device=device)
    yield ref, tt
    tt.close()


def _pixels(grid: torch.Tensor, patch_dim: int, seed: int = 0) -> torch.Tensor:
    n = int(grid.prod(-1).sum())
    return (
        torch.rand(n, patch_dim, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    )  # normalised pixels


def test_every_block_matches_the_reference(case, record_figure):
    ref, tt = case
    v = ref.cfg
    rows, cols = patch_rows_cols(GRID, v.spatial_merge_size)
    cos, sin = rotary_cos_sin(rows, cols, v.head_dim, v.rope_theta)
    x = torch.randn(rows.numel(), v.hidden_size, generator=torch.Generator().manual_seed(1)).to(ref.dtype)
    worst = 1.0
    for j, block in enumerate(ref.blocks):
        with torch.inference_mode():
            expected = block(x, cos, sin, frame_segments(GRID))
        p = assert_agrees(expected, vision_block(tt, j, x, GRID), min_pcc=BLOCK_PCC, what=f"vision block {j}")
        worst = min(worst, p.pcc)
        x = expected
    record_figure("vision block worst PCC", worst)


def test_the_whole_tower_matches_the_reference(case, record_figure):
    ref, tt = case
    pixels = _pixels(GRID, ref.cfg.patch_dim)
    embeds, deepstack = ref.encode(pixels.to(ref.dtype), GRID)
    got, got_deepstack = tt.encode(pixels, GRID)
    assert got.shape == embeds.shape and len(got_deepstack) == len(deepstack)
    figures = [assert_agrees(embeds, got, min_pcc=TOWER_PCC, what="vision tower embeds")] + [
        assert_agrees(a, b, min_pcc=TOWER_PCC, what=f"DeepStack level {n}")
        for n, (a, b) in enumerate(zip(deepstack, got_deepstack, strict=True))
    ]
    record_figure("vision tower embeds PCC", figures[0].pcc)
    record_figure("vision tower worst DeepStack PCC", min(f.pcc for f in figures[1:]))
    record_figure("vision tower embeds max abs error", figures[0].max_abs)


def test_an_image_alone_gets_the_features_it_gets_among_others(case, record_figure):
    _, tt = case
    pixels = _pixels(GRID, tt.cfg.patch_dim, seed=2)
    together, _ = tt.encode(pixels, GRID)
    first = int(GRID[0].prod())
    alone, _ = tt.encode(pixels[:first], GRID[:1])
    p = assert_agrees(
        together[: alone.shape[0]], alone, min_pcc=ALONE_PCC, what="an image alone vs among others"
    )
    record_figure("image alone vs among others PCC", p.pcc)
