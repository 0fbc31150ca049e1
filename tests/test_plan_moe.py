"""The one-chip MoE block's host side: its YAML config and validation, the plan, and the prefill grouping.

The grouping is checked against the torch reference block (`alpamayo.text.moe.block.MoEBlock`, itself checked against
transformers in tests/test_text_moe.py): the grouped rows, one expert per 32-row group, weighted and gathered back,
must give the block's output.
"""

from __future__ import annotations

import pytest
import torch

from alpamayo.config.builtin import CONFIG_DIR, block_config_for, builtin_config, shipped_block_configs
from alpamayo.config.moe import MoEBlockConfig
from alpamayo.errors import ConfigError
from alpamayo.plan.dram import check_fits
from alpamayo.plan.precision import PRESETS
from alpamayo.plan.programs.grid import PlanError
from alpamayo.plan.programs.moe import plan_moe
from alpamayo.plan.programs.text import plan_text
from alpamayo.text.moe.block import MoEBlock
from alpamayo.text.moe.router import TopKRouter
from alpamayo.tt.moe import group_rows, max_groups
from tests.tt_checkpoints import TT_TINY, tiny_config

BLOCK_30B = dict(hidden_size=2048, intermediate_size=768, num_routed_experts=128, select_experts_k=8)


def test_the_shipped_30b_a3b_yaml_is_the_models_block_on_one_chip():
    assert (CONFIG_DIR / "qwen3-vl-30b-a3b.moe.yaml").is_file()
    shipped = shipped_block_configs()["qwen3-vl-30b-a3b"]
    cfg = builtin_config("qwen3-vl-30b-a3b")
    assert block_config_for(cfg.text) == shipped == MoEBlockConfig(**BLOCK_30B, mesh_shape=(1, 1))
    assert shipped.mesh_shape == (1, 1) and shipped.num_shared_experts == 0 and not shipped.has_bias
    plan = plan_text(cfg, PRESETS["performance"])
    assert (
        plan.moe.block == shipped and plan.moe.hidden_padded == 2048 and plan.moe.intermediate_padded == 768
    )


def test_a_model_without_a_shipped_yaml_runs_its_own_dimensions():
    t = tiny_config(TT_TINY["moe"], "moe").text
    assert block_config_for(t) == MoEBlockConfig.for_text(t)
    assert (block_config_for(t).num_routed_experts, block_config_for(t).select_experts_k) == (32, 4)


def test_a_yaml_describing_another_model_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "other.yaml"
    path.write_text(
        "hidden_size: 4096\nintermediate_size: 768\nnum_routed_experts: 128\nselect_experts_k: 8\n"
    )
    with pytest.raises(
        ConfigError, match=r"other.yaml: hidden_size = 4096 but the checkpoint's text config has 2048"
    ):
        block_config_for(builtin_config("qwen3-vl-30b-a3b").text, path)


@pytest.mark.parametrize(
    "fields, message",
    [
        ("num_slots: 1\nmesh_shape: [2, 2]", r"mesh_shape \[2, 2\] holds 4 devices but num_slots = 1"),
        ("mesh_shape: [4]", r"mesh_shape must be \[rows, columns\], two integers >= 1, got \[4\]"),
        ("mesh_shape: [0, 1]", r"mesh_shape must be \[rows, columns\], two integers >= 1, got \[0, 1\]"),
        ("mesh_shape: 1x1", r"mesh_shape must be \[rows, columns\], two integers >= 1, got '1x1'"),
    ],
)
def test_mesh_shape_is_validated_on_load(fields, message):
    text = "\n".join(f"{k}: {v}" for k, v in BLOCK_30B.items()) + "\n" + fields
    with pytest.raises(ConfigError, match=message):
        MoEBlockConfig.from_yaml(text, "moe.yaml")


def test_mesh_shape_defaults_to_one_row_of_the_slots():
    assert MoEBlockConfig(**BLOCK_30B, num_slots=4).mesh_shape == (1, 4)
    assert MoEBlockConfig(**BLOCK_30B, num_slots=8, mesh_shape=(2, 4)).mesh_shape == (2, 4)


