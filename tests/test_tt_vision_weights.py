"""Host-side preparation of the vision tower for the device: padding that cannot leak, exact reconstruction.

The demo checkpoint's heads are 16 wide (padded to 32 lanes on the device) and `VISION_72` has the real
models' 72-wide heads (padded to 128). bf16 preparation must reconstruct the checkpoint bit-exactly through
ttnn's host tilizer; the padded head layout must reproduce the reference attention exactly, with every padded
lane of q, k and v zero and the output projection blind to them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.builtin import NAMES, builtin_config
from alpamayo.config.loader import load_model_config
from alpamayo.errors import ConfigError
from alpamayo.plan.programs.vision import VISION_GELU, plan_vision
from alpamayo.plan.vision_weights import vision_weight_specs
from alpamayo.plan.weights import head_positions, prepare, restore, rotary_head_dim
from alpamayo.text.rope import apply_rotary
from alpamayo.tt.vision import padded_rotary
from alpamayo.tt.weight_cache import to_host_tensor
from tests.tt_checkpoints import VISION_72, save_tt_checkpoint
from vision.positions import patch_rows_cols, rotary_cos_sin
from vision.weights import ACTIVATIONS, block_prefix


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, demo_checkpoint):
    path = tmp_path_factory.mktemp("vision-72")
    save_tt_checkpoint(path, "gqa2", seed=5, vision=VISION_72)
    out = {}
    for name, directory in (("demo", demo_checkpoint), ("heads-72", path)):
        cfg = load_model_config(directory)
        out[name] = (cfg, Checkpoint(directory, cfg.weight_prefix))
    return out


@pytest.mark.parametrize("name", ["demo", "heads-72"])
def test_every_vision_tensor_is_restored_exactly_from_its_device_layout(checkpoints, name):
    cfg, ckpt = checkpoints[name]
    specs = vision_weight_specs(cfg.vision)
    assert {s.sources[0] for s in specs} == set(ckpt.names("visual.")) - {"visual.pos_embed.weight"}
    for spec in specs:
        for source, tensor in restore(spec, prepare(spec, ckpt.get)).items():
            assert torch.equal(tensor.reshape(ckpt.shape(source)), ckpt.get(source)), spec.name


def _projections(cfg, ckpt, j: int):
    specs = {s.name: s for s in vision_weight_specs(cfg.vision)}
    p = f"vision.blocks.{j}.attn."
    return {k: prepare(specs[p + k], ckpt.get) for k in ("qkv", "qkv.bias", "proj")}


@pytest.mark.parametrize("name, lanes", [("demo", 32), ("heads-72", 128)])
def test_padded_head_lanes_are_zero_in_qkv_and_unread_by_the_output_projection(checkpoints, name, lanes):
    cfg, ckpt = checkpoints[name]
    v = cfg.vision
    assert rotary_head_dim(v.head_dim) == lanes
    w = _projections(cfg, ckpt, 1)
    real = torch.zeros(v.num_heads, lanes, dtype=torch.bool)
    real[:, head_positions(v.head_dim, lanes)] = True
    pad = ~real.flatten()
    assert w["qkv"].shape == (v.hidden_size, 3 * v.num_heads * lanes)
    assert not w["qkv"].view(v.hidden_size, 3, -1)[:, :, pad].any()
    assert not w["qkv.bias"].view(3, -1)[:, pad].any()
    assert w["proj"].shape == (v.num_heads * lanes, v.hidden_size) and not w["proj"][pad].any()


@pytest.mark.parametrize("name", ["demo", "heads-72"])
def test_the_padded_head_layout_reproduces_the_reference_attention(checkpoints, name):
    """q, k, v from the padded weights, rotated by rotate-half over the padded lanes with the device's
    cos/sin tables, give the reference rotated q, k and v at their lanes, zeros elsewhere, and the same
    attention output once projected."""
    cfg, ckpt = checkpoints[name]
    v, j = cfg.vision, 0
    lanes = rotary_head_dim(v.head_dim)
    w = _projections(cfg, ckpt, j)
    grid = torch.tensor([[1, 4, 6]])
    rows, cols = patch_rows_cols(grid, v.spatial_merge_size)
    x = torch.randn(
        rows.numel(), v.hidden_size, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )

    b = block_prefix(j) + "attn."
    ref = (x @ ckpt.get(b + "qkv.weight").double().t() + ckpt.get(b + "qkv.bias").double()).view(
        -1, 3, v.num_heads, v.head_dim
    )
    cos, sin = (t[:, None].double() for t in rotary_cos_sin(rows, cols, v.head_dim, v.rope_theta))
    ref_q, ref_k, ref_v = apply_rotary(ref[:, 0], cos, sin), apply_rotary(ref[:, 1], cos, sin), ref[:, 2]

    dev = (x @ w["qkv"].double() + w["qkv.bias"].double().flatten()).view(-1, 3, v.num_heads, lanes)
    cos_p, sin_p = (t[:, None].double() for t in padded_rotary(rows, cols, v, lanes))
    dev_q, dev_k, dev_v = (
        apply_rotary(dev[:, 0], cos_p, sin_p),
        apply_rotary(dev[:, 1], cos_p, sin_p),
        dev[:, 2],
    )

    at = head_positions(v.head_dim, lanes)
    others = torch.ones(lanes, dtype=torch.bool)
    others[at] = False
    for ref_t, dev_t in ((ref_q, dev_q), (ref_k, dev_k), (ref_v, dev_v)):
        torch.testing.assert_close(dev_t[..., at], ref_t, rtol=1e-12, atol=1e-12)
        assert not dev_t[..., others].any()

    def attend(q, k, val, proj):
        a = torch.softmax(torch.einsum("nhd,mhd->hnm", q, k) * v.head_dim**-0.5, -1)
        return torch.einsum("hnm,mhd->nhd", a, val).reshape(x.shape[0], -1) @ proj

    expected = attend(ref_q, ref_k, ref_v, ckpt.get(b + "proj.weight").double().t())
    torch.testing.assert_close(
        attend(dev_q, dev_k, dev_v, w["proj"].double()), expected, rtol=1e-10, atol=1e-10
    )


def test_bf16_vision_weights_reconstruct_the_checkpoint_through_ttnn(ttnn_host, checkpoints):
    cfg, ckpt = checkpoints["heads-72"]
    for spec in vision_weight_specs(cfg.vision):
        prepared = prepare(spec, ckpt.get)
        back = ttnn_host.to_torch(to_host_tensor(ttnn_host, prepared, "bf16", spec.layout))
        assert torch.equal(back.reshape(prepared.shape), prepared.to(torch.bfloat16)), spec.name


@pytest.mark.parametrize("name", NAMES)
def test_real_vision_towers_plan_with_their_padded_heads(name):
    v = builtin_config(name).vision
    plan = plan_vision(v)
    assert plan.padded_head_dim == {64: 64, 72: 128}[v.head_dim]
    assert plan.padded_length(720) == 768 and plan.padded_length(2880) == 2944


@pytest.mark.parametrize("act", sorted(VISION_GELU))
def test_the_device_gelu_of_each_accepted_activation_is_the_references(ttnn_host, act):
    """The `ttnn.GeluVariant` the vision blocks run for `hidden_act` computes (by ttnn's own golden function)
    exactly the torch reference's block activation."""
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 4
    gelu = ttnn_host.get_golden_function(ttnn_host.gelu)
    assert torch.equal(gelu(x, variant=getattr(ttnn_host.GeluVariant, VISION_GELU[act])), ACTIVATIONS[act](x))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hidden_size=80, num_heads=4), r"vision hidden_size = 80 must be a multiple of 32"),
        (
            dict(hidden_act="silu"),
            r"vision hidden_act = 'silu'; the device vision blocks support gelu_pytorch_tanh",
        ),
    ],
)
def test_a_tower_the_device_layout_cannot_hold_is_refused(checkpoints, change, message):
    with pytest.raises(ConfigError, match=message):
        plan_vision(replace(checkpoints["demo"][0].vision, **change))
