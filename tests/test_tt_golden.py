"""The ttnn golden mode's machinery (`alpamayo.tt.golden`): choosing it, the values its tensors hold, the checks
it makes before computing, and what it refuses (marked `golden`: needs ttnn, no card).

The numbers of the device programs in golden mode are the card tests' (tests/test_tt_*_device.py, `golden`
cases); our op implementations are tests/test_tt_golden_ops.py's; the agreement with the dry run's shapes and
placements is tests/test_tt_golden_dryrun.py's.
"""

from __future__ import annotations

import pytest
import torch

from alpamayo.backends import BackendOptions
from alpamayo.plan.programs.grid import CoreGrid
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.device import (
    MODE_ENV,
    close_device,
    device_unavailable_reason,
    open_device,
    tt_mode,
    ttnn_for,
)
from alpamayo.tt.golden import OWN_OPS, GoldenDevice, GoldenTensor
from alpamayo.tt.golden.checks import GoldenCheckError

pytestmark = pytest.mark.golden


@pytest.fixture
def dev(ttnn_host):
    device = open_device(0, mode="golden")
    yield device
    close_device(device)


def test_the_mode_is_chosen_by_argument_then_environment(monkeypatch, ttnn_host):
    monkeypatch.delenv(MODE_ENV, raising=False)
    assert tt_mode() == "device" and tt_mode("golden") == "golden"
    monkeypatch.setenv(MODE_ENV, "golden")
    assert tt_mode() == "golden" and tt_mode("device") == "device"
    assert device_unavailable_reason() is None  # golden needs ttnn only
    device = open_device(0)
    assert isinstance(device, GoldenDevice) and ttnn_for(device) is device.ttnn
    close_device(device)
    assert device.closed
    monkeypatch.setenv(MODE_ENV, "card")
    with pytest.raises(ValueError, match="ttnn mode must be one of"):
        tt_mode()
    with pytest.raises(ValueError, match="ttnn mode must be one of"):
        BackendOptions("ttnn", tt_mode="emulated")


def test_tt_mode_is_a_backend_option_of_the_model_commands():
    """`--tt-mode` reaches `BackendOptions` (generate) and the eval / replay settings (their `ModelSpec`)."""
    from alpamayo.cli import build_parser
    from alpamayo.commands.common import model_spec, run_fields

    common = ["--checkpoint", "ckpt", "--backend", "ttnn", "--tt-mode", "golden"]
    generate = build_parser().parse_args(["generate", *common, "--prompt", "hi"])
    assert model_spec(generate).options.tt_mode == "golden"
    evaluate = build_parser().parse_args(["eval", *common, "--out", "run", "drive.mcap"])
    assert run_fields(evaluate)["model"].tt_mode == "golden"


def test_the_golden_device_answers_as_a_p150(dev, ttnn_host):
    from alpamayo.plan.device_spec import P150, DeviceSpec

    spec = DeviceSpec.from_device(dev)
    assert (spec.grid_x, spec.grid_y, spec.dram_banks) == (P150.grid_x, P150.grid_y, P150.dram_banks)
    assert dev.arch() == ttnn_host.device.Arch.BLACKHOLE


@pytest.mark.parametrize("dtype", ["bfloat8_b", "bfloat4_b", "bfloat16"])
def test_tensors_hold_what_ttnns_host_packer_stores(dev, ttnn_host, dtype):
    """An upload in a block-float dtype holds the values ttnn's own packer gives (from_torch, then to_torch),
    bit for bit, and reads back as ttnn reads it back."""
    ttnn, real = dev.ttnn, ttnn_host
    x = torch.randn(70, 100, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 100)
    dt = getattr(real, dtype)
    expected = real.to_torch(real.from_torch(x, dtype=dt, layout=real.TILE_LAYOUT))
    t = ttnn.from_torch(x, dtype=dt, layout=ttnn.TILE_LAYOUT, device=dev)
    got = ttnn.to_torch(t)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert tuple(t.padded_shape) == (96, 128)