@pytest.mark.parametrize(
    "block, message",
    [
        (
            MoEBlockConfig(**BLOCK_30B, num_slots=8, mesh_shape=(2, 4)),
            r"MoE mesh_shape \[2, 4\] \(8 devices\): the ttnn MoE block runs on one chip, mesh_shape \[1, 1\]. "
            r"Several chips .* are not implemented",
        ),
        (MoEBlockConfig(**BLOCK_30B, num_shared_experts=1), r"num_shared_experts = 1: .*allowed: 0"),
        (MoEBlockConfig(**BLOCK_30B, has_bias=True), r"has_bias = true: .*allowed: false"),
        (
            MoEBlockConfig(**dict(BLOCK_30B, num_routed_experts=40)),
            r"num_routed_experts = 40: .*allowed: multiples of 32",
        ),
    ],
    ids=["two-by-four-mesh", "shared-experts", "bias", "40-experts"],
)
def test_what_the_one_chip_block_does_not_run_is_refused_before_any_device_call(block, message):
    with pytest.raises(PlanError, match=message):
        plan_moe(builtin_config("qwen3-vl-30b-a3b"), block, PRESETS["performance"])


def test_the_memory_plan_of_30b_a3b_covers_its_experts():
    plan = check_fits(builtin_config("qwen3-vl-30b-a3b"), PRESETS["performance"], 8192)
    assert plan.weights["experts"] > 0.8 * plan.weight_bytes  # experts dominate a 30B-A3B's weights
    assert plan.fits


def grouped_moe(block: MoEBlock, x: torch.Tensor, scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The device's prefill dataflow in torch: gather rows by group, one expert per group, weight, gather back."""
    c = block.config
    padded = -(-x.shape[0] // 128) * 128
    g = group_rows(ids, scores, c.num_routed_experts, padded)
    groups = g.experts.numel()
    rows = torch.zeros(padded, c.hidden_size)
    rows[: x.shape[0]] = x
    grouped = rows[g.gather].view(groups, 32, -1)
    out = torch.stack([block.experts[int(e)](grouped[i]) for i, e in enumerate(g.experts)])
    out = (out * g.weights.view(groups, 32, 1)).reshape(groups * 32, -1)
    return out[g.combine].sum(0)[: x.shape[0]]


@pytest.mark.parametrize("tokens", [1, 33, 130, 300])
def test_grouped_prefill_rows_give_the_reference_block_output(tokens):
    cfg = MoEBlockConfig(hidden_size=64, intermediate_size=24, num_routed_experts=32, select_experts_k=4)
    gen = torch.Generator().manual_seed(tokens)
    gate_up = torch.randn(32, 48, 64, generator=gen) / 8
    down = torch.randn(32, 64, 24, generator=gen) / 5
    block = MoEBlock(cfg, gate_up, down)
    router = TopKRouter(torch.randn(32, 64, generator=gen), 4)
    x = torch.randn(tokens, 64, generator=gen)
    scores, ids = router(x)
    torch.testing.assert_close(
        grouped_moe(block, x, scores, ids), block(x, scores, ids), rtol=1e-5, atol=1e-6
    )


def test_groups_hold_one_expert_each_and_their_count_depends_on_the_length_only():
    gen = torch.Generator().manual_seed(0)
    for length, padded in ((5, 128), (128, 128), (300, 384)):
        ids = torch.stack([torch.randperm(32, generator=gen)[:4] for _ in range(length)])
        g = group_rows(ids, torch.rand(length, 4, generator=gen), 32, padded)
        assert g.experts.numel() == max_groups(padded, 4, 32)
        real = g.weights.view(-1, 32) > 0
        for group, expert in enumerate(g.experts.tolist()):
            tokens = g.gather.view(-1, 32)[group][real[group]]
            assert all(expert in ids[t].tolist() for t in tokens.tolist())
        # every (token, choice) pair is gathered back from exactly one grouped row of its expert
        rows = g.combine[:, :length].t()
        assert rows.unique().numel() == length * 4
        assert torch.equal(g.experts[rows // 32], ids)
