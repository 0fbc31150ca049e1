"""The ttnn action expert under the dry run (mock p150, `alpamayo.tt.dryrun`): every device path of
`TTActionExpert` through ttnn's host-side checks at the tiny and the real Alpamayo 1.5 dimensions (layers cut),
and, from `ttnn.graph`, no host transfer inside the Euler step and none per prediction but the noise in and
the actions out. Reads return zeros on the mock, so nothing here checks numbers (tests/test_tt_expert_device.py
does, on a card)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from alpamayo.plan.precision import load_precision
from alpamayo.plan.programs.text import plan_text
from alpamayo.tt.dryrun.graph import Capture
from planner.plans import GeneratedPlan
from tests.tt_checkpoints import TT_TINY, tiny_config
from tests.tt_expert_cases import TINY_VLM, release_cut, save_expert_weights, tiny_expert

pytestmark = pytest.mark.dryrun
MAX_SEQ_LEN = 512
STEPS = 2  # the loop and the step's programs are what the dry run checks; ten steps only repeat them


def filled(text: Any, slots: int = 1, **reserve: int) -> Any:
    """`text` with a fresh cache of `slots` slots whose MAX_SEQ_LEN positions count as prefilled in every
    active row (on the mock whatever a prefill and a fork wrote reads back as zeros)."""
    text.setup_cache(MAX_SEQ_LEN, max_batch=slots, **reserve)
    text.lengths = [MAX_SEQ_LEN] * slots
    return text


def weightless_text(device: Any, cfg: Any, recipe: str) -> Any:
    """A `TTTextModel` without layer weights: the expert uses only its KV cache, plan, kernel configs and rope
    (on the mock whatever fills the cache reads back as zeros, so a prefill would add nothing here); its head
    is three one-tile placeholders, which `close()` frees."""
    from alpamayo.tt.device import ttnn_for
    from alpamayo.tt.text import TTTextModel
    from alpamayo.tt.text.weights import TextWeights

    ttnn = ttnn_for(device)
    precision = load_precision(recipe)
    embed = torch.zeros(1, cfg.text.hidden_size, dtype=torch.bfloat16)
    tile = [ttnn.Shape([1, 1, 32, 32]), ttnn.bfloat16, ttnn.TILE_LAYOUT, device, ttnn.DRAM_MEMORY_CONFIG]
    head = [ttnn.allocate_tensor_on_device(*tile) for _ in range(3)]
    return TTTextModel(cfg, precision, plan_text(cfg, precision), device, TextWeights([], *head), embed)


CASES = {
    "tiny-performance": (lambda: (tiny_config(TT_TINY[TINY_VLM], TINY_VLM), tiny_expert()), "performance"),
    "tiny-accuracy": (lambda: (tiny_config(TT_TINY[TINY_VLM], TINY_VLM), tiny_expert()), "accuracy"),
    "alpamayo-1.5-10b-1-layer": (lambda: release_cut(1), "performance"),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, dryrun_device, tmp_path_factory):
    from alpamayo.tt.expert import TTActionExpert

    build, recipe = CASES[request.param]
    cfg, expert_cfg = build()
    weights = save_expert_weights(tmp_path_factory.mktemp("expert"), expert_cfg)
    text = weightless_text(dryrun_device, cfg, recipe)
    expert = TTActionExpert.from_checkpoint(weights, text, expert_cfg)
    yield text, expert
    expert.close()
    text.close()


@pytest.mark.parametrize("samples", [1, 3, 6])
def test_untraced_sampling_runs_every_step_at_the_planned_shapes(case, samples):
    """K samples over K cache slots (the K decoded rows), each at its own offset: the attention is batched
    over the slots (their K/V heads its users), the action stream is one [1, 1, 64 K, 32]."""
    text, expert = case
    plan = expert.plan_for(MAX_SEQ_LEN, samples)
    assert text.reserved_rows == plan.region_rows == 64
    filled(text, samples)
    assert [tuple(k.shape)[0::2] for k, _ in text.kv_cache] == [(samples, plan.cache_rows)] * len(
        text.kv_cache
    )
    noise = torch.randn(samples, 64, 2, generator=torch.Generator().manual_seed(samples))
    offsets = [300 + 7 * b for b in range(samples)]  # ragged reasoning lengths
    actions = expert.sample(noise, offsets, rope_delta=-40, steps=STEPS, traced=False)
    assert actions.shape == (samples, 64, 2) and actions.dtype == torch.float32
    b = expert._state.buffers
    # the flash-decode's page table (a row per user) and causal bounds (one per user's query tile): int32
    # rows, row-major (the op's checks)
    users = samples * expert.cfg.text.num_key_value_heads
    assert list(b.page_table.shape) == [users, plan.pages]
    assert list(b.cur_pos.shape) == [users * plan.q_tiles]
    for table in (b.page_table, b.cur_pos):
        assert table.dtype == expert.ttnn.int32 and table.layout == expert.ttnn.ROW_MAJOR_LAYOUT
    assert list(b.cos.shape) == [1, 1, plan.rows, expert.cfg.text.head_dim]
    assert list(b.x.shape) == [1, 1, plan.rows, 32]


ATTENTION_OP = "paged_scaled_dot_product_attention_decode"


@pytest.mark.parametrize("samples", [1, 3])
def test_each_layer_attends_in_one_paged_flash_decode_over_the_whole_grid(case, samples, monkeypatch):
    """Every layer's attention is one paged flash-decode: slot s's K/V head g is user s x n_kv + g, its
    query the 64 action rows of that head's query heads as `q_tiles` tiles, the cache read in place as
    pages of 64 rows through the persistent page table and bounds, on the device's whole grid."""
    text, expert = case
    ttnn, t = expert.ttnn, expert.cfg.text
    plan = expert.plan_for(MAX_SEQ_LEN, samples)
    filled(text, samples)
    expert.sample(torch.zeros(samples, 64, 2), [200] * samples, rope_delta=0, steps=STEPS, traced=False)
    b, op, calls = expert._state.buffers, getattr(ttnn.transformer, ATTENTION_OP), []

    def recorded(q, k, v, page_table, **kwargs):
        grid = kwargs["program_config"].compute_with_storage_grid_size
        calls.append((tuple(q.shape), tuple(k.shape), page_table is b.page_table, kwargs, (grid.x, grid.y)))
        return op(q, k, v, page_table, **kwargs)

    monkeypatch.setattr(ttnn.transformer, ATTENTION_OP, recorded)
    with Capture(ttnn) as step:
        expert._euler_step(expert._state)
    monkeypatch.undo()
    assert step.host_transfers() == []
    users, whole = samples * t.num_key_value_heads, expert.device.compute_with_storage_grid_size()
    assert plan.q_tiles * 32 == 64 * t.num_attention_heads // t.num_key_value_heads
    assert len(calls) == t.num_hidden_layers
    for q, k, own_table, kwargs, grid in calls:
        assert q == (1, users, plan.q_tiles * 32, t.head_dim)
        assert k == (users * plan.pages, 1, 64, t.head_dim)
        assert own_table and kwargs["cur_pos_tensor"] is b.cur_pos
        assert kwargs["spec_multi_pos_tiles"] == plan.q_tiles
        assert grid == (whole.x, whole.y)


