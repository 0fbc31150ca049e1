"""The torch backend's GPU memory plan (`alpamayo plan --backend torch`, alpamayo.plan.gpu_memory), checked
against the bytes of real tensors: the packed weights of the actually quantised demo model, the checkpoint's
own tensors (read from the safetensors headers), and a real KV cache."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from alpamayo.cli import main
from alpamayo.config.expert import expert_config_of
from alpamayo.config.loader import load_model_config
from alpamayo.expert.weights import load_expert
from alpamayo.plan.gpu_memory import GPUS_GB, kv_cache_nbytes, packed_nbytes, plan_gpu_memory, weight_counts
from alpamayo.quant import QuantRecipe
from alpamayo.text import TextModel
from alpamayo.text.linear import Linear
from tests.hf_checkpoints import save_checkpoint, text_config
from vision.encoder import VisionEncoder

DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I64": 8, "I32": 4}


def _packed_bytes(root: torch.nn.Module) -> int:
    """Bytes of every quantised linear's packed tensors, measured from the tensors themselves."""
    return sum(
        t.numel() * t.element_size()
        for m in root.modules()
        if isinstance(m, Linear) and m.quantised is not None
        for t in m.quantised.tensors().values()
    )


def _at_int8(root: torch.nn.Module) -> list[tuple[str, int]]:
    """(name, input width) of the linears actually packed at int8."""
    return [
        (name, m.in_features)
        for name, m in root.named_modules()
        if isinstance(m, Linear) and m.quantised is not None and m.quantised.mode == "int8"
    ]


# int4-g64 and -g128 cover the int8 fallback: the demo expert's MLP is 96 wide (64 does not divide it), its
# vision tower and expert 64 wide (128 divides neither)
@pytest.mark.parametrize(
    "recipe",
    [QuantRecipe("int8"), QuantRecipe("int8", head=True)]
    + [QuantRecipe("int4", g) for g in (32, 64, 128)]
    + [QuantRecipe("int4", 64, head=True)],
    ids=str,
)
def test_planned_packed_weight_bytes_equal_the_quantised_demo_models(demo_checkpoint, recipe):
    cfg = load_model_config(demo_checkpoint)
    expert_cfg = expert_config_of(cfg)
    planned = weight_counts(cfg, expert_cfg, recipe, torch.float32, "cpu")
    real = {
        "text": TextModel.from_checkpoint(demo_checkpoint, cfg, quant=recipe),
        "vision": VisionEncoder.from_checkpoint(demo_checkpoint, cfg, quant=recipe),
        "expert": load_expert(demo_checkpoint, expert_cfg, cfg.text, quant=recipe),
    }
    assert set(planned) == set(real)
    for part, model in real.items():
        assert planned[part].refused == []
        assert planned[part].quantised == _packed_bytes(model) > 0, part
        if recipe.mode == "int4":
            assert planned[part].fallback == _at_int8(model), part
    fallback = {part: len(count.fallback) for part, count in planned.items()}
    expected = {"int8": 0, "int4-g32": 0, "int4-g64": 4, "int4-g128": 28}[recipe.name.removesuffix("+head")]
    assert sum(fallback.values()) == expected


def test_planned_plain_weight_bytes_equal_the_checkpoints_tensors(demo_checkpoint):
    """Without quantisation, the three parts hold every model tensor of the checkpoint, at the model dtype."""
    cfg = load_model_config(demo_checkpoint)
    planned = weight_counts(cfg, expert_config_of(cfg), QuantRecipe(), torch.float32, "cpu")
    elements = 0
    for path in demo_checkpoint.glob("*.safetensors"):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                n = 1
                for d in entry["shape"]:
                    n *= d
                elements += n
    assert sum(c.total for c in planned.values()) == elements * 4
    assert all(c.quantised == 0 for c in planned.values())


def test_a_tied_quantised_head_keeps_the_embedding_table_in_the_plain_bytes(tmp_path):
    """The head quantised by a +head recipe shares its weight with the embedding table, which stays plain: the
    planned plain bytes are the loaded model's plain tensors (the table and the norms), not less the table."""
    save_checkpoint(tmp_path, text_config(), tie=True)
    cfg = load_model_config(tmp_path)
    assert cfg.tie_word_embeddings
    recipe = QuantRecipe("int8", head=True)
    count = weight_counts(cfg, None, recipe, torch.float32, "cpu")["text"]
    model = TextModel.from_checkpoint(tmp_path, cfg, quant=recipe)
    plain = {id(t): t for m in model.modules() for t in vars(m).values() if isinstance(t, torch.Tensor)}
    plain |= {id(p): p for p in model.parameters()}
    assert count.plain == sum(t.numel() * t.element_size() for t in plain.values())
    assert count.quantised == _packed_bytes(model) > 0


