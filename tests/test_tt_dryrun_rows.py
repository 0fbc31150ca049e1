"""The ttnn multi-row decode program through ttnn's host-side checks on the dry run's mock p150 (marked
`dryrun`; see `alpamayo.tt.dryrun`). No numbers are checked: the mock runs no kernels and reads back zeros.

Up to 32 rows (one tile) run as one program, each at its own cache index: K samples as rows of one batch
(each its own cache slot, forked from the prompt's on the device, ragged after a rollback) and verify blocks
of T tokens per row (row b's T program rows share its slot through a page table), B x T <= 32; a block's
attention reads each slot's K/V once per 8 of its rows where one position's heads fit a tile, once per row
otherwise (64 heads). Cases: the tiny GQA 2:1 and 8:1 tied-head checkpoints, the demo checkpoint (32-wide
heads, padded residual) and the published 8B config with two layers.
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
        inputs = model.decoder.write_inputs(model.decoder.host_inputs(list(range(slots)), model.lengths))
        with Capture(ttnn) as step:
            out = model.decoder.graph(model.cache, inputs)
        assert step.host_transfers() == []
        assert tuple(out.shape) == (1, 1, slots, model.plan.head.n_padded)
        model.kernels.free(out)
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
    inputs = model.decoder.write_inputs(
        model.decoder.host_inputs(
            tokens[0].tolist(), list(range(PROMPT_LEN + 1, PROMPT_LEN + 1 + block)), [0] * block
        )
    )
    with Capture(ttnn) as step:
        out = model.decoder.graph(model.cache, inputs)
    assert step.host_transfers() == []
    assert tuple(out.shape) == (1, 1, block, model.plan.head.n_padded)
    model.kernels.free(out)
    assert model.verify(tokens[:, :1]).shape == (1, 1, vocab)  # T = 1 is a decode step
    model.setup_cache(MAX_SEQ_LEN, max_batch=SLOTS)


@pytest.mark.parametrize("rows, block", [(2, 4), (3, 8), (3, 10), (SLOTS, 5)])
def test_verify_runs_a_block_per_row_on_its_own_slot_ragged(model, rows, block):
    """K ragged rows verify T tokens each in one program of K x T rows; row b's block reads and writes slot b
    (the page table maps its T program rows there), then each row rolls back to its own accepted prefix."""
    ttnn, vocab = model.ttnn, model.text_cfg.vocab_size
    model.prefill(prompt(model))
    model.fork(rows)
    model.rollback([PROMPT_LEN - b for b in range(rows)])  # ragged, as after earlier blocks
    before = list(model.lengths)
    tokens = (torch.arange(rows * block).reshape(rows, block) * 7) % vocab
    logits = model.verify(tokens)
    assert logits.shape == (rows, block, vocab) and logits.dtype == torch.float32
    assert model.lengths == [n + block for n in before]
    kept = [n + 1 + b % block for b, n in enumerate(before)]
    model.rollback(kept)
    assert model.lengths == kept
    from alpamayo.tt.text.decode_inputs import program_rows

    pad = program_rows(rows * block) - rows * block  # what verify pads with: the last row again
    positions = [n + j for n in kept for j in range(block)] + [kept[-1] + block - 1] * pad
    pages = [b for b in range(rows) for _ in range(block)] + [rows - 1] * pad
    ids = tokens.reshape(-1).tolist() + [int(tokens[-1, -1])] * pad
    inputs = model.decoder.write_inputs(model.decoder.host_inputs(ids, positions, pages))
    with Capture(ttnn) as step:
        out = model.decoder.graph(model.cache, inputs)
    assert step.host_transfers() == []
    assert tuple(out.shape) == (1, 1, rows * block + pad, model.plan.head.n_padded)
    model.kernels.free(out)


SDPA_OP = "ttnn.transformer.paged_scaled_dot_product_attention_decode"


def verify_layout(lengths: list[int], block: int) -> tuple[list[int], list[int]]:
    """(pages, positions) of the program rows of a verify of `block` tokens per row at cache `lengths`, as
    `TTTextModel.verify` lays them out: row b's tokens on slot b, then the padding rows to `program_rows`
    (copies of the last row)."""
    from alpamayo.tt.text.decode_inputs import program_rows

    rows = len(lengths)
    pad = program_rows(rows * block) - rows * block
    pages = [b for b in range(rows) for _ in range(block)] + [rows - 1] * pad
    positions = [n + j for n in lengths for j in range(block)] + [lengths[-1] + block - 1] * pad
    return pages, positions


@pytest.mark.parametrize("lengths, block", [([126], 8), ([126], 32), ([126, 120, 97], 10), ([30, 31], 4)])
def test_a_verify_writes_each_k_v_row_once_and_no_two_rows_of_a_pass_share_a_tile(lengths, block):
    """`paged_update_cache` runs its rows on separate cores at once, each rewriting its row's whole 32-row
    tile, so two rows of one call on one tile would race. Each pass writes at most one row per slot, every
    (slot, position) of the block exactly once, by its first row; the padding rows write nothing."""
    from alpamayo.tt.text.decode_inputs import kv_write_passes

    pages, positions = verify_layout(lengths, block)
    passes = kv_write_passes(pages, positions)
    assert len(passes) == block
    owners = {}
    for r, key in enumerate(zip(pages, positions, strict=True)):
        owners.setdefault(key, r)
    written = []
    for idxs in passes:
        active = [r for r, i in enumerate(idxs) if i != -1]
        assert all(idxs[r] == positions[r] for r in active)
        assert len({pages[r] for r in active}) == len(active)
        written += active
    assert sorted(written) == sorted(owners.values())
    tiles = [(p, pos // 32) for p, pos in zip(pages, positions, strict=True)]
    assert len(set(tiles)) < len(tiles)  # one call over these rows would write shared tiles


@pytest.mark.parametrize("rows, block", [(1, 8), (3, 10)])
def test_a_verify_layer_writes_k_and_v_in_its_passes(model, rows, block, monkeypatch):
    """Each layer of a verify program calls `paged_update_cache` once per pass for K and once for V, each
    with that pass's update indices and the page table; a decode step writes K and V once, at `pos`."""

    ttnn, t = model.ttnn, model.text_cfg
    model.prefill(prompt(model))
    model.fork(rows)
    pages, positions = verify_layout(list(model.lengths), block)
    values = model.decoder.host_inputs([1] * len(pages), positions, pages)
    inputs = model.decoder.write_inputs(values)
    calls, op = [], ttnn.experimental.paged_update_cache

    def recorded(cache, rows_in, update_idxs_tensor, page_table=None):
        calls.append((update_idxs_tensor, page_table))
        return op(cache, rows_in, update_idxs_tensor=update_idxs_tensor, page_table=page_table)

    monkeypatch.setattr(ttnn.experimental, "paged_update_cache", recorded)
    out = model.decoder.graph(model.cache, inputs)
    model.kernels.free(out)
    writes = inputs.kv_write
    assert len(writes) == block
    per_layer = [(w, inputs.page) for w in writes for _ in "kv"]
    assert [tuple(map(id, c)) for c in calls] == [tuple(map(id, c)) for c in per_layer] * t.num_hidden_layers
    calls.clear()
    idle = model.max_batch - rows  # a decode step runs every slot (idle ones at position 0)
    step = model.decoder.write_inputs(
        model.decoder.host_inputs([1] * model.max_batch, model.lengths + [0] * idle)
    )
    model.kernels.free(model.decoder.graph(model.cache, step))
    assert [tuple(map(id, c)) for c in calls] == [(id(step.pos), id(None))] * 2 * t.num_hidden_layers


