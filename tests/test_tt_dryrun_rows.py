"""The ttnn multi-row decode program through ttnn's host-side checks on the dry run's mock p150 (marked
`dryrun`; see `alpamayo.tt.dryrun`). No numbers are checked: the mock runs no kernels and reads back zeros.

Up to 32 rows (one tile) run as one program, each at its own cache index: K samples as rows of one batch
(each its own cache slot, forked from the prompt's on the device, ragged after a rollback) and a verify block
of T tokens of one sequence (the rows share its slot). Cases: the tiny GQA 2:1 and 8:1 tied-head checkpoints,
the demo checkpoint (32-wide heads, padded residual) and the published 8B config with two layers.
"""

from __future__ import annotations

import pytest
import torch

from alpamayo.tt.dryrun.graph import Capture
from tests.tt_checkpoints import save_tt_checkpoint

pytestmark = pytest.mark.dryrun

CASES = ["gqa2/performance", "gqa8-tied/accuracy", "demo/performance", "qwen3-vl-8b/performance"]
PROMPT_LEN, MAX_SEQ_LEN, SLOTS = 126, 256, 6


@pytest.fixture(scope="module", params=CASES)
def model(request, dryrun_device, demo_checkpoint, tmp_path_factory):
    from alpamayo.tt.dryrun.models import cut_config, text_model
    from alpamayo.tt.text import TTTextModel

    name, recipe = request.param.split("/")
    if name.startswith("qwen3"):
        tt = text_model(cut_config(name, 2), recipe, dryrun_device)
    else:
        path = demo_checkpoint if name == "demo" else tmp_path_factory.mktemp(name)
        if name != "demo":
            save_tt_checkpoint(path, name, seed=3)
        tt = TTTextModel.from_checkpoint(path, precision=recipe, device=dryrun_device)
    tt.setup_cache(MAX_SEQ_LEN, max_batch=SLOTS)
    yield tt
    tt.close()


def prompt(tt) -> torch.Tensor:
    return torch.arange(PROMPT_LEN) % min(tt.text_cfg.vocab_size, 256)


def test_k_rows_fork_the_prompt_and_decode_ragged_in_one_program(model):
    t, vocab = model.text_cfg, model.text_cfg.vocab_size
    for k, v in model.kv_cache:
        assert k.shape[0] == v.shape[0] == SLOTS
    model.prefill(prompt(model))
    model.fork(SLOTS)
    assert model.lengths == [PROMPT_LEN] * SLOTS
    logits = model.decode(torch.arange(SLOTS))
    assert logits.shape == (SLOTS, vocab) and logits.dtype == torch.float32
    ragged = [PROMPT_LEN + 1, PROMPT_LEN, PROMPT_LEN + 1, PROMPT_LEN - 3, PROMPT_LEN + 1, 1]
    model.rollback(ragged)
    for step in range(3):  # rows cross the tile at 128 at different steps
        logits = model.decode(torch.arange(SLOTS) + step)
        assert logits.shape == (SLOTS, vocab)
    assert model.lengths == [n + 3 for n in ragged]
    assert model.cache_len == max(ragged) + 3
    with pytest.raises(ValueError, match="2 token"):
        model.decode(torch.tensor([1, 2]))
    assert t.num_hidden_layers == len(model.kv_cache)


def test_a_k_row_step_copies_nothing_and_runs_the_one_row_programs(model):
    ttnn = model.ttnn
    counts = {}
    for slots in (1, SLOTS):
        model.setup_cache(MAX_SEQ_LEN, max_batch=slots)
        model.prefill(prompt(model))
        model.fork(slots)
        inputs = model._write_inputs(model._decode_host_inputs(list(range(slots)), model.lengths))
        with Capture(ttnn) as step:
            out = model._decode_graph(inputs)
        assert step.host_transfers() == []
        assert tuple(out.shape) == (1, 1, slots, model.plan.head.n_padded)
        model._free(out)
        counts[slots] = step.programs()
    assert counts[SLOTS] == counts[1]  # more rows of the same tile: the same programs
    model.prefill(prompt(model))  # one active row of SLOTS slots: the idle ones run along, unread
    assert model.decode(3).shape == (model.text_cfg.vocab_size,)