def test_fewer_samples_than_slots_run_the_slots_step_and_return_k_samples(case):
    """K = 2 active rows of a 3-slot cache: the step's state is sized for the 3 slots (as the decode runs idle
    slots) and 2 samples come back. Which rows they are cannot be seen on the mock (it reads back zeros):
    the card test tests/test_tt_expert_device.py compares each row with the torch expert."""
    text, expert = case
    filled(text, 3)
    text.lengths = [400, 350]  # two active rows
    actions = expert.sample(torch.zeros(2, 64, 2), [400, 350], rope_delta=0, steps=STEPS, traced=False)
    assert actions.shape == (2, 64, 2)
    assert expert._state.samples == 3 and list(expert._state.buffers.x.shape) == [1, 1, 192, 32]


def test_the_euler_step_moves_no_tensor_between_host_and_device_and_updates_x_in_place(case, record_figure):
    text, expert = case
    filled(text)
    expert.sample(torch.zeros(1, 64, 2), 200, rope_delta=0, steps=STEPS, traced=False)
    state = expert._state
    address = state.buffers.x.buffer_address()
    with Capture(expert.ttnn) as step:
        expert._euler_step(state)
    assert step.host_transfers() == []
    assert state.buffers.x.buffer_address() == address
    record_figure(
        f"device programs per Euler step ({expert.cfg.text.num_hidden_layers} layers)", step.programs()
    )