@pytest.mark.parametrize("rows, block, calls", [(1, 8, 1), (3, 8, 3), (3, 10, 6), (1, 32, 4)])
def test_a_verify_block_attends_once_per_8_rows_of_each_slot(model, rows, block, calls, monkeypatch):
    """Where one position's heads fit a tile (every case here: up to 32 heads), each slot's T rows attend in
    calls of up to 8 (`block_chunks`), each reading that slot's K/V once (its n_kv heads are the users, pages
    slot x n_kv + 0..n_kv-1), not once per row: K = 3 ragged rows x 8 are 3 calls per layer; 3 x 10 (30 rows,
    padded to 32 with copies of the last row on the last slot) are 8 + 2, 8 + 2, 8 + 4. Every call runs on
    the device's whole grid (`TextPlan.block_sdpa_grid`), which its program factory accepts."""
    from alpamayo.tt.text.decode_inputs import block_chunks, program_rows

    ttnn, t, vocab = model.ttnn, model.text_cfg, model.text_cfg.vocab_size
    assert model.decoder.programs.block_sdpa
    model.prefill(prompt(model))
    model.fork(rows)
    model.rollback([PROMPT_LEN - 2 * b for b in range(rows)])  # ragged
    before = list(model.lengths)
    tokens = (torch.arange(rows * block).reshape(rows, block) * 5) % vocab
    assert model.verify(tokens).shape == (rows, block, vocab)
    assert model.verify(tokens[:, :1]).shape == (rows, 1, vocab)  # T = 1: the per-slot decode step
    model.rollback(before)
    pad = program_rows(rows * block) - rows * block
    positions = [n + j for n in before for j in range(block)] + [before[-1] + block - 1] * pad
    pages = [b for b in range(rows) for _ in range(block)] + [rows - 1] * pad
    chunks = block_chunks(pages)
    assert len(chunks) == calls and sum(n for _, n in chunks) == rows * block + pad
    values = model.decoder.host_inputs(tokens.reshape(-1).tolist() + [0] * pad, positions, pages)
    n_kv = t.num_key_value_heads
    for c, (first, n) in enumerate(chunks):
        assert values.kv_page[c].view(-1).tolist() == [pages[first] * n_kv + g for g in range(n_kv)]
        assert values.kv_pos[c].tolist() == positions[first : first + n] * n_kv
    assert values.key() == (rows * block + pad, True, tuple(n for _, n in chunks), block)
    inputs = model.decoder.write_inputs(values)
    grids, op = [], ttnn.transformer.paged_scaled_dot_product_attention_decode

    def recorded(*args, **kwargs):
        grid = kwargs["program_config"].compute_with_storage_grid_size
        grids.append((grid.x, grid.y))
        return op(*args, **kwargs)

    monkeypatch.setattr(ttnn.transformer, "paged_scaled_dot_product_attention_decode", recorded)
    with Capture(ttnn) as step:
        out = model.decoder.graph(model.cache, inputs)
    monkeypatch.undo()
    assert step.host_transfers() == []
    assert step.functions().count(SDPA_OP) == calls * t.num_hidden_layers
    whole = model.device.compute_with_storage_grid_size()
    assert grids == [(whole.x, whole.y)] * (calls * t.num_hidden_layers)
    assert tuple(out.shape) == (1, 1, rows * block + pad, model.plan.head.n_padded)
    model.kernels.free(out)


