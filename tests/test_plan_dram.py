"""DRAM planner: what fits on one p150, the refusal and its suggestion, and `alpamayo plan`."""

from __future__ import annotations

import pytest

from alpamayo.cli import main
from alpamayo.config.builtin import CONFIG_DIR, builtin_config
from alpamayo.plan.dram import DoesNotFit, check_fits, plan_memory, spec_bytes
from alpamayo.plan.precision import OP_GROUPS, PRESETS, TENSOR_GROUPS, TILE_BYTES, Precision
from alpamayo.plan.weights import text_weight_specs
from tests.hf_checkpoints import save_checkpoint
from tests.tt_checkpoints import TT_TINY

BF16 = Precision("bf16", dict.fromkeys(TENSOR_GROUPS, "bf16"), dict.fromkeys(OP_GROUPS, "hifi4"))


def test_32b_performance_at_8k_context_fits(record_figure):
    plan = check_fits(builtin_config("qwen3-vl-32b"), PRESETS["performance"], 8192)
    record_figure("32B performance 8k: weights GB", plan.weight_bytes / 1e9)
    record_figure("32B performance 8k: total GB", plan.total / 1e9)
    assert 20e9 < plan.weight_bytes < 23e9  # ~21 GB of bfp4 MLP + bfp8 attention (DESIGN.md)
    assert plan.total <= plan.capacity


@pytest.mark.parametrize("recipe", [BF16, PRESETS["accuracy"]], ids=["bf16", "accuracy"])
def test_32b_in_a_wider_recipe_is_refused_with_a_recipe_that_fits(recipe):
    with pytest.raises(
        DoesNotFit,
        match=r"qwen3-vl-32b: recipe '\w+' at max_seq_len 8192 needs .* GB .*; recipe 'performance' fits",
    ):
        check_fits(builtin_config("qwen3-vl-32b"), recipe, 8192)


def test_too_long_a_context_suggests_the_longest_that_fits():
    cfg = builtin_config("qwen3-vl-32b")
    with pytest.raises(DoesNotFit, match=r"recipe 'performance' fits up to max_seq_len (\d+)") as e:
        check_fits(cfg, PRESETS["performance"], 131072)
    longest = int(e.value.args[0].rsplit(" ", 1)[1])
    assert plan_memory(cfg, PRESETS["performance"], longest).fits
    assert not plan_memory(cfg, PRESETS["performance"], longest + 128).fits


def test_a_model_no_recipe_can_hold_says_so():
    with pytest.raises(DoesNotFit, match="no preset fits even at max_seq_len 128"):
        check_fits(builtin_config("qwen3-vl-235b-a22b"), PRESETS["performance"], 1024)


