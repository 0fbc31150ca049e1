"""The grid / program-config planner on every published Qwen3-VL text config and on the tiny test configs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alpamayo.config.builtin import NAMES, builtin_config
from alpamayo.plan.device_spec import P150, TILE
from alpamayo.plan.precision import PRESETS
from alpamayo.plan.programs.grid import DEST_TILES, L1_HEADROOM, CoreGrid, PlanError
from alpamayo.plan.programs.text import DECODE_MAX_GRID, TextPlan, plan_text
from alpamayo.tt import ttnn_configs
from tests.test_text_golden import GOLDEN
from tests.tt_checkpoints import TT_TINY, tiny_config

ALL_PLANNABLE = [(n, builtin_config(n)) for n in NAMES] + [(n, tiny_config(s, n)) for n, s in TT_TINY.items()]


def check_plan_invariants(plan: TextPlan, cfg) -> None:
    """What the device ops require of a plan (the rules in alpamayo.plan.programs.text's docstring)."""
    t, dev = cfg.text, plan.device
    max_x, max_y = min(dev.grid_x, DECODE_MAX_GRID[0]), min(dev.grid_y, DECODE_MAX_GRID[1])
    assert plan.hidden_padded % (TILE * dev.dram_banks) == 0 and plan.hidden_padded - t.hidden_size >= 0
    h_tiles = plan.hidden_padded // TILE
    assert plan.residual_grid.cores * plan.norm_block_w == h_tiles
    assert plan.norm_block_w % plan.norm_subblock_w == 0
    for mm in plan.decode_matmuls:
        k_tiles, n_tiles = mm.k // TILE, mm.n_padded // TILE
        assert mm.n_padded % (TILE * dev.dram_banks) == 0, mm.name
        assert mm.grid.x <= max_x and mm.grid.y <= max_y, mm.name
        assert k_tiles % mm.grid.cores == 0, mm.name  # activation shards are whole tiles
        assert mm.per_core_n * mm.grid.cores == n_tiles, mm.name  # output shards cover N exactly
        assert (k_tiles // mm.grid.cores) % mm.in0_block_w == 0, mm.name
        assert (n_tiles // dev.dram_banks) % mm.workers_per_bank == 0, mm.name
        assert mm.l1_bytes <= dev.l1_bytes - L1_HEADROOM, mm.name
    if plan.moe is not None:
        for mm in (plan.moe.gate_up, plan.moe.down):
            assert mm.k % TILE == 0 and mm.n % TILE == 0, mm.name
            assert mm.per_core_n * mm.grid.cores == mm.n // TILE, mm.name  # N split evenly, whole tiles
            assert (mm.k // TILE) % mm.in0_block_w == 0 and mm.grid.x <= 8 and mm.grid.y <= 8, mm.name
            assert mm.l1_bytes <= dev.l1_bytes - L1_HEADROOM, mm.name
        assert (plan.moe.gate_up.k, plan.moe.down.n) == (plan.hidden_padded,) * 2
    head = plan.head
    assert head.per_core_n * head.grid.cores >= -(-t.vocab_size // TILE)
    assert h_tiles % head.in0_block_w == 0 and head.per_core_n % head.out_subblock_w == 0
    assert (
        head.grid.x <= dev.grid_x
        and head.grid.y <= dev.grid_y
        and head.l1_bytes <= dev.l1_bytes - L1_HEADROOM
    )


@pytest.mark.parametrize("recipe", sorted(PRESETS))
@pytest.mark.parametrize("name, cfg", ALL_PLANNABLE, ids=[n for n, _ in ALL_PLANNABLE])
def test_every_real_and_tiny_config_plans_within_the_p150(name, cfg, recipe):
    plan = plan_text(cfg, PRESETS[recipe])
    check_plan_invariants(plan, cfg)
    assert (plan.gate is None) == (cfg.text.moe is not None)  # 30B-A3B / 235B: attention and head only


def test_32b_plan_is_the_configuration_measured_on_a_p150():
    """The seed design's measured decode configs for Qwen3-VL-32B (2 workers per DRAM bank)."""
    plan = plan_text(builtin_config("qwen3-vl-32b"), PRESETS["performance"])
    assert plan.residual_grid == CoreGrid(8, 10)
    got = {m.name: (str(m.grid), m.per_core_n, m.workers_per_bank) for m in plan.decode_matmuls}
    assert got == {
        "qkv": ("8x10", 4, 2),
        "o": ("8x4", 5, 2),
        "gate": ("8x10", 10, 2),
        "up": ("8x10", 10, 2),
        "down": ("8x10", 2, 2),
    }
    assert (plan.qkv.in0_block_w, plan.o.in0_block_w, plan.down.in0_block_w) == (2, 8, 5)
    assert plan.gate.fused_silu and not plan.up.fused_silu
    assert (str(plan.head.grid), str(plan.prefill_grid)) == ("11x10", "11x10")


def test_2b_hidden_2048_gets_a_grid_that_divides_it():
    """2048 = 64 tiles does not split over the 80 cores of the 32B plan: 64 cores do."""
    plan = plan_text(builtin_config("qwen3-vl-2b"), PRESETS["performance"])
    assert plan.residual_grid == CoreGrid(8, 8) and plan.norm_block_w == 1


@pytest.mark.parametrize(
    "name, message",
    [
        ("gqa4-bias-untied", "attention_bias = true is not supported"),
        ("mha-tied", "head_dim = 16; the device rotary"),
    ],
)
def test_golden_test_configs_are_refused_with_the_reason(name, message):
    """The torch golden configs are too small for the device layouts: the planner says which rule fails."""
    with pytest.raises(PlanError, match=message):
        plan_text(tiny_config(GOLDEN[name], name), PRESETS["performance"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(head_dim=96),
            r"head_dim = 96; the device rotary \(rotary_embedding_hf\) needs 32 or a multiple of 64",
        ),
        (
            dict(num_attention_heads=3, num_key_value_heads=1),
            r"\(num_attention_heads \+ 2 num_key_value_heads\)",
        ),
        (dict(attention_bias=True), r"attention_bias = true is not supported by the ttnn backend"),
        (
            dict(num_attention_heads=72, num_key_value_heads=72),
            r"num_key_value_heads = 72: .* at most 64 heads",
        ),
    ],
)
def test_impossible_configs_fail_with_precise_errors(overrides, message):
    base = dict(TT_TINY["gqa2"]["text"], **overrides)
    rope = dict(base["rope_parameters"], mrope_section=[base["head_dim"] // 2 - 16, 8, 8])
    cfg = tiny_config({"text": dict(base, rope_parameters=rope), "tie": False}, "bad")
    with pytest.raises(PlanError, match=message):
        plan_text(cfg, PRESETS["performance"])


@pytest.mark.parametrize("hidden, padded", [(128, 256), (320, 512), (2560, 2560)])
def test_a_hidden_size_that_does_not_split_over_the_banks_gets_a_padded_residual_stream(hidden, padded):
    """o_proj and down_proj write the residual stream DRAM-sharded over 8 banks: it is padded to 256s."""
    base = dict(TT_TINY["gqa2"]["text"], hidden_size=hidden)
    cfg = tiny_config({"text": base, "tie": False}, "padded")
    plan = plan_text(cfg, PRESETS["performance"])
    check_plan_invariants(plan, cfg)
    assert plan.hidden_padded == padded and (plan.o.n_padded, plan.qkv.k, plan.head.k) == (padded,) * 3


def test_a_smaller_grid_is_planned_within_that_grid():
    harvested = replace(P150, name="harvested", grid_x=6, grid_y=4)
    cfg = builtin_config("qwen3-vl-8b")
    plan = plan_text(cfg, PRESETS["performance"], harvested)
    check_plan_invariants(plan, cfg)
    assert plan.prefill_grid == plan.sdpa_decode_grid == plan.block_sdpa_grid == CoreGrid(6, 4)


def test_l1_that_cannot_hold_a_matmul_is_refused():
    tiny_l1 = replace(P150, name="tiny-l1", l1_bytes=96 * 1024)
    with pytest.raises(PlanError, match=r"decode \w+ \[\d+, \d+\] \(bfp\d\): the smallest in0_block_w needs"):
        plan_text(builtin_config("qwen3-vl-32b"), PRESETS["performance"], tiny_l1)


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 8192), k=st.integers(1, 20000), n=st.integers(1, 160000))
def test_prefill_matmul_blocks_satisfy_minimal_matmul(m, k, n):
    plan = plan_text(builtin_config("qwen3-vl-2b"), PRESETS["performance"])
    mm = plan.prefill_matmul(m, k, n)
    assert mm.m_block % mm.subblock_h == 0 and mm.n_block % mm.subblock_w == 0
    assert mm.subblock_h * mm.subblock_w <= DEST_TILES
    assert -(-k // TILE) % mm.k_block == 0 and 1 <= mm.k_block <= 8
    assert mm.grid.x >= 2 and mm.grid.y >= 2


@settings(max_examples=200, deadline=None)
@given(n_kv=st.sampled_from([1, 2, 4, 8, 16]), rows=st.integers(1, 256))
def test_kv_fill_shards_are_whole_tiles_of_one_head(n_kv, rows):
    padded = TextPlan.padded_length(rows * TILE)
    plan = replace(plan_text(builtin_config("qwen3-vl-2b"), PRESETS["performance"]), n_kv_heads=n_kv)
    grid = plan.kv_fill_grid(padded)
    per_core = n_kv * padded // grid.cores
    assert grid.cores % n_kv == 0 and per_core % TILE == 0 and padded % per_core == 0
    assert grid.x <= 8 and grid.y <= 8


def test_cache_length_covers_whole_prefill_pads_and_decode_chunks():
    assert [TextPlan.cache_length(n) for n in (1, 128, 129, 8192)] == [128, 128, 256, 8192]


@pytest.mark.parametrize("name", NAMES)
def test_plans_convert_to_ttnn_program_configs(ttnn_host, name):
    """Every planned value is accepted by ttnn's own config constructors (host side, no device)."""
    plan = plan_text(builtin_config(name), PRESETS["performance"])
    for mm in plan.decode_matmuls:
        pc = ttnn_configs.decode_matmul(ttnn_host, mm)
        assert (pc.per_core_N, pc.in0_block_w, pc.num_workers_per_dram_bank) == (
            mm.per_core_n,
            mm.in0_block_w,
            mm.workers_per_bank,
        )
        mem = ttnn_configs.dram_sharded_weight(ttnn_host, mm.k, mm.n_padded, plan.device.dram_banks)
        assert list(mem.shard_spec.shape) == [mm.k, mm.n_padded // plan.device.dram_banks]
        act = ttnn_configs.width_sharded(ttnn_host, mm.k, mm.grid)
        assert list(act.shard_spec.shape) == [TILE, mm.k // mm.grid.cores]
    assert ttnn_configs.head_matmul(ttnn_host, plan.head).per_core_N == plan.head.per_core_n
    assert ttnn_configs.prefill_matmul(ttnn_host, plan.prefill_matmul(4096, 2048, 6144)).M_block_size >= 1
    ttnn_configs.sharded_norm(ttnn_host, plan.residual_grid, plan.norm_block_w, plan.norm_subblock_w)
    ttnn_configs.sdpa(ttnn_host, plan.prefill_grid, 256, 256)
    if plan.moe is not None:
        for mm in (plan.moe.gate_up, plan.moe.down):
            pc = ttnn_configs.sparse_matmul(ttnn_host, mm)
            assert (pc.per_core_N, pc.in0_block_w) == (mm.per_core_n, mm.in0_block_w)
