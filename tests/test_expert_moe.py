"""A flat-layout (R1 / 1.5) action expert over an MoE VLM, against NVIDIA's composition.

NVIDIA's flat layout builds the expert with `AutoModel.from_config` of a copy of the VLM's text config with the
expert overrides, so over Qwen3-VL-MoE its sparse layers are MoE blocks (router + fused experts) and the
checkpoint holds `expert.layers.{i}.mlp.gate.weight` / `mlp.experts.*`. The reference is `test_expert_golden`'s
HF composition on transformers' `Qwen3VLMoeTextModel`; the expert's fused tensors are stored in the released hub
layout.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from alpamayo.checkpoint import Checkpoint
from alpamayo.errors import CheckpointError
from alpamayo.expert.weights import validate_expert_tensors
from tests.test_expert_golden import Run, build_golden, velocity_against_hf


@pytest.fixture(scope="module")
def golden_moe(tmp_path_factory):
    return build_golden(tmp_path_factory.mktemp("moe-expert") / "ckpt", moe=True)


@pytest.fixture(scope="module")
def fp32_moe(golden_moe):
    return Run(golden_moe, torch.float32)


def test_the_expert_copies_the_vlms_moe_layers(golden_moe):
    cfg = golden_moe["cfg"]
    assert cfg.text.moe is not None and cfg.text.sparse_layers == list(range(cfg.text.num_hidden_layers))
    shapes = cfg.tensor_shapes()
    assert (
        "expert.layers.0.mlp.gate.weight" in shapes and "expert.layers.0.mlp.gate_proj.weight" not in shapes
    )
    # either on-disk layout of the fused experts is accepted, as for the VLM's own layers
    assert len(shapes["expert.layers.0.mlp.experts.gate_up_proj"]) == 2


@pytest.mark.parametrize("t", [0.0, 0.6])
def test_moe_expert_velocity_float32_matches_hf_composed(fp32_moe, t, record_figure):
    p, err = velocity_against_hf(fp32_moe, t, record_figure, "moe expert ")
    assert p >= 0.99999 and err <= 5e-6


def test_a_dense_expert_in_an_moe_checkpoint_is_refused_naming_the_tensors(golden_moe, tmp_path):
    """The tensors must be what the config builds: dense MLP names where the copy has MoE layers are named."""
    cfg = golden_moe["cfg"]
    ckpt = Checkpoint(golden_moe["path"])
    validate_expert_tensors(ckpt, cfg, cfg.text)  # the real file passes
    tensors = load_file(golden_moe["path"] / "model.safetensors")
    prefix = "expert.layers.1.mlp."
    for name in [n for n in tensors if n.startswith(prefix)]:
        del tensors[name]
    h, i = cfg.text.hidden_size, cfg.text.intermediate_size
    tensors[prefix + "gate_proj.weight"] = torch.zeros(i, h)
    directory = tmp_path / "dense-mlp"
    directory.mkdir()
    (directory / "config.json").write_text((golden_moe["path"] / "config.json").read_text())
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"expert\.layers\.1\.mlp\.gate\.weight"):
        validate_expert_tensors(Checkpoint(directory), cfg, cfg.text)
