"""The ttnn DFlash draft (`alpamayo.tt.draft`) through ttnn's host-side checks on the dry run's mock p150
(marked `dryrun`; see `alpamayo.tt.dryrun`). No numbers are checked: the mock runs no kernels and reads back
zeros (the numerics are `tests/test_tt_draft_device.py`'s, on a card).

The demo checkpoint's and the gqa2 checkpoint's (head_dim 128) text backbones, each with a random 2-layer draft in z-lab's layout: the prompt's context and
ragged appends (crossing a tile), the block program for 1 and 3 rows with no host transfer inside it, and a
draft the device cannot run refused before any weight is read."""

from __future__ import annotations

import json

import pytest
import torch

from alpamayo.drafts import DraftContext
from alpamayo.drafts.dflash import DraftConfigError
from alpamayo.tt.dryrun.graph import Capture
from tests.dflash_checkpoints import dflash_config, save_dflash
from tests.tt_checkpoints import save_tt_checkpoint

pytestmark = pytest.mark.dryrun
PROMPT_LEN, MAX_SEQ_LEN = 45, 128


@pytest.fixture(scope="module", params=["demo", "gqa2"])
def text(request, dryrun_device, demo_checkpoint, tmp_path_factory):
    from alpamayo.tt.text import TTTextModel

    path = demo_checkpoint
    if request.param != "demo":
        path = tmp_path_factory.mktemp(request.param)
        save_tt_checkpoint(path, request.param, seed=3)
    tt = TTTextModel.from_checkpoint(path, precision="performance", device=dryrun_device)
    yield tt
    tt.close()


@pytest.fixture(scope="module")
def draft(text, tmp_path_factory):
    from alpamayo.tt.draft import TTDFlashDraft

    t = text.text_cfg
    path = tmp_path_factory.mktemp("draft")
    attention = dict(num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads)
    cfg = dflash_config(t, block_size=8, target_layer_ids=[0, 1], head_dim=t.head_dim, **attention)
    save_dflash(path, cfg)
    d = TTDFlashDraft.load(path, text)
    yield d
    d.close()


def prefill(text, draft, rows):
    text.setup_cache(MAX_SEQ_LEN, max_batch=rows)
    text.prefill(torch.arange(PROMPT_LEN) % 300, capture=draft.capture)
    if rows > 1:
        text.fork(rows)


@pytest.mark.parametrize("source", ["device", "host"])
@pytest.mark.parametrize("rows", [1, 3])
def test_the_block_program_drafts_every_row_after_its_ragged_context(text, draft, rows, source):
    """The prompt's context from the target's device features (the runtime's way) or from host features."""
    prefill(text, draft, rows)
    width = 2 * text.text_cfg.hidden_size
    feats = torch.cat(text.captured, -1) if source == "host" else None
    draft.begin(DraftContext(list(range(PROMPT_LEN)), rows, None, feats))
    assert draft.lengths == [PROMPT_LEN] * rows
    for kept in ([3, 1, 8][:rows], [8, 8, 2][:rows]):  # row 0 crosses the tile at 64
        out = draft.propose([[5]] * rows, [7] * rows)
        assert [len(d) for d in out] == [7] * rows
        for r, n in enumerate(kept):
            draft.accepted(r, [0] * n, torch.randn(n, width).to(torch.bfloat16))
    assert draft.lengths == [PROMPT_LEN + a + b for a, b in zip([3, 1, 8], [8, 8, 2], strict=False)][:rows]
    assert [t.shape[0] for t in draft.tails] == [n % 32 for n in draft.lengths]
    logits = draft.block_logits(list(range(rows)))
    assert logits.shape == (rows, 7, text.text_cfg.vocab_size) and logits.dtype == torch.float32
    assert draft.propose([[5]] * rows, [0] * rows) == [[]] * rows


def test_the_prompts_features_stay_on_the_device(text, draft):
    """The draft reads the prefill's captured layers in place: the only download is the last partial tile
    (45 = 32 + 13 rows), which the host keeps for the appends; the target never builds its host view."""
    prefill(text, draft, 2)
    with Capture(text.ttnn) as begin:
        draft.begin(DraftContext(list(range(PROMPT_LEN)), 2, None, None))
    assert [f for f in begin.host_transfers() if f == "ttnn.to_torch"] == ["ttnn.to_torch"]
    assert text.prefiller._captured_host is None
    assert [t.shape for t in draft.tails] == [(PROMPT_LEN - 32, 2 * text.text_cfg.hidden_size)] * 2
    assert draft.lengths == [PROMPT_LEN] * 2


def test_the_block_step_moves_no_feature_between_host_and_device(text, draft):
    """Inside the block program (what a trace replays) nothing crosses to the host: its inputs are rewritten
    before it, the logits read after it."""
    prefill(text, draft, 2)
    draft.begin(DraftContext(list(range(PROMPT_LEN)), 2, None, None))
    state = draft._setup()
    with Capture(text.ttnn) as step:
        out = draft._block_graph(state)
    assert step.host_transfers() == []
    assert len(out) == state.slots and tuple(out[0].shape)[-2] == draft.block_size
    draft.free(*out)


def test_a_draft_the_device_cannot_run_is_refused_before_any_weight_is_read(text, tmp_path):
    from alpamayo.tt.draft import TTDFlashDraft

    t = text.text_cfg
    cfg = dflash_config(t, num_key_value_heads=1, head_dim=t.head_dim)
    save_dflash(tmp_path, cfg)
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")  # reading a weight would fail
    with pytest.raises(
        DraftConfigError,
        match=rf"needs the target's K/V heads and head_dim \(2 x {t.head_dim}\), got 1 x {t.head_dim}",
    ):
        TTDFlashDraft.load(tmp_path, text)
    cfg = dflash_config(text.text_cfg, target_layer_ids=[0, 9])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        DraftConfigError,
        match=rf"target_layer_ids \[9\] beyond the target's layers \[0, {t.num_hidden_layers}\)",
    ):
        TTDFlashDraft.load(tmp_path, text)