@pytest.mark.parametrize("block", [2, 8, 32])
def test_verify_runs_a_block_on_one_slot_and_rolls_back(model, block):
    ttnn, vocab = model.ttnn, model.text_cfg.vocab_size
    model.setup_cache(MAX_SEQ_LEN, max_batch=1)  # the block's rows share the one slot
    model.prefill(prompt(model))
    tokens = torch.arange(block)[None] % vocab
    logits = model.verify(tokens)
    assert logits.shape == (1, block, vocab) and logits.dtype == torch.float32
    assert model.lengths == [PROMPT_LEN + block]
    model.rollback([PROMPT_LEN + 1])
    inputs = model._write_inputs(
        model._decode_host_inputs(
            tokens[0].tolist(), list(range(PROMPT_LEN + 1, PROMPT_LEN + 1 + block)), shared=True
        )
    )
    with Capture(ttnn) as step:
        out = model._decode_graph(inputs)
    assert step.host_transfers() == []
    assert tuple(out.shape) == (1, 1, block, model.plan.head.n_padded)
    model._free(out)
    assert model.verify(tokens[:, :1]).shape == (1, 1, vocab)  # T = 1 is a decode step
    model.setup_cache(MAX_SEQ_LEN, max_batch=SLOTS)


def test_what_the_program_cannot_run_is_refused_before_the_device(model):
    model.prefill(prompt(model))
    model.fork(2)
    with pytest.raises(ValueError, match=f"verify of 4 tokens with {SLOTS} cache slots"):
        model.verify(torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"row 1 length 200 must be in \[1, 126\]"):
        model.rollback([126, 200])
    with pytest.raises(ValueError, match=f"fork\\({SLOTS + 1}\\)"):
        model.prefill(prompt(model))
        model.fork(SLOTS + 1)
    model.setup_cache(MAX_SEQ_LEN, max_batch=1)
    model.prefill(prompt(model))
    with pytest.raises(ValueError, match=r"1\.\.32 rows"):
        model.verify(torch.zeros(1, 33, dtype=torch.long))
    model.cache_len = MAX_SEQ_LEN - 4  # as after generating up to there
    with pytest.raises(RuntimeError, match="KV cache full"):
        model.verify(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"max_batch must be in 1\.\.32"):
        model.setup_cache(MAX_SEQ_LEN, max_batch=33)
    with pytest.raises(ValueError, match="action expert reads one sequence"):
        model.setup_cache(MAX_SEQ_LEN, max_batch=2, reserve_rows=128)
    model.setup_cache(MAX_SEQ_LEN, max_batch=SLOTS)


def test_moe_layers_refuse_more_than_one_row(dryrun_device, tmp_path):
    from alpamayo.tt.text import TTTextModel

    save_tt_checkpoint(tmp_path, "moe", seed=3)
    with TTTextModel.from_checkpoint(tmp_path, precision="performance", device=dryrun_device) as tt:
        tt.setup_cache(MAX_SEQ_LEN, max_batch=2)
        tt.prefill(prompt(tt))
        tt.fork(2)
        with pytest.raises(ValueError, match="2 decode rows with MoE layers"):
            tt.decode(torch.tensor([1, 2]))


def test_verify_and_prefill_leave_the_captured_layers_a_draft_reads(model):
    t = model.text_cfg
    layers = sorted({0, t.num_hidden_layers - 1})
    model.setup_cache(MAX_SEQ_LEN, max_batch=1)
    model.prefill_hidden(prompt(model), capture=layers)
    assert [tuple(c.shape) for c in model.captured] == [(PROMPT_LEN, t.hidden_size)] * len(layers)
    ttnn = model.ttnn
    inputs = model._write_inputs(model._decode_host_inputs([1, 2, 3], [126, 127, 128], shared=True))
    with Capture(ttnn) as step:
        outs = model._decode_graph(inputs, layers)
    assert step.host_transfers() == []  # the captured layers stay on the device inside the step
    model._free(*outs)
    logits, feats = model.verify(torch.tensor([[1, 2, 3]]), capture=layers)
    assert logits.shape == (1, 3, t.vocab_size)
    assert feats.shape == (1, 3, len(layers) * t.hidden_size) and feats.dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"verify takes ids \[1, T >= 1\], got shape \[3\]"):
        model.verify(torch.tensor([1, 2, 3]))
    model.setup_cache(MAX_SEQ_LEN, max_batch=SLOTS)
