"""The p150 estimate with speculative decoding (`alpamayo.plan.estimate`, `alpamayo plan --accept-len`): a verify
of T tokens is T rows of one decode program, so its matmuls read every weight once for up to 32 rows, and its
block flash-decode (`DecoderLayer.block_sdpa`) reads the context's K/V once per 8 rows where one position's
heads fit a tile (each row reads them itself otherwise)."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from alpamayo.cli import main
from alpamayo.config.builtin import builtin_config, builtin_expert
from alpamayo.plan.device_spec import P150
from alpamayo.plan.estimate import (
    decode_estimate,
    dflash_draft_estimate,
    first_block_ms,
    prefill_estimate,
    verify_estimate,
)
from alpamayo.plan.precision import load_precision
from alpamayo.plan.programs.grid import flash_decode_cores
from alpamayo.plan.programs.text import BLOCK_SDPA_POSITIONS, block_sdpa_applies, plan_text

RELEASE = "alpamayo-1.5-10b"
CONTEXT = 3136


def sdpa_ops(stage):
    """The attention ops of a stage (one per layer)."""
    return [op for op in stage.ops if ".sdpa." in op.name]


def split(stage):
    """(matmul bytes, attention bytes) of a stage's ops."""
    sdpa = sum(op.dram_bytes for op in sdpa_ops(stage))
    return stage.dram_bytes() - sdpa, sdpa


@pytest.mark.parametrize("recipe", ["accuracy", "performance"])
def test_a_verify_of_one_token_is_a_decode_step_and_a_block_reads_the_weights_once(recipe):
    cfg, precision = builtin_expert(RELEASE)[0], load_precision(recipe)
    step = decode_estimate(cfg, precision, CONTEXT, 64)
    one = verify_estimate(cfg, precision, CONTEXT, 1, 64)
    assert one.ms(P150) == pytest.approx(step.ms(P150), rel=1e-12)
    weights, kv = split(step)
    for block in (2, 8, 32):
        b_weights, b_kv = split(verify_estimate(cfg, precision, CONTEXT, block, 1))
        assert b_weights == pytest.approx(weights, rel=1e-12)  # rows of one tile: weights read once
        # 32 heads: the block flash-decode reads the K/V once per BLOCK_SDPA_POSITIONS rows
        assert b_kv == pytest.approx(math.ceil(block / BLOCK_SDPA_POSITIONS) * kv, rel=1e-12)


def test_a_verify_whose_heads_span_two_tiles_reads_the_kv_per_row():
    cfg, precision = builtin_config("qwen3-vl-32b"), load_precision("performance")
    assert cfg.text.num_attention_heads == 64 and not block_sdpa_applies(64)
    step = decode_estimate(cfg, precision, CONTEXT, 1)
    _, kv = split(step)
    for block in (2, 8):
        verify = verify_estimate(cfg, precision, CONTEXT, block, 1)
        assert split(verify)[1] == pytest.approx(block * kv, rel=1e-12)
        # each row its own flash-decode, on the decode grid
        assert {op.cores for op in sdpa_ops(verify)} == {op.cores for op in sdpa_ops(step)}


def test_a_decode_row_multiplies_its_tile_of_heads_by_every_kv_head():
    """ttnn's flash-decode runs a row's query heads, padded to whole tiles, against each K/V head in full (the
    writer keeps each group's rows): its FLOPs follow the K/V heads and the head tiles, not the query heads."""
    base, precision = builtin_config("qwen3-vl-8b"), load_precision("performance")

    def flops(heads: int, kv: int) -> float:
        text = replace(base.text, num_attention_heads=heads, num_key_value_heads=kv)
        return sdpa_ops(decode_estimate(replace(base, text=text), precision, CONTEXT, 1))[0].flops

    assert flops(16, 8) == flops(32, 8)  # one tile of heads either way
    assert flops(32, 4) * 2 == flops(32, 8) and flops(64, 8) == 2 * flops(32, 8)