def test_weights_are_counted_in_whole_padded_tiles():
    cfg = builtin_config("qwen3-vl-2b")
    plan = plan_memory(cfg, PRESETS["performance"], 4096)
    specs = text_weight_specs(cfg, 8)
    gate_up = [s for s in specs if s.group == "mlp_gate_up"]
    assert plan.weights["mlp_gate_up"] == sum(spec_bytes(s, "bfp4") for s in gate_up)
    assert spec_bytes(gate_up[0], "bfp4") == (2048 // 32) * (6144 // 32) * TILE_BYTES["bfp4"]
    # tied head: a bfp8 copy of the [151936, 2048] embedding on the device
    assert plan.weights["lm_head"] == (2048 // 32) * (151936 // 32) * TILE_BYTES["bfp8"]
    # KV cache: 28 layers x K and V x 8 heads x 4096 rows x 128, bfp8
    assert plan.kv_cache == 28 * 2 * 8 * (4096 // 32) * (128 // 32) * TILE_BYTES["bfp8"]


def test_moe_experts_are_counted_at_the_experts_dtype_and_the_router_in_bf16():
    cfg = builtin_config("qwen3-vl-30b-a3b")
    perf, acc = (plan_memory(cfg, PRESETS[r], 8192) for r in ("performance", "accuracy"))
    assert "mlp_gate_up" not in perf.weights  # every layer is sparse
    # gate and up [2048, 768] and down [768, 2048] per expert, 128 experts, 48 layers
    tiles = 48 * 128 * 3 * (2048 // 32) * (768 // 32)
    assert perf.weights["experts"] == tiles * TILE_BYTES["bfp4"]
    assert acc.weights["experts"] == tiles * TILE_BYTES["bfp8"]
    assert (
        perf.weights["router"]
        == acc.weights["router"]
        == 48 * (2048 // 32) * (128 // 32) * TILE_BYTES["bf16"]
    )


def test_the_vision_tower_is_counted_in_the_vision_dtype():
    cfg = builtin_config("qwen3-vl-8b")
    perf, bf16 = plan_memory(cfg, PRESETS["performance"], 4096), plan_memory(cfg, BF16, 4096)
    assert bf16.weights["vision"] / perf.weights["vision"] == TILE_BYTES["bf16"] / TILE_BYTES["bfp8"]
    assert 0.5e9 < perf.weights["vision"] < 0.8e9  # ~0.58B vision parameters in bfp8, heads padded 72 -> 128


def test_plan_cli_prints_memory_and_grid_plan(capsys):
    assert (
        main(["plan", "--checkpoint", "qwen3-vl-32b", "--recipe", "performance", "--max-seq-len", "8192"])
        == 0
    )
    out = capsys.readouterr().out
    assert "recipe 'performance', max_seq_len 8192" in out and "(fits)" in out
    assert "decode qkv      [5120, 10240] grid 8x10" in out


def test_plan_cli_refuses_what_does_not_fit_and_suggests(tmp_path, capsys):
    recipe = tmp_path / "bf16.yaml"
    recipe.write_text(
        f"name: all-bf16\ndtypes: {dict.fromkeys(TENSOR_GROUPS, 'bf16')}\n"
        f"fidelity: {dict.fromkeys(OP_GROUPS, 'hifi4')}\n"
    )
    assert main(["plan", "--checkpoint", "qwen3-vl-32b", "--recipe", str(recipe)]) == 2
    captured = capsys.readouterr()
    assert "(does NOT fit)" in captured.out
    assert (
        "does not fit: qwen3-vl-32b: recipe 'all-bf16'" in captured.err
        and "recipe 'performance' fits" in captured.err
    )


def test_plan_cli_reads_a_checkpoint_directory(tmp_path, capsys):
    spec = TT_TINY["gqa8-tied"]
    save_checkpoint(tmp_path / "tiny", spec["text"], tie=spec["tie"], seed=3)
    assert main(["plan", "--checkpoint", str(tmp_path / "tiny"), "--max-seq-len", "512"]) == 0
    assert "DRAM plan: tiny, recipe 'performance', max_seq_len 512" in capsys.readouterr().out


def test_plan_cli_names_an_unknown_checkpoint(capsys):
    assert main(["plan", "--checkpoint", "qwen3-vl-1b"]) == 2
    assert (
        "--checkpoint 'qwen3-vl-1b': no such directory and not a built-in config" in capsys.readouterr().err
    )


def test_plan_cli_takes_the_moe_block_config_and_refuses_a_mesh_it_cannot_run(tmp_path, capsys):
    shipped = (CONFIG_DIR / "qwen3-vl-30b-a3b.moe.yaml").read_text()
    two_chips = tmp_path / "two-chips.moe.yaml"
    two_chips.write_text(
        shipped.replace("num_slots: 1", "num_slots: 2").replace("mesh_shape: [1, 1]", "mesh_shape: [1, 2]")
    )
    argv = ["plan", "--checkpoint", "qwen3-vl-30b-a3b", "--moe-config", str(two_chips)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    refusal = "MoE mesh_shape [1, 2] (2 devices): the ttnn MoE block runs on one chip, mesh_shape [1, 1]"
    assert f"alpamayo plan: error: qwen3-vl-30b-a3b: {refusal}" in err


def test_plan_cli_refuses_an_moe_block_config_for_a_dense_model(capsys):
    shipped = str(CONFIG_DIR / "qwen3-vl-30b-a3b.moe.yaml")
    assert main(["plan", "--checkpoint", "qwen3-vl-32b", "--moe-config", shipped]) == 2
    err = capsys.readouterr().err
    assert f"alpamayo plan: error: MoE block config '{shipped}' given for a model without MoE layers" in err
