"""The ttnn vision tower and the image prompt it feeds (prefill with image rows and DeepStack) through ttnn's
host-side checks on the dry run's mock p150 (marked `dryrun`; see `alpamayo.tt.dryrun`).

Cases, both recipes each: the demo checkpoint (16-wide vision heads padded to 32 lanes) and a tiny tower with
the real 72-wide heads, uploaded from safetensors; the published 2B (64-wide heads), 8B, 32B and 30B-A3B
configs with two text layers and two vision blocks, weights allocated uninitialised. Each encodes a 320x576
frame and a two-frame clip, then prefills the chat-shaped prompt holding their tokens with M-RoPE positions
and every DeepStack level, and decodes one token.
"""

from __future__ import annotations

import pytest
import torch

from alpamayo.positions import mrope_position_ids
from tests.tt_checkpoints import VISION_72, save_tt_checkpoint

pytestmark = pytest.mark.dryrun

RECIPES = ("accuracy", "performance")
REAL = ("qwen3-vl-2b", "qwen3-vl-8b", "qwen3-vl-32b", "qwen3-vl-30b-a3b")
CASES = [f"{name}/{recipe}" for name in ("demo", "heads72", *REAL) for recipe in RECIPES]
GRID = torch.tensor([[1, 20, 36], [2, 8, 12]])  # a 320x576 frame and a 2-frame 128x192 clip, in patches


@pytest.fixture(scope="module", params=CASES)
def models(request, dryrun_device, demo_checkpoint, tmp_path_factory):
    from alpamayo.tt.dryrun.models import cut_config, text_model, vision_encoder
    from alpamayo.tt.text import TTTextModel
    from alpamayo.tt.vision import TTVisionEncoder

    name, recipe = request.param.split("/")
    if name in REAL:
        cfg = cut_config(name, layers=2, vision_depth=2)
        text, vision = text_model(cfg, recipe, dryrun_device), vision_encoder(cfg, recipe, dryrun_device)
    else:
        path = demo_checkpoint
        if name == "heads72":
            path = tmp_path_factory.mktemp(name)
            save_tt_checkpoint(path, "gqa2", seed=5, vision=VISION_72)
        text = TTTextModel.from_checkpoint(path, precision=recipe, device=dryrun_device)
        vision = TTVisionEncoder.from_checkpoint(path, precision=recipe, device=dryrun_device)
    text.setup_cache(1024)
    yield text, vision
    vision.close()
    text.close()


def test_images_encode_and_prefill_with_deepstack(models):
    text, vision = models
    cfg, v = text.cfg, vision.cfg
    patches = int(GRID.prod(-1).sum())
    embeds, deepstack = vision.encode(torch.randn(patches, v.patch_dim), GRID)
    tokens = patches // v.spatial_merge_size**2
    assert embeds.shape == (tokens, v.out_hidden_size) and embeds.dtype == torch.bfloat16
    assert len(deepstack) == len(v.deepstack_visual_indexes)
    assert all(d.shape == embeds.shape and d.dtype == torch.bfloat16 for d in deepstack)

    ids = torch.cat([torch.arange(5), torch.full((tokens,), cfg.image_token_id), torch.arange(7)])
    positions, _ = mrope_position_ids(ids, GRID, cfg)
    mask = ids == cfg.image_token_id
    hidden = text.embed(torch.where(mask, 0, ids))
    hidden[mask] = embeds
    logits = text.prefill(hidden, positions, mask, deepstack)
    assert logits.shape == (cfg.text.vocab_size,) and logits.dtype == torch.float32
    assert text.decode(1, traced=False).shape == (cfg.text.vocab_size,)
