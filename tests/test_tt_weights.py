"""Host-side weight preparation against the checkpoint's own tensors (ttnn's host packer under the p150 mock).

bf16 tensors must come back bit-exact after tilizing; bfp8 / bfp4 within the stated block-float error: each
element within 2^-7 (bfp8) or 2^-3 (bfp4) of the largest magnitude in its 16-value block of a tile row.
"""

from __future__ import annotations

import pytest
import torch

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.loader import load_model_config
from alpamayo.numerics import pcc
from alpamayo.plan.precision import BLOCK_FLOAT_ERROR
from alpamayo.plan.weights import (
    fused_qkv,
    gamma_row_major,
    gamma_tile,
    padded_hidden,
    prepare,
    residual_norm_eps,
    text_weight_specs,
    zero_pad,
)
from alpamayo.text.moe.weights import ExpertView
from alpamayo.text.weights import layer_prefix
from alpamayo.tt.weight_cache import to_host_tensor
from tests.hf_checkpoints import rewrite_hub_layout, save_checkpoint
from tests.tt_checkpoints import TT_TINY, save_tt_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tt-weights")
    spec = TT_TINY["gqa2"]
    save_checkpoint(path, spec["text"], tie=spec["tie"], seed=31)
    cfg = load_model_config(path)
    return cfg, Checkpoint(path, cfg.weight_prefix)


def _specs(cfg):
    return {s.name: s for s in text_weight_specs(cfg, dram_banks=8)}


def test_fused_qkv_columns_are_q_heads_then_k_then_v():
    q, k, v = torch.randn(8, 6), torch.randn(4, 6), torch.randn(4, 6)
    w = fused_qkv(q, k, v)
    assert w.shape == (6, 16)
    assert torch.equal(w[:, :8], q.t()) and torch.equal(w[:, 8:12], k.t()) and torch.equal(w[:, 12:], v.t())


def test_gamma_forms_hold_the_same_values():
    g = torch.randn(256)
    assert gamma_row_major(g).shape == (1, 1, 8, 32) and torch.equal(gamma_row_major(g).flatten(), g)
    assert gamma_tile(g).shape == (1, 1, 1, 256) and torch.equal(gamma_tile(g).flatten(), g)
    with pytest.raises(ValueError, match="dim % 32 == 0, got dim 48"):
        gamma_row_major(torch.randn(48))


def test_specs_pad_n_to_the_dram_banks_and_the_mlp_consistently(tiny):
    cfg, _ = tiny
    specs = _specs(cfg)
    assert specs["layers.0.wqkv"].padded == (256, 1024)  # (4 + 2*2) heads x 128: no padding needed
    assert specs["layers.0.w_gate"].shape == (256, 640) and specs["layers.0.w_gate"].padded == (256, 768)
    assert specs["layers.0.w_down"].shape == (640, 256) and specs["layers.0.w_down"].padded == (768, 256)
    assert specs["lm_head"].shape == (256, 317) and specs["lm_head"].padded == (256, 320)
    assert {s.placement for s in specs.values() if s.transform in ("linear", "fused_qkv")} == {
        "dram_sharded",
        "dram",
    }


def test_prepared_weights_are_the_transposed_checkpoint_tensors_zero_padded(tiny):
    cfg, ckpt = tiny
    specs = _specs(cfg)
    a = layer_prefix(1) + "self_attn."
    qkv = prepare(specs["layers.1.wqkv"], ckpt.get)
    heads = qkv.t().reshape(8, 128, 256)  # 4 q heads, 2 k heads, 2 v heads
    assert torch.equal(heads[:4].reshape(512, 256), ckpt.get(a + "q_proj.weight"))
    assert torch.equal(heads[6:].reshape(256, 256), ckpt.get(a + "v_proj.weight"))
    down = prepare(specs["layers.1.w_down"], ckpt.get)
    assert torch.equal(down[:640], ckpt.get(layer_prefix(1) + "mlp.down_proj.weight").t())
    assert not down[640:].any()
    head = prepare(specs["lm_head"], ckpt.get)
    assert torch.equal(head[:, :317], ckpt.get("lm_head.weight").t()) and not head[:, 317:].any()


def test_zero_pad_refuses_to_shrink():
    with pytest.raises(ValueError, match=r"cannot pad shape \[4, 8\] to \[4, 6\]"):
        zero_pad(torch.zeros(4, 8), (4, 6))


def _round_trip(ttnn, spec, ckpt, dtype):
    prepared = prepare(spec, ckpt.get)
    back = ttnn.to_torch(to_host_tensor(ttnn, prepared, dtype, spec.layout))
    return prepared, back.reshape(prepared.shape)


def test_bf16_weights_reconstruct_the_checkpoint_exactly(ttnn_host, tiny):
    cfg, ckpt = tiny
    for spec in _specs(cfg).values():
        prepared, back = _round_trip(ttnn_host, spec, ckpt, "bf16")
        assert torch.equal(back, prepared.to(torch.bfloat16)), spec.name