def test_a_verify_block_attends_on_the_whole_grid():
    """The block attention's FLOPs are its rows' flash-decodes' (each position's tile of heads against every
    K/V head), run on the whole grid: 16 cores per K/V head of the p150's 13 x 10, against the decode grid's 8."""
    cfg, precision = builtin_expert(RELEASE)[0], load_precision("performance")
    plan = plan_text(cfg, precision)
    n_kv = cfg.text.num_key_value_heads
    step, verify = decode_estimate(cfg, precision, CONTEXT, 1), verify_estimate(cfg, precision, CONTEXT, 8, 1)
    for one, block in zip(sdpa_ops(step), sdpa_ops(verify), strict=True):
        assert block.flops == 8 * one.flops
        assert block.cores == flash_decode_cores(plan.block_sdpa_grid, n_kv) == 2 * one.cores


def test_a_block_of_eight_costs_about_one_decode_step_on_the_release():
    cfg, precision = builtin_expert(RELEASE)[0], load_precision("performance")
    step = decode_estimate(cfg, precision, CONTEXT, 1).ms(P150)
    ratio = verify_estimate(cfg, precision, CONTEXT, 8, 1).ms(P150) / step
    # the weights (DRAM-bound, read once) dominate; what is left is the block attention's padded FLOPs
    assert 1.0 < ratio < 1.1


def test_a_moe_verify_reads_the_experts_its_rows_can_reach():
    cfg, precision = builtin_config("qwen3-vl-30b-a3b"), load_precision("performance")
    moe = cfg.text.moe
    experts = {}
    for block in (1, 8, 32):
        stage = verify_estimate(cfg, precision, CONTEXT, block, 1)
        experts[block] = sum(op.dram_bytes for op in stage.ops if "experts" in op.name or "w_gate" in op.name)
    reach = {b: min(moe.num_experts, b * moe.num_experts_per_tok) for b in experts}
    assert experts[8] / experts[1] == pytest.approx(reach[8] / reach[1], rel=1e-9)
    assert experts[32] / experts[1] == pytest.approx(reach[32] / reach[1], rel=1e-9)


def test_plan_adds_up_the_speculative_estimate_from_its_stage_estimates(capsys, record_figure):
    """What `plan --accept-len` prints is the plain estimate with the 64 decode steps swapped for the verifies
    (and the DFlash drafts), each stage as the estimate functions cost it. Only the composition is checked
    here: the stage costs themselves are the tests above (weights read once per block, K/V reads per row or
    per tile, the grid), tests/test_plan_stream.py and tests/test_plan_expert.py."""
    assert main(["plan", "--checkpoint", RELEASE, "--accept-len", "4"]) == 0
    out = capsys.readouterr().out
    assert "WITH SPECULATION at 4 tokens per verify (64 tokens: 16 verifies of 8 rows" in out
    plain = float(re.search(r"total per prediction: +roofline +([\d.]+) ms", out).group(1))
    free = float(re.search(r"model-free draft \(lookup, previous\): roofline +([\d.]+) ms", out).group(1))
    dflash = float(re.search(r"DFlash draft on the device: +roofline +([\d.]+) ms", out).group(1))
    cfg, precision = builtin_expert(RELEASE)[0], load_precision("performance")
    context = 3072 + 64  # the plan's prompt at 16 images of 320x576, plus the reasoning
    step, verify = (
        decode_estimate(cfg, precision, context, 64),
        verify_estimate(cfg, precision, context, 8, 16),
    )
    # model-free: the first of the 16 blocks is verified in the prefill (its 7 drafted rows), 15 verifies
    first = first_block_ms(cfg, precision, 3072, 7)
    assert "first block verified in the prefill (7 drafted rows, model-free drafts)" in out
    assert free == pytest.approx(plain - 64 * step.ms(P150) + first + 15 * verify.ms(P150), abs=0.15)
    draft = dflash_draft_estimate(cfg, precision, 8, 16, context)
    without = plain - 64 * step.ms(P150) + 16 * verify.ms(P150)  # DFlash drafts from the prefill's features
    assert dflash == pytest.approx(without + 16 * draft.ms(P150), abs=0.15)
    assert free < plain
    record_figure("p150 estimate per prediction, plain decoding (ms)", plain)
    record_figure("p150 estimate at tau=4, model-free draft (ms)", free)
    record_figure("p150 estimate at tau=4, DFlash draft (ms)", dflash)