def test_a_deallocated_tensor_is_not_read(dev):
    ttnn = dev.ttnn
    t = ttnn.from_torch(torch.ones(32, 32), dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT, device=dev)
    ttnn.deallocate(t)
    with pytest.raises(RuntimeError, match="deallocated"):
        ttnn.add(t, t)


def test_memory_nothing_wrote_reads_as_nan(dev):
    ttnn = dev.ttnn
    t = ttnn.allocate_tensor_on_device(ttnn.Shape([32, 32]), ttnn.bfloat16, ttnn.TILE_LAYOUT, dev)
    assert ttnn.to_torch(ttnn.add(t, 1.0)).isnan().all()


def test_a_shard_spec_that_does_not_fit_its_tensor_is_refused(dev):
    ttnn = dev.ttnn
    x = ttnn.from_torch(torch.ones(1, 1, 32, 256), dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT, device=dev)
    assert ttnn.to_memory_config(x, cfgs.width_sharded(ttnn, 256, CoreGrid(8, 1))).shape == x.shape
    with pytest.raises(GoldenCheckError, match="shards"):
        ttnn.to_memory_config(x, cfgs.width_sharded(ttnn, 128, CoreGrid(4, 1)))  # 32-wide shards of 256
    with pytest.raises(GoldenCheckError, match="shard width"):
        ttnn.to_memory_config(x, cfgs.height_sharded(ttnn, 32, 128, CoreGrid(2, 1)))


def test_a_matmul_program_config_must_cover_its_output(dev):
    from alpamayo.plan.programs.text import HeadMatmul

    ttnn = dev.ttnn
    x = ttnn.from_torch(torch.ones(1, 1, 32, 256), dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT, device=dev)
    w = ttnn.from_torch(torch.ones(256, 512), dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT, device=dev)
    ok = HeadMatmul(256, 512, CoreGrid(4, 1), in0_block_w=2, per_core_n=4, out_subblock_w=4, l1_bytes=0)
    short = HeadMatmul(256, 512, CoreGrid(4, 1), in0_block_w=2, per_core_n=2, out_subblock_w=2, l1_bytes=0)
    assert ttnn.linear(x, w, program_config=cfgs.head_matmul(ttnn, ok)).shape == (1, 1, 32, 512)
    with pytest.raises(GoldenCheckError, match="per_core_N"):
        ttnn.linear(x, w, program_config=cfgs.head_matmul(ttnn, short))


def test_sparse_matmul_refuses_an_nnz_the_sparsity_does_not_hold(dev):
    """The device op deadlocks when nnz is not the count of nonzero sparsity entries (alpamayo.tt.moe)."""
    ttnn = dev.ttnn
    x = ttnn.from_torch(torch.ones(1, 1, 32, 64), dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT, device=dev)
    w = ttnn.from_torch(torch.ones(1, 4, 64, 32), dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT, device=dev)
    mask = torch.tensor([1.0, 0.0, 1.0, 0.0]).view(1, 1, 1, 4)
    sparsity = ttnn.from_torch(mask, dtype=ttnn.bfloat16, layout=ttnn.ROW_MAJOR_LAYOUT, device=dev)
    out = ttnn.sparse_matmul(x, w, sparsity=sparsity, nnz=2)
    assert ttnn.to_torch(out).reshape(4, 32, 32)[1].abs().sum() == 0  # a skipped expert's rows are zero
    with pytest.raises(RuntimeError, match="deadlocks"):
        ttnn.sparse_matmul(x, w, sparsity=sparsity, nnz=3)


def test_fill_cache_copies_raw_tiles_of_its_own_dtype(dev):
    ttnn = dev.ttnn
    cache = ttnn.zeros([1, 1, 64, 32], dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT, device=dev)
    rows = ttnn.from_torch(torch.ones(1, 1, 32, 32), dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT, device=dev)
    with pytest.raises(RuntimeError, match="fill_cache of a"):
        ttnn.fill_cache(cache, rows, 0, update_idx=0)
    ttnn.fill_cache(cache, ttnn.typecast(rows, ttnn.bfloat8_b), 0, update_idx=32)
    assert ttnn.to_torch(cache)[0, 0, 32:].eq(1).all() and ttnn.to_torch(cache)[0, 0, :32].eq(0).all()