def test_a_prediction_moves_only_the_noise_in_and_the_actions_out(case):
    text, expert = case
    filled(text, 3)
    noise = torch.zeros(3, 64, 2)
    expert.sample(noise, [250, 240, 230], rope_delta=-10, steps=STEPS, traced=False)  # allocates the state
    with Capture(expert.ttnn) as prediction:
        expert.sample(noise, [260, 300, 255], rope_delta=-12, steps=STEPS, traced=False)
    with Capture(expert.ttnn) as noise_in:
        expert._write_noise(expert._state, noise)
    with Capture(expert.ttnn) as actions_out:
        expert._actions(expert._state, 3)
    assert noise_in.host_transfers() and actions_out.host_transfers()
    assert prediction.host_transfers() == noise_in.host_transfers() + actions_out.host_transfers()


def test_bad_predictions_are_refused_with_the_allowed_range(case):
    text, expert = case
    filled(text, reserve_rows=0)  # no rows for the expert's K/V
    with pytest.raises(RuntimeError, match=r"call text.setup_cache\(512, reserve_rows=64\)"):
        expert.sample(torch.zeros(1, 64, 2), 100, rope_delta=0, steps=STEPS, traced=False)
    filled(text, 2)
    text.lengths = [512, 300]
    with pytest.raises(ValueError, match=r"row 1: offset 400 must be in \[1, its length 300\]"):
        expert.sample(torch.zeros(2, 64, 2), [100, 400], rope_delta=0, steps=STEPS, traced=False)
    with pytest.raises(ValueError, match="1 offsets for 2 samples"):
        expert.sample(torch.zeros(2, 64, 2), [100], rope_delta=0, steps=STEPS, traced=False)
    with pytest.raises(ValueError, match=r"3 samples over a KV cache of 2 slot\(s\): sample b reads slot b"):
        expert.sample(torch.zeros(3, 64, 2), 100, rope_delta=0, steps=STEPS, traced=False)
    filled(text)
    with pytest.raises(ValueError, match="initial noise must be finite"):
        expert.sample(torch.full((1, 64, 2), float("nan")), 100, rope_delta=0, traced=False)
    with pytest.raises(ValueError, match=r"initial noise must have shape \[1, 64, 2\]"):
        expert.sample(torch.zeros(1, 32, 2), 100, rope_delta=0, traced=False)


def test_the_ttnn_backend_loads_the_device_expert_decoder_over_its_text_model(dryrun_device, tmp_path):
    """`alpamayo.backends.load_expert_decoder` on ttnn: a TTExpertDecoder sharing the text model's device, whose
    K/V region the text model's caches then reserve; one prediction's context and sampling through it."""
    from alpamayo.backends import BackendOptions, load_expert_decoder
    from alpamayo.checkpoint import open_checkpoint
    from alpamayo.tt.expert import TTExpertDecoder
    from alpamayo.tt.text import TTTextModel
    from tests.tt_expert_cases import save_alpamayo_checkpoint

    ckpt, cfg = open_checkpoint(save_alpamayo_checkpoint(tmp_path / "alpamayo", seed=1))
    text = TTTextModel.from_checkpoint(ckpt, cfg, precision="performance", device=dryrun_device)
    decoder = load_expert_decoder(ckpt, cfg, BackendOptions("ttnn", recipe="performance"), text)
    try:
        assert isinstance(decoder, TTExpertDecoder) and decoder.expert.device is dryrun_device
        assert text.reserved_rows == 64
        text.setup_cache(MAX_SEQ_LEN)
        text.prefill(torch.arange(44) % 200)  # prompt (40), reasoning (3), <|traj_future_start|>
        plan = GeneratedPlan([7, 8, 9], False, np.zeros(0, np.int64), [])
        ctx = decoder.context(text, 40, [plan])
        assert (ctx.offsets, ctx.rows) == ((44,), 1)
        assert decoder.sample(ctx, seed=0).shape == (1, 64, 2)
        text.setup_cache(MAX_SEQ_LEN, max_batch=3)  # K = 3 rows, ragged reasoning: each its own offset
        text.prefill(torch.arange(40) % 200)
        text.fork(3)
        plans = [GeneratedPlan(r, False, np.zeros(0, np.int64), []) for r in ([7], [7, 8, 9], [])]
        text.decode(torch.tensor([7, 7, 5]))
        text.decode(torch.tensor([5, 8, 6]))
        text.decode(torch.tensor([6, 9, 6]))
        text.decode(torch.tensor([6, 5, 6]))  # row 1's <|traj_future_start|> (5) enters its cache last
        ctx = decoder.context(text, 40, plans)
        assert (ctx.offsets, ctx.rows) == ((42, 44, 41), 3)
        assert decoder.sample(ctx, seed=0).shape == (3, 64, 2)
    finally:
        decoder.close()
        text.close()