def test_a_first_block_in_the_prefill_costs_its_padded_rows_and_head_tiles():
    """Drafted rows that fit the prompt's padding and its last tile cost nothing; crossing into another tile
    costs one more lm_head pass; crossing a multiple of 128 (the plan's 3072-row prompt) 128 more rows."""
    cfg, precision = builtin_expert(RELEASE)[0], load_precision("performance")
    assert first_block_ms(cfg, precision, 3000, 7) == 0.0  # rows 2999..3006: one tile, padded to 3072
    head = first_block_ms(cfg, precision, 3040, 7)  # rows 3039..3046 cross a tile, still inside 3072
    assert 0 < head < verify_estimate(cfg, precision, CONTEXT, 8, 1).ms(P150)
    rows = prefill_estimate(cfg, precision, 3079).ms(P150) - prefill_estimate(cfg, precision, 3072).ms(P150)
    assert rows > 0
    assert first_block_ms(cfg, precision, 3072, 7) == pytest.approx(rows + head, rel=1e-12)


def test_plan_counts_partial_blocks_and_refuses_what_cannot_be_verified(capsys):
    assert main(["plan", "--checkpoint", RELEASE, "--accept-len", "6", "--block-size", "16"]) == 0
    assert f"{math.ceil(64 / 6)} verifies of 16 rows" in capsys.readouterr().out
    assert main(["plan", "--checkpoint", RELEASE, "--accept-len", "9"]) == 2
    assert "--accept-len 9.0: must be in [1, block size 8]" in capsys.readouterr().err
    assert main(["plan", "--checkpoint", RELEASE, "--accept-len", "4", "--block-size", "33"]) == 2
    assert "--block-size 33: must be in [1, 32]" in capsys.readouterr().err


def test_the_dflash_estimate_costs_the_device_drafts_program():
    """The DFlash line costs what `alpamayo.tt.draft` runs: the device's draft tensors and the target's
    lm_head on one 32-row block tile, a masked SDPA per draft layer over the whole draft cache slot, and the
    context append's second read of fc and every layer's qkv weights."""
    from alpamayo.drafts.dflash import DFlashConfig
    from alpamayo.plan.draft_weights import draft_cache_rows, draft_weight_specs
    from alpamayo.plan.dram import kv_bytes

    cfg, precision = builtin_expert(RELEASE)[0], load_precision("performance")
    t = replace(cfg.text, moe=None, num_hidden_layers=2)
    specs = draft_weight_specs(DFlashConfig(t, 8, 0, tuple(range(5))))
    stage = dflash_draft_estimate(cfg, precision, 8, 16, CONTEXT)
    names = [op.name for op in stage.ops]
    matmuls = [s.name for s in specs if s.name.endswith((".wqkv", ".wo", "w_gate", "w_up", "w_down"))]
    assert {*matmuls, "lm_head", "draft.fc.append"} <= set(names)
    assert sorted(n for n in names if n.endswith(".append")) == sorted(
        [f"{n}.append" for n in matmuls if n.endswith(".wqkv")] + ["draft.fc.append"]
    )
    sdpa = [op for op in stage.ops if op.name.startswith("draft.sdpa.")]
    assert len(sdpa) == 2
    assert sdpa[0].dram_bytes == kv_bytes(t, draft_cache_rows(CONTEXT), precision.dtype("kv_cache"))
    head = next(op for op in stage.ops if op.name == "lm_head")
    verify_head = next(
        op for op in verify_estimate(cfg, precision, CONTEXT, 8, 1).ops if op.name == "lm_head"
    )
    assert head.dram_bytes == verify_head.dram_bytes  # the target's own head, read once per block