@pytest.mark.parametrize("dtype", ["bfp8", "bfp4"])
def test_block_float_weights_stay_within_the_stated_block_error(ttnn_host, tiny, dtype, record_figure):
    cfg, ckpt = tiny
    worst, worst_pcc = 0.0, 1.0
    for spec in _specs(cfg).values():
        if spec.layout != "tile" or spec.group == "norm":
            continue
        prepared, back = _round_trip(ttnn_host, spec, ckpt, dtype)
        x = prepared.float().reshape(-1, 16)  # rows of [K, N] split into the packer's 16-value blocks
        err = (back.float().reshape(-1, 16) - x).abs()
        block_max = x.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        ratio = float((err / block_max).max())
        assert ratio <= BLOCK_FLOAT_ERROR[dtype], f"{spec.name}: error {ratio} of the block max"
        worst, worst_pcc = max(worst, ratio), min(worst_pcc, pcc(prepared, back))
    record_figure(f"{dtype} worst error / block max", worst)
    record_figure(f"{dtype} worst weight PCC", worst_pcc)


def test_a_residual_stream_off_the_dram_banks_is_zero_padded_and_its_norms_are_exact(demo_checkpoint):
    """Hidden 128 is padded to 256 columns (8 DRAM banks); the norms over 256 give the model's RMSNorm."""
    cfg = load_model_config(demo_checkpoint)
    ckpt = Checkpoint(demo_checkpoint, cfg.weight_prefix)
    t = cfg.text
    assert (t.hidden_size, padded_hidden(t, 8)) == (128, 256)
    specs = _specs(cfg)
    qkv = prepare(specs["layers.0.wqkv"], ckpt.get)
    assert qkv.shape == (256, 256) and not qkv[128:].any()
    assert not prepare(specs["layers.0.wo"], ckpt.get)[:, 128:].any()
    assert not prepare(specs["lm_head"], ckpt.get)[128:].any()
    gamma = prepare(specs["layers.0.attn_norm.tile"], ckpt.get).double().flatten()
    rm = prepare(specs["layers.0.attn_norm.rm"], ckpt.get).double().flatten()
    assert torch.equal(gamma, rm) and not gamma[128:].any()
    x = torch.randn(5, 128, dtype=torch.float64)
    padded = torch.cat([x, torch.zeros(5, 128, dtype=torch.float64)], 1)
    eps = residual_norm_eps(t, 8)
    device = padded * torch.rsqrt(padded.pow(2).mean(-1, keepdim=True) + eps) * gamma
    g = ckpt.get(layer_prefix(0) + "input_layernorm.weight").double()
    reference = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + t.rms_norm_eps) * g
    torch.testing.assert_close(device[:, :128], reference, rtol=1e-6, atol=1e-6)  # gamma x scale in float32
    assert not device[:, 128:].any()


@pytest.fixture(scope="module")
def moe_layouts(tmp_path_factory):
    """The MoE tiny checkpoint saved twice: transformers 5's expert layout and the hub layout."""
    out = {}
    for layout in ("v5", "hub"):
        path = tmp_path_factory.mktemp(f"moe-{layout}")
        save_tt_checkpoint(path, "moe", seed=9)
        if layout == "hub":
            rewrite_hub_layout(path)
        cfg = load_model_config(path)
        out[layout] = (cfg, Checkpoint(path, cfg.weight_prefix))
    return out


def test_expert_weights_are_per_expert_k_by_n_zero_padded_whatever_the_disk_layout(moe_layouts):
    cfg, v5 = moe_layouts["v5"]
    _, hub = moe_layouts["hub"]
    specs = _specs(cfg)
    assert "layers.0.w_gate" not in specs
    gate_up = v5.get(layer_prefix(1) + "mlp.experts.gate_up_proj")  # [E, 2I, H] in this layout
    down = v5.get(layer_prefix(1) + "mlp.experts.down_proj")  # [E, H, I]
    tensors = {}
    for layout, ckpt in (("v5", v5), ("hub", hub)):
        view = ExpertView(cfg.text, ckpt.get)
        tensors[layout] = {k: prepare(specs[f"layers.1.experts.{k}"], view) for k in ("gate", "up", "down")}
    assert all(torch.equal(tensors["v5"][k], tensors["hub"][k]) for k in ("gate", "up", "down"))
    gate, up, dn = (tensors["v5"][k] for k in ("gate", "up", "down"))
    assert gate.shape == up.shape == (1, 32, 256, 64) and dn.shape == (1, 32, 64, 256)
    assert torch.equal(gate[0, :, :128, :48], gate_up[:, :48].transpose(1, 2))
    assert torch.equal(up[0, :, :128, :48], gate_up[:, 48:].transpose(1, 2))
    assert torch.equal(dn[0, :, :48, :128], down.transpose(1, 2))
    assert not gate[0, :, 128:].any() and not gate[0, :, :, 48:].any() and not dn[0, :, 48:].any()
    router = prepare(specs["layers.1.router"], v5.get)
    assert router.shape == (256, 32) and torch.equal(
        router[:128], v5.get(layer_prefix(1) + "mlp.gate.weight").t()
    )
