"""What the golden mode checks of a call before computing it: the checks ttnn makes of the same call whose
failure would mean a different program on a card, so that golden mode refuses what the dry run refuses.

They cover what a host-side golden run can see: sharded memory configs against the tensors they hold (shard
shape, orientation of the split, the shard count against the cores: ttnn's sharded-buffer validation), tile
alignment, program configs against the matmul or SDPA they configure (K blocking, per-core output width
times cores, chunk sizes dividing the sequence), device-side indices in range (cache positions, embedding
rows, slice bounds) and dtype rules of the ops (block-float only in TILE layout, fill_cache's matching
dtypes). L1 and DRAM allocation, circular buffers and program creation are the dry run's alone
(`alpamayo.tt.dryrun`); `tests/test_tt_golden_dryrun.py` checks that golden mode and the dry run give every
op's output the same shape, dtype, layout and memory layout.
"""

from __future__ import annotations

import math
from typing import Any

from alpamayo.plan.device_spec import P150, TILE
from alpamayo.tt.golden.tensor import GoldenTensor


class GoldenCheckError(RuntimeError):
    """A call that ttnn would refuse (or that would compute something else on a card)."""


def _fail(message: str) -> None:
    raise GoldenCheckError(f"golden mode: {message}")


def placement(ttnn: Any, t: GoldenTensor) -> None:
    """A device tensor's memory config fits it: tile-aligned shards of the padded shape, split the way the
    layout says (HEIGHT: whole rows, WIDTH: whole columns), no more shards than cores."""
    mem = t.mem
    if mem is None or not mem.is_sharded():
        return
    spec = mem.shard_spec
    if spec is None:
        _fail(f"{mem.memory_layout} memory config without a shard spec for {t}")
    h, w = (int(d) for d in spec.shape)
    padded = t.padded
    height = math.prod(padded[:-1]) if len(padded) > 1 else 1
    width = padded[-1]
    cores = spec.grid.num_cores()
    if t.layout == ttnn.TILE_LAYOUT and (h % TILE or w % TILE):
        _fail(f"shard shape {(h, w)} of a TILE tensor {t} is not tile-aligned")
    if mem.memory_layout == ttnn.TensorMemoryLayout.HEIGHT_SHARDED:
        if w != width:
            _fail(f"height-sharded {t}: shard width {w} != tensor width {width}")
        shards = -(-height // h)
    elif mem.memory_layout == ttnn.TensorMemoryLayout.WIDTH_SHARDED:
        if h != height:
            _fail(f"width-sharded {t}: shard height {h} != tensor height {height}")
        shards = -(-width // w)
    else:
        return
    if shards > cores:
        _fail(f"{t} needs {shards} shards of {(h, w)} on {cores} cores")


def same_spec(op: str, src: GoldenTensor, dst: GoldenTensor) -> None:
    if tuple(src.value.shape) != tuple(dst.value.shape) or src.dtype != dst.dtype or src.layout != dst.layout:
        _fail(f"{op}: {src} does not match {dst} (shape, dtype and layout must agree)")


def same_shape(op: str, a: GoldenTensor, b: GoldenTensor) -> None:
    if tuple(a.value.shape) != tuple(b.value.shape):
        _fail(f"{op}: shapes {list(a.value.shape)} and {list(b.value.shape)} differ")


def same_shape_as(op: str, t: GoldenTensor, shape: tuple[int, ...]) -> None:
    if tuple(t.value.shape) != tuple(shape):
        _fail(f"{op}: output tensor {t} for a result of shape {list(shape)}")


def broadcastable(op: str, a: GoldenTensor, b: GoldenTensor) -> None:
    """Element-wise operands broadcast only along size-1 dimensions of equal rank (ttnn's binary ops)."""
    sa, sb = tuple(a.value.shape), tuple(b.value.shape)
    if len(sa) != len(sb) or any(x != y and 1 not in (x, y) for x, y in zip(sa, sb, strict=True)):
        _fail(f"{op}: shapes {list(sa)} and {list(sb)} do not broadcast")


def slice_bounds(t: GoldenTensor, starts: Any, ends: Any) -> None:
    shape = tuple(t.value.shape)
    for s, e, n in zip(starts, ends, shape, strict=True):
        if not 0 <= int(s) < int(e) <= n:
            _fail(f"slice [{list(starts)}, {list(ends)}) outside {t}")


def fits(op: str, cache: GoldenTensor, batch: int, end: int, heads: int) -> None:
    shape = tuple(cache.value.shape)
    if not 0 <= batch < shape[0] or end > shape[2] or heads != shape[1]:
        _fail(f"{op}: batch {batch}, rows up to {end}, {heads} heads do not fit the cache {list(shape)}")


def _tiles(n: int) -> int:
    return -(-n // TILE)


def dest_tiles(compute_kernel_config: Any) -> int:
    """Output tiles one subblock may hold in the dest registers: 4 with fp32 accumulation, else 8 (half of
    the 16 bf16 tiles, double-buffered)."""
    return 4 if compute_kernel_config is not None and compute_kernel_config.fp32_dest_acc_en else 8


def subblock(op: str, h: int, w: int, compute_kernel_config: Any) -> None:
    if h * w > dest_tiles(compute_kernel_config):
        _fail(
            f"{op}: an output subblock of {h}x{w} tiles exceeds the {dest_tiles(compute_kernel_config)} dest tiles"
        )


def matmul_program(ttnn: Any, op: str, a: GoldenTensor, b: GoldenTensor, pc: Any, ck: Any = None) -> None:
    """K agrees; a DRAM-sharded or 1D-multicast program config covers the output (per-core width x cores),
    blocks K evenly (`in0_block_w`) and fits its output subblock in the dest registers (compute-kernel
    config `ck`)."""
    k_a, k_b = a.padded[-1], b.padded[-2]
    if k_a != k_b:
        _fail(
            f"{op}: inner dimensions {a.value.shape[-1]} (padded {k_a}) and {b.value.shape[-2]} (padded {k_b})"
        )
    if pc is None:
        return
    k_tiles, n_tiles = _tiles(k_a), _tiles(b.padded[-1])
    if k_tiles % pc.in0_block_w:
        _fail(f"{op}: in0_block_w {pc.in0_block_w} does not divide K = {k_tiles} tiles")
    if isinstance(pc, ttnn.MatmulMultiCoreReuseMultiCastDRAMShardedProgramConfig):
        if a.mem is None or a.mem.memory_layout != ttnn.TensorMemoryLayout.WIDTH_SHARDED:
            _fail(f"{op}: a DRAM-sharded matmul reads a width-sharded input, got {a}")
        if b.mem is None or b.mem.buffer_type != ttnn.BufferType.DRAM or not b.mem.is_sharded():
            _fail(f"{op}: a DRAM-sharded matmul reads a DRAM-sharded weight, got {b}")
        cores = a.mem.shard_spec.grid.num_cores()
        if pc.per_core_N * cores < n_tiles:
            _fail(f"{op}: per_core_N {pc.per_core_N} x {cores} cores < N = {n_tiles} tiles")
    elif isinstance(pc, ttnn.MatmulMultiCoreReuseMultiCast1DProgramConfig):
        grid = pc.compute_with_storage_grid_size
        cores = grid.x * grid.y
        if grid.x > P150.grid_x or grid.y > P150.grid_y:
            _fail(f"{op}: grid {grid.x}x{grid.y} exceeds the device's {P150.grid_x}x{P150.grid_y}")
        if pc.per_core_N * cores < n_tiles:
            _fail(f"{op}: per_core_N {pc.per_core_N} x {cores} cores < N = {n_tiles} tiles")
        if pc.per_core_N % pc.out_subblock_w:
            _fail(f"{op}: out_subblock_w {pc.out_subblock_w} does not divide per_core_N {pc.per_core_N}")
        subblock(op, pc.out_subblock_h, pc.out_subblock_w, ck)


def matmul_output_memory(ttnn: Any, a: GoldenTensor, value: Any, memory_config: Any, pc: Any) -> Any:
    """The output memory config of a matmul: `memory_config` (default DRAM interleaved), with the shard spec
    ttnn derives for a width-sharded output whose config names none (the DRAM-sharded decode matmul writes
    [M, N / cores] on each core of its input's grid)."""
    mem = memory_config or ttnn.DRAM_MEMORY_CONFIG
    if not mem.is_sharded() or mem.shard_spec is not None:
        return mem
    if mem.memory_layout != ttnn.TensorMemoryLayout.WIDTH_SHARDED or a.mem is None or not a.mem.is_sharded():
        _fail(f"matmul: cannot derive the {mem.memory_layout} output shards of {a}")
    grid = a.mem.shard_spec.grid
    rows = TILE * _tiles(value.shape[-2]) * math.prod(value.shape[:-2])
    width = TILE * _tiles(value.shape[-1]) // grid.num_cores()
    spec = ttnn.ShardSpec(grid, (rows, width), ttnn.ShardOrientation.ROW_MAJOR)
    return ttnn.MemoryConfig(ttnn.TensorMemoryLayout.WIDTH_SHARDED, mem.buffer_type, spec)


def minimal_matmul(
    ttnn: Any, a: GoldenTensor, w: GoldenTensor, bias: GoldenTensor | None, config: Any, ck: Any = None
) -> None:
    """The docstring's required invariants: TILE layout, the weight's leading dims 1, bias [.., N], block
    sizes positive and divisible by their subblocks, the grid within the device's; subblocks in the dest
    registers (compute-kernel config `ck`)."""
    for t in (a, w, *([bias] if bias is not None else [])):
        if t.layout != ttnn.TILE_LAYOUT:
            _fail(f"minimal_matmul reads TILE tensors, got {t}")
    if math.prod(w.value.shape[:-2]) != 1:
        _fail(f"minimal_matmul: the weight's leading dims must be 1, got {w}")
    if a.padded[-1] != w.padded[-2]:
        _fail(f"minimal_matmul: K {a.value.shape[-1]} against the weight {list(w.value.shape)}")
    if bias is not None and bias.value.shape[-1] != w.value.shape[-1]:
        _fail(f"minimal_matmul: bias {bias} for N = {w.value.shape[-1]}")
    if config is None:
        return
    sizes = (
        config.M_block_size,
        config.K_block_size,
        config.N_block_size,
        config.subblock_h,
        config.subblock_w,
    )
    if min(sizes) <= 0:
        _fail(f"minimal_matmul: block and subblock sizes must be > 0, got {sizes}")
    if config.M_block_size % config.subblock_h or config.N_block_size % config.subblock_w:
        _fail(f"minimal_matmul: subblocks {config.subblock_h}x{config.subblock_w} do not divide the blocks")
    subblock("minimal_matmul", config.subblock_h, config.subblock_w, ck)
    grid = config.compute_with_storage_grid_size
    if grid.x > P150.grid_x or grid.y > P150.grid_y:
        _fail(f"minimal_matmul: grid {grid.x}x{grid.y} exceeds the device's {P150.grid_x}x{P150.grid_y}")


def norm_program(ttnn: Any, op: str, x: GoldenTensor, pc: Any, memory_config: Any, ck: Any = None) -> None:
    """A sharded norm's program config covers the width-sharded input: block_w tiles per core x the cores =
    the width, subblock_w dividing block_w and fitting the dest registers; an interleaved norm runs on an
    interleaved input."""
    if pc is None:
        if x.mem is not None and x.mem.is_sharded():
            _fail(f"{op} of a sharded {x} needs a sharded program config")
        return
    if x.mem is None or x.mem.memory_layout != ttnn.TensorMemoryLayout.WIDTH_SHARDED:
        _fail(f"{op}: a sharded program config for a not width-sharded {x}")
    cores = x.mem.shard_spec.grid.num_cores()
    if pc.block_w * cores != _tiles(x.padded[-1]) or pc.block_w % pc.subblock_w:
        _fail(f"{op}: block_w {pc.block_w} x {cores} cores (subblock_w {pc.subblock_w}) for {x}")
    subblock(op, 1, pc.subblock_w, ck)


def sdpa_program(op: str, q: GoldenTensor, k: GoldenTensor, pc: Any) -> None:
    """Prefill SDPA chunks: q_chunk_size divides the query length and k_chunk_size the key length."""
    if pc is None:
        return
    sq, sk = q.padded[-2], k.padded[-2]
    if sq % pc.q_chunk_size or sk % pc.k_chunk_size:
        _fail(f"{op}: chunks {pc.q_chunk_size}/{pc.k_chunk_size} for {sq} query and {sk} key rows")


def cur_pos(op: str, positions: GoldenTensor | None, cache: GoldenTensor) -> None:
    """Flash-decode positions lie inside the cache (-1: a skipped user)."""
    if positions is None:
        return
    values = positions.value.reshape(-1)
    if values.numel() and (int(values.max()) >= cache.value.shape[-2] or int(values.min()) < -1):
        _fail(f"{op}: positions {values.tolist()} outside a cache of {cache.value.shape[-2]} rows")


def rotary(x: GoldenTensor, cos: GoldenTensor, sin: GoldenTensor, decode: bool) -> None:
    """rotary_embedding_hf: device tensors in TILE layout, head_dim 32 or a multiple of 64 (docstring)."""
    hd = x.padded[-1]
    if hd != TILE and hd % (2 * TILE):
        _fail(f"rotary_embedding_hf: padded head_dim {hd} is neither 32 nor a multiple of 64")
    if cos.padded[-1] != hd or sin.padded[-1] != hd:
        _fail(f"rotary_embedding_hf: cos/sin width {cos.padded[-1]} for head_dim {hd}")
    if decode and (x.mem is None or not x.mem.is_sharded()):
        _fail(f"rotary_embedding_hf decode mode reads height-sharded heads, got {x}")


def heads_decode_memory(ttnn: Any, users: int, head_dim: int, memory_config: Any) -> Any:
    """nlp_create_qkv_heads_decode's outputs: height-sharded, one user's [32, hd] heads tile per core."""
    if memory_config is not None and memory_config.shard_spec is not None:
        return memory_config
    return _one_tile_per_core(ttnn, users, (TILE, head_dim), ttnn.TensorMemoryLayout.HEIGHT_SHARDED)


def concat_heads_decode_memory(ttnn: Any, heads: int, head_dim: int) -> Any:
    """nlp_concat_heads_decode's output: width-sharded by head ("default width sharded by num heads")."""
    return _one_tile_per_core(ttnn, heads, (TILE, head_dim), ttnn.TensorMemoryLayout.WIDTH_SHARDED)


def _one_tile_per_core(ttnn: Any, cores: int, shape: tuple[int, int], layout: Any) -> Any:
    grid = ttnn.CoreCoord(P150.grid_x, P150.grid_y)
    spec = ttnn.ShardSpec(
        ttnn.num_cores_to_corerangeset(cores, grid, row_wise=True), shape, ttnn.ShardOrientation.ROW_MAJOR
    )
    return ttnn.MemoryConfig(layout, ttnn.BufferType.L1, spec)