def test_ops_it_does_not_implement_and_traces_are_refused(dev):
    ttnn = dev.ttnn
    with pytest.raises(AttributeError, match="no golden-mode implementation"):
        ttnn.conv2d  # noqa: B018
    with pytest.raises(AttributeError, match="no golden-mode implementation"):
        ttnn.experimental.all_gather_async  # noqa: B018
    with pytest.raises(RuntimeError, match="traces are not captured"):
        ttnn.begin_trace_capture(dev, cq_id=0)


def test_the_ops_it_ran_are_counted_by_implementation(dev):
    """`calls` names every op a model ran: Tenstorrent's golden functions and ours (`OWN_OPS`)."""
    ttnn = dev.ttnn
    x = ttnn.from_torch(torch.ones(1, 1, 32, 64), dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT, device=dev)
    ttnn.experimental.fast_reduce_nc(ttnn.concat([x, x], dim=1), dims=[1])
    assert ttnn.calls["concat"] == 1 and ttnn.calls["experimental.fast_reduce_nc"] == 1
    assert "experimental.fast_reduce_nc" in OWN_OPS and "concat" not in OWN_OPS
    assert isinstance(x, GoldenTensor)


def test_packed_weights_cache_round_trips_in_golden_mode(ttnn_host, tmp_path):
    """`--tt-cache` in golden mode: the second load reads every packed weight back from its .tensorbin file
    and the model computes the same logits."""
    from alpamayo.tt.text import TTTextModel
    from tests.tt_checkpoints import save_tt_checkpoint

    save_tt_checkpoint(tmp_path / "ckpt", "moe", seed=1)
    logits = []
    for _ in range(2):
        device = open_device(0, mode="golden")
        with TTTextModel.from_checkpoint(
            tmp_path / "ckpt", precision="performance", device=device, cache_dir=tmp_path / "cache"
        ) as tt:
            tt.setup_cache(64)
            logits.append(tt.prefill(torch.arange(20)))
        close_device(device)
    assert any((tmp_path / "cache").glob("*.bfp4.*.tensorbin"))
    assert torch.equal(*logits)


def test_a_traced_step_runs_untraced_and_says_so_once(ttnn_host, tmp_path, capsys):
    from alpamayo.tt.text import GOLDEN_NOTICE, TTTextModel
    from tests.tt_checkpoints import save_tt_checkpoint

    save_tt_checkpoint(tmp_path, "gqa2", seed=1)
    device = open_device(0, mode="golden")
    with TTTextModel.from_checkpoint(tmp_path, precision="accuracy", device=device) as tt:
        tt.setup_cache(64)
        tt.prefill(torch.arange(20))
        traced = [tt.decode(t) for t in (1, 2)]
        tt.prefill(torch.arange(20))
        untraced = [tt.decode(t, traced=False) for t in (1, 2)]
    assert all(torch.equal(a, b) for a, b in zip(traced, untraced, strict=True))
    assert capsys.readouterr().err.count(GOLDEN_NOTICE) == 1
    assert not tt.decoder.traces


def test_an_output_subblock_must_fit_the_dest_registers(dev):
    """With fp32 accumulation the dest registers hold 4 output tiles per subblock (8 without)."""
    from alpamayo.plan.programs.text import HeadMatmul

    ttnn = dev.ttnn
    x = ttnn.from_torch(torch.ones(1, 1, 32, 256), dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT, device=dev)
    w = ttnn.from_torch(torch.ones(256, 512), dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT, device=dev)
    wide = cfgs.head_matmul(ttnn, HeadMatmul(256, 512, CoreGrid(2, 1), 2, 8, 8, 0))
    assert ttnn.linear(
        x, w, program_config=wide, compute_kernel_config=cfgs.compute_config(ttnn, "hifi2", False)
    )
    with pytest.raises(GoldenCheckError, match="dest tiles"):
        ttnn.linear(x, w, program_config=wide, compute_kernel_config=cfgs.compute_config(ttnn, "hifi2"))
