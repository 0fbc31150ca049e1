"""Recipe and plan values as ttnn objects: dtypes, compute-kernel configs, memory and program configs.

Everything here is a pure translation of validated data (`Precision`, `TextPlan`) into ttnn constructors, so
an impossible combination has already been refused by the planners before any of this runs. The functions
take the `ttnn` module as their first argument (see `alpamayo.tt.device.import_ttnn`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from alpamayo.plan.device_spec import TILE
from alpamayo.plan.precision import Precision
from alpamayo.plan.programs.grid import CoreGrid, PrefillMatmul
from alpamayo.plan.programs.moe import SparseMatmul
from alpamayo.plan.programs.text import DecodeMatmul, HeadMatmul

FIDELITY_NAMES = {"lofi": "LoFi", "hifi2": "HiFi2", "hifi3": "HiFi3", "hifi4": "HiFi4"}


def ttnn_dtype(ttnn: Any, name: str) -> Any:
    """Recipe dtype name (bf16 | bfp8 | bfp4) -> ttnn.DataType."""
    return {"bf16": ttnn.bfloat16, "bfp8": ttnn.bfloat8_b, "bfp4": ttnn.bfloat4_b}[name]


def ttnn_layout(ttnn: Any, layout: str) -> Any:
    """`WeightSpec.layout` (tile | row_major) -> ttnn.Layout."""
    return ttnn.TILE_LAYOUT if layout == "tile" else ttnn.ROW_MAJOR_LAYOUT


def compute_config(ttnn: Any, fidelity: str, fp32_acc: bool = True, l1_acc: bool = True) -> Any:
    """Compute-kernel config; `WormholeComputeKernelConfig` is the type ttnn uses for Blackhole too."""
    return ttnn.WormholeComputeKernelConfig(
        math_fidelity=getattr(ttnn.MathFidelity, FIDELITY_NAMES[fidelity]),
        math_approx_mode=False,
        fp32_dest_acc_en=fp32_acc,
        packer_l1_acc=l1_acc,
    )


# The matmul op groups (`Precision` group names) that get a compute-kernel config each.
MATMUL_GROUPS = ("qkv", "o", "mlp_gate_up", "mlp_down", "experts", "router", "lm_head", "expert")


@dataclass(frozen=True)
class ComputeKernels:
    """Compute-kernel configs: one per matmul op group (`MATMUL_GROUPS`, the recipe's math fidelity), the
    norms', and prefill's and decode's SDPA."""

    matmul: Mapping[str, Any]
    norm: Any
    sdpa_prefill: Any
    sdpa_decode: Any

    @classmethod
    def for_precision(cls, ttnn: Any, precision: Precision) -> ComputeKernels:
        fidelity = precision.math_fidelity
        return cls(
            {op: compute_config(ttnn, fidelity(op)) for op in MATMUL_GROUPS},
            compute_config(ttnn, fidelity("norm"), l1_acc=False),
            # fp32 accumulation in prefill SDPA overflows L1 at ~4.6K rows (seed design, measured); decode keeps it.
            compute_config(ttnn, fidelity("sdpa"), fp32_acc=False, l1_acc=False),
            compute_config(ttnn, fidelity("sdpa"), l1_acc=False),
        )


def core_range(ttnn: Any, x: int, y: int = 1) -> Any:
    """Cores (0,0)..(x-1,y-1)."""
    return ttnn.CoreRangeSet({ttnn.CoreRange(ttnn.CoreCoord(0, 0), ttnn.CoreCoord(x - 1, y - 1))})


def dram_sharded_weight(ttnn: Any, k: int, n_padded: int, banks: int) -> Any:
    """DRAM WIDTH_SHARDED memory config of a `[K, N_p]` weight: `[K, N_p / banks]` per bank."""
    spec = ttnn.ShardSpec(core_range(ttnn, banks), (k, n_padded // banks), ttnn.ShardOrientation.ROW_MAJOR)
    return ttnn.MemoryConfig(ttnn.TensorMemoryLayout.WIDTH_SHARDED, ttnn.BufferType.DRAM, spec)


def width_sharded(ttnn: Any, width: int, grid: CoreGrid) -> Any:
    """L1 WIDTH_SHARDED config of a `[32, width]` activation row block split over `grid`."""
    return ttnn.create_sharded_memory_config(
        shape=(TILE, width // grid.cores),
        core_grid=ttnn.CoreGrid(x=grid.x, y=grid.y),
        strategy=ttnn.ShardStrategy.WIDTH,
        orientation=ttnn.ShardOrientation.ROW_MAJOR,
        use_height_and_width_as_shard_shape=True,
    )


def height_sharded(ttnn: Any, rows: int, width: int, grid: CoreGrid) -> Any:
    """L1 HEIGHT_SHARDED config: `rows` x `width` per core over `grid`."""
    return ttnn.create_sharded_memory_config(
        shape=(rows, width),
        core_grid=ttnn.CoreGrid(x=grid.x, y=grid.y),
        strategy=ttnn.ShardStrategy.HEIGHT,
        orientation=ttnn.ShardOrientation.ROW_MAJOR,
        use_height_and_width_as_shard_shape=True,
    )


def per_row_sharded(ttnn: Any, rows: int, shard_rows: int, width: int, grid_x: int = 8) -> Any:
    """L1 HEIGHT_SHARDED config of `rows` shards of `shard_rows` x `width`, one per core, row-wise from (0, 0)
    over `grid_x` columns (the decode rows' heads and rotary tables: any count 1..32, not only rectangles)."""
    grid = ttnn.CoreCoord(min(rows, grid_x), -(-rows // grid_x))
    cores = ttnn.num_cores_to_corerangeset(rows, grid, row_wise=True)
    spec = ttnn.ShardSpec(cores, (shard_rows, width), ttnn.ShardOrientation.ROW_MAJOR)
    return ttnn.MemoryConfig(ttnn.TensorMemoryLayout.HEIGHT_SHARDED, ttnn.BufferType.L1, spec)


def decode_matmul(ttnn: Any, mm: DecodeMatmul) -> Any:
    """DRAM-sharded program config of one decode matmul (SiLU fused into the gate projection)."""
    return ttnn.MatmulMultiCoreReuseMultiCastDRAMShardedProgramConfig(
        in0_block_w=mm.in0_block_w,
        per_core_M=1,
        per_core_N=mm.per_core_n,
        fused_activation=ttnn.UnaryOpType.SILU if mm.fused_silu else None,
        num_workers_per_dram_bank=mm.workers_per_bank,
    )


def _mcast_1d(ttnn: Any, grid: CoreGrid, in0_block_w: int, per_core_n: int, **kw: Any) -> Any:
    """A 1D multicast (activations broadcast, N split over `grid`) config for one tile row of activations."""
    return ttnn.MatmulMultiCoreReuseMultiCast1DProgramConfig(
        compute_with_storage_grid_size=ttnn.CoreCoord(grid.x, grid.y),
        in0_block_w=in0_block_w,
        out_subblock_h=1,
        per_core_M=1,
        per_core_N=per_core_n,
        fused_activation=None,
        mcast_in0=True,
        **kw,
    )


def head_matmul(ttnn: Any, mm: HeadMatmul) -> Any:
    """1D multicast program config of the lm_head (interleaved weight, one tile row of activations)."""
    return _mcast_1d(
        ttnn, mm.grid, mm.in0_block_w, mm.per_core_n, out_subblock_w=mm.out_subblock_w, fuse_batch=True
    )


def sparse_matmul(ttnn: Any, mm: SparseMatmul) -> Any:
    """1D multicast program config of an MoE `sparse_matmul` (one 32-row tile of activations per batch)."""
    return _mcast_1d(
        ttnn,
        mm.grid,
        mm.in0_block_w,
        mm.per_core_n,
        out_subblock_w=1,
        out_block_h=1,
        out_block_w=mm.per_core_n,
        fuse_batch=False,
    )


def prefill_matmul(ttnn: Any, mm: PrefillMatmul) -> Any:
    return ttnn.MinimalMatmulConfig(
        M_block_size=mm.m_block,
        K_block_size=mm.k_block,
        N_block_size=mm.n_block,
        subblock_h=mm.subblock_h,
        subblock_w=mm.subblock_w,
        compute_with_storage_grid_size=ttnn.CoreCoord(mm.grid.x, mm.grid.y),
    )


def sharded_norm(ttnn: Any, grid: CoreGrid, block_w: int, subblock_w: int) -> Any:
    return ttnn.LayerNormShardedMultiCoreProgramConfig(
        compute_with_storage_grid_size=ttnn.CoreCoord(grid.x, grid.y),
        subblock_w=subblock_w,
        block_h=1,
        block_w=block_w,
        inplace=False,
    )


def sdpa(ttnn: Any, grid: CoreGrid, q_chunk: int, k_chunk: int) -> Any:
    return ttnn.SDPAProgramConfig(
        compute_with_storage_grid_size=ttnn.CoreCoord(grid.x, grid.y),
        q_chunk_size=q_chunk,
        k_chunk_size=k_chunk,
        exp_approx_mode=False,
    )