def test_a_verify_whose_heads_span_two_tiles_attends_per_row(dryrun_device):
    """64 query heads (Qwen3-VL-32B) fill two tiles per position, past the block attention: each row's
    paged flash-decode reads its slot's K/V (one call per layer for all rows)."""
    from alpamayo.tt.dryrun.models import cut_config, text_model

    with text_model(cut_config("qwen3-vl-32b", 1), "performance", dryrun_device) as tt:
        assert tt.text_cfg.num_attention_heads == 64 and not tt.decoder.programs.block_sdpa
        tt.setup_cache(MAX_SEQ_LEN, max_batch=2)
        tt.prefill(prompt(tt))
        tt.fork(2)
        pages = [0] * 4 + [1] * 4
        values = tt.decoder.host_inputs(list(range(8)), [PROMPT_LEN + j % 4 for j in range(8)], pages)
        assert len(values.kv_write) == 4 and values.page is not None  # 4 rows per slot
        assert not values.kv_pos and not values.kv_page and values.head_select is None
        inputs = tt.decoder.write_inputs(values)
        with Capture(tt.ttnn) as step:
            out = tt.decoder.graph(tt.cache, inputs)
        assert step.functions().count(SDPA_OP) == 1
        tt.kernels.free(out)
        assert tt.verify(torch.zeros(2, 4, dtype=torch.long)).shape == (2, 4, tt.text_cfg.vocab_size)


def test_nine_to_31_rows_run_as_the_next_multiple_of_8(model):
    """Flash-decode SDPA refuses 9..31 rows but multiples of 8 (`program_rows`): a cache of 9 slots has 16,
    and 9 active rows decode in the 16-row program (a verify's padding rows are tested above: 3 x 10)."""
    from alpamayo.tt.text.decode_inputs import program_rows

    assert [program_rows(n) for n in (1, 6, 8, 9, 16, 17, 30, 32)] == [1, 6, 8, 16, 16, 24, 32, 32]
    model.setup_cache(MAX_SEQ_LEN, max_batch=9)
    assert model.max_batch == 16 and model.kv_cache[0][0].shape[0] == 16
    model.prefill(prompt(model))
    model.fork(9)
    assert model.decode(torch.arange(9)).shape == (9, model.text_cfg.vocab_size)
    model.setup_cache(MAX_SEQ_LEN, max_batch=SLOTS)


def test_what_the_program_cannot_run_is_refused_before_the_device(model):
    model.prefill(prompt(model))
    model.fork(2)
    with pytest.raises(ValueError, match=r"verify of 2 row\(s\) x 17 tokens = 34 program rows.*T <= 16"):
        model.verify(torch.zeros(2, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"row 1 length 200 must be in \[1, 126\]"):
        model.rollback([126, 200])
    with pytest.raises(ValueError, match=f"fork\\({SLOTS + 1}\\)"):
        model.prefill(prompt(model))
        model.fork(SLOTS + 1)
    model.setup_cache(MAX_SEQ_LEN, max_batch=1)
    model.prefill(prompt(model))
    with pytest.raises(ValueError, match=r"1\.\.32 \(one tile\)"):
        model.verify(torch.zeros(1, 33, dtype=torch.long))
    model.cache_len = MAX_SEQ_LEN - 4  # as after generating up to there
    with pytest.raises(RuntimeError, match="KV cache full"):
        model.verify(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"max_batch must be in 1\.\.32"):
        model.setup_cache(MAX_SEQ_LEN, max_batch=33)
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
    inputs = model.decoder.write_inputs(model.decoder.host_inputs([1, 2, 3], [126, 127, 128], [0, 0, 0]))
    with Capture(ttnn) as step:
        outs = model.decoder.graph(model.cache, inputs, layers)
    assert step.host_transfers() == []  # the captured layers stay on the device inside the step
    model.kernels.free(*outs)
    logits, feats = model.verify(torch.tensor([[1, 2, 3]]), capture=layers)
    assert logits.shape == (1, 3, t.vocab_size)
    assert feats.shape == (1, 3, len(layers) * t.hidden_size) and feats.dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"verify takes ids \[1, T >= 1\], got shape \[3\]"):
        model.verify(torch.tensor([1, 2, 3]))
    model.setup_cache(MAX_SEQ_LEN, max_batch=SLOTS)