def test_planned_kv_bytes_equal_a_real_cache_of_three_samples(demo_checkpoint):
    cfg = load_model_config(demo_checkpoint)
    model = TextModel.from_checkpoint(demo_checkpoint, cfg)
    model.setup_cache(300, 3)
    real = sum(t.numel() * t.element_size() for t in (*model.cache.k, *model.cache.v))
    assert kv_cache_nbytes(cfg, 3, 300, torch.float32) == real
    plan = plan_gpu_memory(cfg, expert_config_of(cfg), QuantRecipe("int8"), torch.float32, 300, 3, 100, 720)
    assert plan.kv_cache == plan.unguided_cache == real  # the demo expert supports navigation guidance


def test_plan_torch_names_each_recipes_smallest_gpu_and_its_int4_layers_at_int8(capsys):
    argv = ["plan", "--backend", "torch", "--checkpoint", "alpamayo-1.5-10b"]
    assert main([*argv, "--quant", "int4"]) == 0
    printed = capsys.readouterr()
    out = printed.out
    assert "GPU memory plan, torch backend (bfloat16 on cuda): alpamayo-1.5-10b, action expert at K=6" in out
    table = [
        line.split()[-12:] for line in out.splitlines() if line.endswith(" GB") and len(line.split()) >= 12
    ]
    rows = {fields[0]: fields[1:] for fields in table}
    assert list(rows) == ["bfloat16", "int8", "int4-g32", "int4-g64", "int4-g128"]
    at_int8 = {recipe: fields[0] for recipe, fields in rows.items()}
    for _, weights, kv, activations, total, gpu, _, unguided, guided, gpu_guided, _ in rows.values():
        assert float(total) == pytest.approx(float(weights) + float(kv) + float(activations), abs=0.011)
        assert float(guided) == pytest.approx(float(total) + float(unguided), abs=0.011)
        for size, need in ((gpu, total), (gpu_guided, guided)):
            assert int(size) == next(g for g in GPUS_GB if float(need) <= g)
    # the vision tower's MLP is 4304 wide (no group divides it) and the expert's 8256 (not a multiple of the
    # CUDA int4 kernel's 128): those 63 linears load at int8 under every group size
    assert at_int8 == dict.fromkeys(["int4-g32", "int4-g64", "int4-g128"], "63/405") | {
        "bfloat16": "-",
        "int8": "-",
    }
    assert "* int4-g128" in out
    assert (
        "int4-g128 on cuda, vision tower: 27 of 117 linears at int8 (input widths not a multiple of 128: "
        "blocks.*.mlp.fc2 4304)"
    ) in out.splitlines()
    assert (
        "int4-g32 on cuda, action expert: 36 of 144 linears at int8 (input widths not a multiple of 128: "
        "layers.*.mlp.down 8256)" in out.splitlines()
    )
    assert float(rows["int4-g128"][1]) < float(rows["int8"][1]) and printed.err == ""
    # on the CPU int4 packs any multiple of the group: at 64 the expert's 8256 is int4, the vision 4304 not
    assert main([*argv, "--quant", "int4", "--quant-group", "64", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "int4-g64 on cpu, vision tower: 27 of 117" in out and "int4-g64 on cpu, action expert" not in out
    # a recipe the device has no kernel for (float32 on CUDA's int4) still cannot load, by name
    assert main([*argv, "--quant", "int4", "--dtype", "float32"]) == 2
    printed = capsys.readouterr()
    assert "int4-g128 cannot load on cuda" in printed.out and "does not take dtype float32" in printed.err


def test_plan_torch_bad_arguments_are_named(capsys):
    argv = ["plan", "--backend", "torch", "--checkpoint", "alpamayo-1.5-10b"]
    assert main([*argv, "--samples", "0"]) == 2
    assert "max_seq_len and samples must be >= 1, got 3328 and 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--quant", "int3"])


@pytest.mark.parametrize("recipe", [QuantRecipe("int8"), QuantRecipe("int4", 32)], ids=str)
def test_a_quantised_bfloat16_linear_keeps_only_its_packed_tensors(recipe):
    """What the plan counts is all a quantised linear holds: no plain weight and no oneDNN copy of it."""
    linear = Linear(torch.randn(64, 128).bfloat16())
    linear.pack(quant=recipe)
    assert linear.weight is None and linear._packed is None
    assert _packed_bytes(linear) == packed_nbytes(64, 128, recipe, torch.bfloat16, "cpu")
