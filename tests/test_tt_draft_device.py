"""The ttnn DFlash draft (`alpamayo.tt.draft`) on a Blackhole p150 against the torch `DFlashDraft` on the same
weights (marked `blackhole`).

The target is a tiny dense checkpoint on the device; the reference is the torch target and torch draft on the
recipe-rounded weights (`alpamayo.tt.quantized.rounded`, float32), so the figures measure the device
program. Both drafts read the same context features (the torch target's captured layers, then random
accepted positions per row, ragged and crossing a tile), so only the draft's device layers, cache and the
target's device lm_head are compared: block logits PCC per row and position, and the accepted length of a
greedy step against a continuation corrupted at a known position (the torch draft's own tokens), which the
device draft must accept to the same length. Traced and untraced, K = 1 and K = 3 rows.
"""

from __future__ import annotations

import pytest
import torch

from alpamayo.checkpoint import Checkpoint
from alpamayo.drafts import DraftContext
from alpamayo.drafts.dflash import DFlashDraft, read_config
from alpamayo.numerics import assert_agrees
from alpamayo.plan.draft_weights import draft_weight_specs
from alpamayo.plan.precision import load_precision
from alpamayo.tt.quantized import rounded
from tests.dflash_checkpoints import dflash_config, save_dflash, target_heads
from tests.tt_checkpoints import reference_and_device, save_tt_checkpoint
from tests.tt_modes import card_only, case_device, device_cases

CASES = ["gqa2-accuracy", "gqa2-performance"]
LOGITS_PCC = 0.97  # as the target's decode logits (test_tt_text_device.py)
PROMPT_LEN, MAX_SEQ_LEN, BLOCK = 45, 256, 8


@pytest.fixture(scope="module", params=device_cases(CASES))
def drafts(request, tmp_path_factory):
    from alpamayo.tt.draft import TTDFlashDraft

    param, device = case_device(request)
    name, recipe = param.rsplit("-", 1)
    path = tmp_path_factory.mktemp(param)
    save_tt_checkpoint(path, name, seed=17)
    precision = load_precision(recipe)
    ref, tt = reference_and_device(path, precision, device)
    draft_dir = path / "draft"
    t = ref.text_cfg
    save_dflash(draft_dir, dflash_config(t, block_size=BLOCK, target_layer_ids=[0, 1], **target_heads(t)))
    cfg, ckpt = read_config(draft_dir), Checkpoint(draft_dir)
    served: dict[str, torch.Tensor] = {}
    for spec in draft_weight_specs(cfg):
        served |= rounded(spec, ckpt.get, precision)
    torch_draft = DFlashDraft(cfg, lambda name: served[name].float(), ref)
    tt_draft = TTDFlashDraft.load(draft_dir, tt)
    yield ref, tt, torch_draft, tt_draft
    tt_draft.close()
    tt.close()


def begin(ref, tt, torch_draft, tt_draft, rows):
    prompt = torch.randint(0, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(7))
    ref.setup_cache(MAX_SEQ_LEN, rows)
    ref.prefill(prompt, capture=torch_draft.capture)
    feats = torch.cat(ref.captured, -1)
    tt.setup_cache(MAX_SEQ_LEN, max_batch=rows)
    for d in (torch_draft, tt_draft):
        d.begin(DraftContext(prompt.tolist(), rows, None, feats))
    return feats.shape[1]


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("rows", [1, 3])
def test_block_logits_match_the_torch_draft_on_ragged_rows(drafts, rows, traced, record_figure):
    ref, tt, torch_draft, tt_draft = drafts
    if traced:
        card_only(tt, "the traced draft block")
    width = begin(ref, tt, torch_draft, tt_draft, rows)
    g = torch.Generator().manual_seed(3)
    worst = 1.0
    for kept in ([3, 1, 8], [8, 8, 2], [7, 2, 5]):  # row 0 crosses the tile at 64
        anchors = torch.randint(0, 256, (rows,), generator=g).tolist()
        expected = torch_draft.block_logits(anchors)
        got = tt_draft.block_logits(anchors, traced=traced)
        pairs = enumerate(zip(expected.flatten(0, 1), got.flatten(0, 1), strict=True))
        worst = min(
            worst,
            *(
                assert_agrees(e, x, min_pcc=LOGITS_PCC, what=f"block logits {j} of kept {kept}").pcc
                for j, (e, x) in pairs
            ),
        )
        for r in range(rows):
            feats = torch.randn(kept[r], width, generator=g)
            for d in (torch_draft, tt_draft):
                d.accepted(r, [0] * kept[r], feats)
    assert tt_draft.lengths == torch_draft.lengths
    record_figure(f"DFlash draft K={rows}: worst block logits PCC (traced={traced})", worst)
    assert worst >= LOGITS_PCC


@pytest.mark.parametrize("wrong_at", [1, 4, BLOCK])
def test_a_greedy_step_accepts_the_torch_draft_length(drafts, wrong_at):
    """The continuation is the torch draft's own block, corrupted at `wrong_at`: the torch draft's proposal
    is accepted up to there by construction, and so must the device draft's be."""
    ref, tt, torch_draft, tt_draft = drafts
    begin(ref, tt, torch_draft, tt_draft, 1)
    (own,) = torch_draft.propose([[42]], [BLOCK - 1])
    truth = [(t + 1) % 256 if j + 1 >= wrong_at else t for j, t in enumerate(own)]

    def accepted(proposal: list[int]) -> int:
        n = 1
        while n < BLOCK and proposal[n - 1] == truth[n - 1]:
            n += 1
        return n

    assert accepted(own) == wrong_at
    (device,) = tt_draft.propose([[42]], [BLOCK - 1])
    assert accepted(device) == wrong_at


@pytest.mark.parametrize("rows", [1, 3])
def test_the_prompt_read_on_the_device_equals_the_downloaded_features(drafts, rows):
    """`begin` from the target's device features (in place: the runtime's way) and from their downloaded
    host copy put the same bf16 values through the same program: the block logits are identical."""
    _, tt, _, tt_draft = drafts
    prompt = torch.randint(0, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(9))
    tt.setup_cache(MAX_SEQ_LEN, max_batch=rows)
    tt.prefill(prompt, capture=tt_draft.capture)
    if rows > 1:
        tt.fork(rows)
    out = []
    for features in (None, torch.cat(tt.captured, -1)):
        tt_draft.begin(DraftContext(prompt.tolist(), rows, None, features))
        out.append(tt_draft.block_logits(list(range(rows)), traced=False))
    assert torch.equal(out[0], out[1])
