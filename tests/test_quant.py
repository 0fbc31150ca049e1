"""Weight-only int8 / int4 (alpamayo.quant): the kernels against dequantise-then-F.linear on the same codes,
the recipe's reach over the model's linears, the tiny model's greedy agreement, and the commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import alpamayo.quant.weights as quant_weights
from alpamayo.backends import BackendOptions
from alpamayo.cli import main
from alpamayo.demo_drive import make_demo_drive
from alpamayo.errors import ConfigError
from alpamayo.quant import (
    GROUP_SIZES,
    Int4Weight,
    Int8Weight,
    QuantRecipe,
    int4_codes,
    layer_mode,
    quantise_weight,
)
from alpamayo.quant.kernels import check_int4_shape
from alpamayo.quant.weights import DEQUANTISE_FROM_ROWS, cpu_int4_layout_known, unpack_cpu_int4
from alpamayo.text import TextModel
from alpamayo.text.linear import Linear, pack_linears
from bridges.node.config import ModelSection
from bridges.wire.client import TrajectorySubscriber
from tests.bridge_nodes import answering_window, wait_until
from tests.test_bridge_serve import camera_sim, start_serve, stop
from tests.test_runtime import frames_at, predict_argv, straight_history, write_prediction_inputs

# Output rounding of the kernels: float32 accumulates in another order than F.linear (a few ulps of the
# reduction); bfloat16 rounds the output once (8 bits of mantissa), so 2 ulps of the largest output.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2 * 2**-8}


def _weight(n: int = 96, k: int = 256, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, k, generator=g) * torch.linspace(0.1, 2.0, n)[:, None]).to(dtype)


def _close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    err = (y.float() - ref).abs().max().item()
    assert err <= TOLERANCE[dtype] * ref.abs().max().item(), err


# Rows on each side of the CPU switch from the weight-only kernel to dequantise + dense matmul.
ROWS = {mode: (1, 3, rows, rows + 5) for mode, rows in DEQUANTISE_FROM_ROWS.items()}


@pytest.mark.parametrize("rows", ROWS["int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_kernel_equals_dequantise_then_linear_on_the_same_codes(dtype, rows):
    w = _weight(dtype=dtype)
    q = Int8Weight.quantise(w)
    x = torch.randn(rows, 1, 256).to(dtype)
    reference = F.linear(x.float(), q.q.float() * q.scales.float()[:, None])  # independent dequantisation
    _close(q.matmul(x), reference, dtype)
    # the codes are the nearest: at most half a step from the weight, per output channel
    step = q.scales.float()[:, None]
    assert ((q.q.float() * step - w.float()).abs() <= step / 2 * (1 + 1e-3)).all()


@pytest.mark.parametrize("rows", ROWS["int4"])
@pytest.mark.parametrize("group", GROUP_SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_kernel_equals_dequantise_then_linear_on_the_same_codes(dtype, group, rows):
    w = _weight(100, 256, dtype)  # 100 rows: padded to 128, two blocks of the CPU packer
    codes, sz = int4_codes(w, group)
    packed = Int4Weight.from_codes(codes, sz, group)
    scale = sz[..., 0].float().t().repeat_interleave(group, dim=1)  # [N, K]
    zero = sz[..., 1].float().t().repeat_interleave(group, dim=1)
    dequantised = (codes.float() - 8) * scale + zero  # tinygemm's rule, written out here
    x = torch.randn(rows, 256).to(dtype)
    _close(packed.matmul(x), F.linear(x.float(), dequantised), dtype)
    assert int(codes.max()) <= 15
    # every weight within half a step (plus the scale's and zero's rounding to the dtype) of its code
    slack = 0.5 + (1e-3 if dtype == torch.float32 else 2**-6 * 16)
    assert ((dequantised - w.float()).abs() <= scale * slack).all()


def test_this_cpu_int4_layout_is_read_back_exactly_by_the_dequantising_path():
    """On an AVX512 build (this machine) the packed layout is the one `unpack_cpu_int4` reads, so prefill-sized
    calls dequantise; elsewhere the probe says no and the kernel serves them (the tests above hold either way)."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip(f"CPU capability {torch.backends.cpu.get_cpu_capability()}: the kernel serves every call")
    assert cpu_int4_layout_known()
    codes = torch.randint(0, 16, (192, 64), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    assert torch.equal(unpack_cpu_int4(packed, 64), codes.t())


def test_int4_error_shrinks_with_the_group_and_int8_is_finer_still():
    w = _weight()
    errors = {}
    for group in GROUP_SIZES:
        codes, sz = int4_codes(w, group)
        deq = (codes.float() - 8) * sz[..., 0].t().repeat_interleave(group, 1) + sz[
            ..., 1
        ].t().repeat_interleave(group, 1)
        errors[group] = (deq - w).pow(2).mean().item()
    q8 = Int8Weight.quantise(w)
    int8 = (q8.q.float() * q8.scales[:, None] - w).pow(2).mean().item()
    assert int8 < errors[32] < errors[64] < errors[128]


def test_unknown_recipe_and_group_are_refused_with_the_allowed_values():
    with pytest.raises(ValueError, match=r"quant must be one of \['none', 'int8', 'int4'\], got 'fp8'"):
        QuantRecipe("fp8")
    with pytest.raises(ValueError, match=r"group size must be one of \[32, 64, 128\], got 16"):
        QuantRecipe("int4", 16)


def test_direct_int4_packing_of_a_width_no_group_packs_names_the_layer_width_and_groups():
    with pytest.raises(
        ValueError,
        match=r"int4 on cpu: layer 'blocks.0.mlp.fc2' input width 4304 is not a multiple of 32; "
        r"no group size of \[32, 64, 128\] packs it on cpu \(--quant int4 packs such a layer at int8\)",
    ):
        check_int4_shape("blocks.0.mlp.fc2", 4304, 32, "cpu")
    with pytest.raises(
        ValueError,
        match=r"input width 8256 is not a multiple of 128 \(group 64, and the cuda int4 kernel needs a "
        r"multiple of 128\); no group size",
    ):
        check_int4_shape("layers.0.mlp.down", 8256, 64, "cuda")
    with pytest.raises(
        ValueError, match=r"width 96 is not a multiple of 64; group sizes that pack it: \[32\]"
    ):
        check_int4_shape("layers.0.mlp.down", 96, 64, "cpu")


@pytest.mark.parametrize(
    "width,group,device,mode",
    [
        (96, 64, "cpu", "int8"),
        (96, 32, "cpu", "int4"),
        (96, 32, "cuda", "int8"),
        (4304, 32, "cpu", "int8"),
        (8256, 64, "cpu", "int4"),
        (8256, 64, "cuda", "int8"),
        (8192, 128, "cuda", "int4"),
    ],
)
def test_an_int4_layer_the_group_or_the_kernel_cannot_pack_gets_int8(width, group, device, mode):
    assert layer_mode(QuantRecipe("int4", group), width, device) == mode
    assert layer_mode(QuantRecipe("int8"), width, device) == "int8"


@pytest.mark.parametrize("rows", ROWS["int8"])
def test_a_fallen_back_layer_equals_int8_dequantise_then_linear(rows):
    """96 input columns under int4-g64: packed at int8 per output channel, and its output is the int8
    reference (codes times scales, then F.linear) of the same weight."""
    w = _weight(64, 96)
    q = quantise_weight(w, QuantRecipe("int4", 64), "layers.0.mlp.down")
    assert isinstance(q, Int8Weight)
    reference = Int8Weight.quantise(w)
    assert torch.equal(q.q, reference.q) and torch.equal(q.scales, reference.scales)
    x = torch.randn(rows, 96)
    _close(q.matmul(x), F.linear(x, q.q.float() * q.scales.float()[:, None]), torch.float32)


def test_a_model_at_int4_with_one_layer_the_group_cannot_pack_loads_runs_and_says_so(capsys):
    w = _weight(64, 128)
    body, narrow = Linear(w.clone()), Linear(_weight(128, 96))
    root = torch.nn.Sequential(body, torch.nn.ReLU(), torch.nn.Linear(64, 96), narrow)
    pack_linears(root, quant=QuantRecipe("int4", 64), part="tiny model")
    assert isinstance(body.quantised, Int4Weight) and isinstance(narrow.quantised, Int8Weight)
    assert capsys.readouterr().err == (
        "alpamayo: --quant int4-g64 on cpu, tiny model: 1 of 2 linears at int8 (input widths not a multiple "
        "of 64: 3 96)\n"
    )
    y = root(torch.randn(3, 128))
    assert y.shape == (3, 128) and torch.isfinite(y).all()


def test_a_device_or_dtype_without_a_kernel_is_named():
    with pytest.raises(ValueError, match=r"no int8 weight-only kernel on device 'meta' \(dtype float32\)"):
        quantise_weight(torch.empty(16, 32, device="meta"), QuantRecipe("int8"), "x")
    with pytest.raises(ValueError, match=r"on cpu does not take dtype float64"):
        quantise_weight(_weight().double(), QuantRecipe("int4", 32), "x")


def test_pack_linears_quantises_the_body_and_keeps_head_and_router_unless_asked():
    w = _weight(64, 128)
    body, head, router = (
        Linear(w.clone()),
        Linear(w.clone(), role="head"),
        Linear(w[:16].clone(), role="router"),
    )
    root = torch.nn.ModuleList([body, head, router])
    pack_linears(root, quant=QuantRecipe("int8"))
    assert isinstance(body.quantised, Int8Weight) and body.weight is None
    assert body._packed is None  # the quantised linear holds only its codes and scales, no bf16 copy
    assert head.quantised is None and router.quantised is None
    head = Linear(w.clone(), torch.ones(64), role="head")
    pack_linears(torch.nn.ModuleList([head]), quant=QuantRecipe("int4", 32, head=True))
    x = torch.randn(2, 128)
    reference = F.linear(x, w, torch.ones(64))
    assert isinstance(head.quantised, Int4Weight)
    assert torch.corrcoef(torch.stack([head(x).flatten(), reference.flatten()]))[0, 1] > 0.99


def _teacher_forced_logits(model: TextModel, ids: torch.Tensor) -> torch.Tensor:
    """[len(ids), V] float32: the logits after each of `ids`, fed one by one after a one-token prefill."""
    model.setup_cache(ids.numel() + 1)
    return torch.stack([model.prefill(ids[:1])] + [model.decode(int(t)) for t in ids[1:]])


# Measured on the demo checkpoint (seed 0), 256 teacher-forced random tokens, float32 (docs/quantisation.md):
# int8 top-1 0.969, worst per-step logit PCC 0.9992; int4-g32 0.563, 0.923. Random Gaussian weights with flat
# logits are the hard case for both: near ties flip.
@pytest.mark.parametrize(
    "recipe,top1,pcc", [(QuantRecipe("int8"), 0.96, 0.999), (QuantRecipe("int4", 32), 0.55, 0.92)]
)
def test_demo_text_model_teacher_forced_against_float32(demo_checkpoint, recipe, top1, pcc, record_figure):
    model = TextModel.from_checkpoint(demo_checkpoint)
    ids = torch.randint(0, model.cfg.text.vocab_size, (256,), generator=torch.Generator().manual_seed(0))
    reference = _teacher_forced_logits(model, ids)
    logits = _teacher_forced_logits(TextModel.from_checkpoint(demo_checkpoint, quant=recipe), ids)
    agreement = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
    worst = min(
        torch.corrcoef(torch.stack(pair))[0, 1].item() for pair in zip(logits, reference, strict=True)
    )
    record_figure(f"top-1 agreement {recipe.name}", agreement)
    record_figure(f"worst step logit PCC {recipe.name}", worst)
    assert agreement >= top1 and worst >= pcc


def test_quant_with_the_ttnn_backend_is_refused_pointing_at_recipe(demo_checkpoint, tmp_path, capsys):
    with pytest.raises(ValueError, match="with --backend ttnn choose the precision with --recipe"):
        BackendOptions(backend="ttnn", quant=QuantRecipe("int8"))
    write_prediction_inputs(tmp_path, *frames_at(5), straight_history())
    assert main([*predict_argv(demo_checkpoint, tmp_path), "--backend", "ttnn", "--quant", "int4"]) == 2
    assert "--quant int4 is the torch backend's; with --backend ttnn" in capsys.readouterr().err


def test_predict_at_int8_and_int4(demo_checkpoint, tmp_path, capsys, record_figure):
    write_prediction_inputs(tmp_path, *frames_at(5), straight_history())
    args = [*predict_argv(demo_checkpoint, tmp_path), "--json"]
    assert main(args) == 0
    (reference,) = json.loads(capsys.readouterr().out)["samples"]
    for quant in (["--quant", "int8"], ["--quant", "int4", "--quant-group", "32", "--quant-head"]):
        assert main([*args, *quant]) == 0
        (sample,) = json.loads(capsys.readouterr().out)["samples"]
        xyz = np.asarray(sample["xyz"])
        assert xyz.shape == (64, 3) and np.isfinite(xyz).all()
        drift = np.linalg.norm(xyz - np.asarray(reference["xyz"]), axis=1).max()
        record_figure(f"max waypoint drift vs float32, m, {' '.join(quant)}", float(drift))
    # the demo vision tower is 64 wide (its expert MLP 96): the default group (128) divides neither, so those
    # layers load at int8, said once per part
    assert main([*args, "--quant", "int4"]) == 0
    printed = capsys.readouterr()
    (sample,) = json.loads(printed.out)["samples"]
    assert np.isfinite(np.asarray(sample["xyz"])).all()
    assert (
        "alpamayo: --quant int4-g128 on cpu, vision tower: 12 of 25 linears at int8 (input widths not a "
        "multiple of 128: blocks.*.attn.qkv 64, blocks.*.attn.proj 64, blocks.*.mlp.fc1 64)"
    ) in printed.err.splitlines()
    assert "alpamayo: --quant int4-g128 on cpu, action expert: 16 of 16 linears at int8" in printed.err


def test_replay_and_eval_at_int8(demo_checkpoint, tmp_path):
    drive = make_demo_drive(tmp_path / "drive.mcap", seconds=1.6, cameras=1, size=(72, 128)).path
    common = ["--checkpoint", str(demo_checkpoint), "--max-reasoning-tokens", "4", "--quant", "int8"]
    assert main(["replay", str(drive), *common, "--out", str(tmp_path / "replay"), "--max-ticks", "1"]) == 0
    assert main(["eval", str(drive), *common, "--out", str(tmp_path / "eval"), "--no-progress"]) == 0


def test_node_yaml_model_quant_is_validated_and_reaches_the_recipe():
    section = ModelSection(quant="int4", quant_group=64, quant_head=True)
    assert section.quant_recipe == QuantRecipe("int4", 64, head=True)
    with pytest.raises(ConfigError, match=r"model\.quant = .fp8."):
        ModelSection(quant="fp8")
    with pytest.raises(ConfigError, match=r"model\.quant_group = 48"):
        ModelSection(quant="int4", quant_group=48)
    with pytest.raises(ConfigError, match=r"model\.quant = .int8.* with model\.recipe"):
        ModelSection(backend="ttnn", quant="int8")


def test_serve_at_int8_from_the_node_yaml_streams_trajectories(demo_checkpoint, tmp_path):
    """The ZeroMQ node on loopback with `model.quant: int8` in its YAML: camera-sim frames in, trajectories
    out; the packed-weight cache it was given fills with int8 entries (the served model is the quantised one)."""
    cache = tmp_path / "packed"
    config = tmp_path / "node.yaml"
    config.write_text(
        f"model:\n  checkpoint: {demo_checkpoint}\n  quant: int8\n  quant_cache: {cache}\n"
        "  max_reasoning_tokens: 4\nwarmup:\n  runs: 0\ntiming:\n  stale_after_ms: 600000\n"
        "  shutdown_timeout_s: 0.5\n"
    )
    serve, endpoints = start_serve("--config", str(config))
    sim = None
    try:
        with TrajectorySubscriber(endpoints["output"]) as sub:
            sim = camera_sim(endpoints["input"][0], 3.0, "--speedup", "10")
            msg = wait_until(lambda: answering_window(sub.recv(0.5)), 300.0, "a trajectory")
            assert msg.valid and len(msg.x) == 64 and np.isfinite(msg.x).all()
            assert sim.wait(30) == 0
    finally:
        stop(serve, sim)
    entries = sorted(p.name for p in cache.iterdir())
    assert entries and all(".int8." in name for name in entries)
    assert any(name.startswith("layers.0.") for name in entries)  # text backbone (and expert) layers
    assert any(name.startswith("blocks.0.") for name in entries)  # the vision tower


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_dense_path_in_several_chunks_equals_the_kernel(monkeypatch, mode):
    """Prefill-sized calls dequantise `dense_chunk_rows` output channels at a time; with slices of 64 a
    200-row weight takes four (int4: padded to 256) and still equals the weight-only kernel's result."""
    monkeypatch.setattr(quant_weights, "dense_chunk_rows", lambda in_features, rows, dtype: 64)
    w = _weight(200, 256)
    q = Int8Weight.quantise(w) if mode == "int8" else quantise_weight(w, QuantRecipe("int4", 64), "x")
    x = torch.randn(DEQUANTISE_FROM_ROWS[mode] + 1, 256)
    y = q.matmul(x)
    reference = q.kernel_matmul(x)[:, :200]
    assert y.shape == (x.shape[0], 200)
    _close(y, reference.float(), torch.float32)
