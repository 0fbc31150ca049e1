"""Grid and program-config planner of the ttnn text backbone (pure Python: no ttnn, no device).

`plan_text(cfg, precision, device)` picks every grid and block size the device code uses and refuses an
impossible model/recipe/device combination with an error that names the dimension and the rule, before any
device call. Choices and the measurements behind them (seed design for Qwen3-VL-32B on one p150):

  * Decode matmuls are DRAM-sharded: the weight `[K, N_p]` is width-sharded over the DRAM banks and read by
    `workers_per_bank` cores per bank (2 measured fastest: QKV 0.140 ms, O 0.124 ms, gate 0.19 ms + 0.05 SiLU,
    down 0.175 ms per layer); the activation `[32, K]` is width-sharded in L1 over a grid of at most 8x10 = 80
    cores whose core count divides both K and N_p in tiles (else per_core_N * cores would not cover N).
  * The residual stream and its RMSNorms are width-sharded over the largest such grid dividing hidden.
  * The lm_head is an interleaved 1D-multicast matmul on 11x10 cores (2.3 ms for 32B; its vocabulary does not
    split over the DRAM banks), logits row 0 untilized on device.
  * Prefill matmuls are `minimal_matmul` on 11x10 (x >= 10 garbles the older 2D multicast matmul; minimal_matmul
    was measured correct and fastest there), causal SDPA on the same grid with 256-row chunks when the padded
    length allows, else 128. Prompts are padded to a multiple of 128.
  * The prefill K/V are height-sharded over at most 8x8 cores for `fill_cache` (interleaved multi-head inputs
    are mis-addressed: heads 1..7 corrupted, measured), each core holding rows of a single head.
  * The residual stream is `padded_hidden` wide (hidden rounded up to 32 x DRAM banks; see
    `alpamayo.plan.weights`), so every hidden size plans; the fused QKV row must still split over the banks.

A model with sparse layers plans their MoE block with `alpamayo.plan.programs.moe.plan_moe`; the vision tower
and the action expert have their own plans beside this one (`.vision`, `.expert`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from alpamayo.config.builtin import block_config_for
from alpamayo.config.model import ModelConfig, TextConfig
from alpamayo.config.moe import MoEBlockConfig
from alpamayo.plan.device_spec import P150, TILE, DeviceSpec, round_up
from alpamayo.plan.precision import TILE_BYTES, Precision
from alpamayo.plan.programs.grid import (
    DEST_TILES,
    PREFILL_MAX_GRID,
    SDPA_DECODE_K_CHUNK,
    TRACE_BYTES_FIXED,
    TRACE_BYTES_PER_LAYER,
    CoreGrid,
    PlanError,
    PrefillMatmul,
    device_grid,
    flash_decode_cores,
    grid_dividing,
    l1_budget,
    largest_block,
    largest_divisor,
    mcast_l1,
    model_name,
    plan_prefill_matmul,
    rectangle,
)
from alpamayo.plan.programs.moe import MoEPlan, plan_moe
from alpamayo.plan.weights import padded_hidden

DECODE_MAX_GRID = (8, 10)  # activation grids of the decode matmuls and norms (seed: 8x10 = 80 cores)
KV_FILL_MAX_GRID = (8, 8)
SDPA_DECODE_GRID = (8, 8)
# query positions per block flash-decode (`DecoderLayer.block_sdpa`): its circular buffers grow with them, and
# 32 positions ask 4.08 MB of L1 per core at k_chunk 128 (1.46 MB there; the dry run's op check, 8B shape), so
# a block of up to 32 rows reads the context's K/V once per 8 rows (the DFlash block size: once per block)
BLOCK_SDPA_POSITIONS = 8
PREFILL_PAD = 128  # prompts are padded to a multiple of this many rows


def block_sdpa_applies(n_heads: int) -> bool:
    """Whether a verify block's attention reads the context's K/V once per `BLOCK_SDPA_POSITIONS` rows
    (`DecoderLayer.block_sdpa`): where the query heads of one position fit one tile (the Qwen3-VL text
    configs up to 8B: 16 or 32 heads). Otherwise each row's flash-decode reads them itself."""
    return round_up(n_heads, TILE) == TILE


def check_decode_rows(rows: int, moe: bool) -> None:
    """ValueError for a decode program of `rows` rows (K samples, a verify block) on a model with sparse MoE
    layers (`moe`): the device MoE decode routes one token (`alpamayo.tt.moe.TTMoE.decode`). Pure Python, so
    the command line refuses a --samples before any weight is read (`alpamayo.backends.check_num_samples`)."""
    if rows > 1 and moe:
        raise ValueError(
            f"{rows} decode rows with MoE layers: the ttnn sparse expert step routes one token; "
            "allowed: 1 row on Qwen3-VL-MoE checkpoints"
        )


@dataclass(frozen=True)
class DecodeMatmul:
    """One DRAM-sharded decode matmul `[32, K] x [K, N_p]`; `grid` holds both the input and output shards."""

    name: str
    k: int
    n: int
    n_padded: int
    grid: CoreGrid
    in0_block_w: int
    per_core_n: int
    workers_per_bank: int
    fused_silu: bool
    l1_bytes: int

    def describe(self) -> str:
        silu = " +silu" if self.fused_silu else ""
        return (
            f"{self.name:<8} [{self.k}, {self.n_padded}] grid {self.grid} ({self.grid.cores} cores) "
            f"in0_block_w {self.in0_block_w} per_core_N {self.per_core_n} "
            f"workers/bank {self.workers_per_bank}{silu}; L1 ~{self.l1_bytes / 1024:.0f} KiB/core"
        )


@dataclass(frozen=True)
class HeadMatmul:
    """The lm_head `[32, hidden] x [hidden, V_p]` as a 1D multicast matmul over `grid`."""

    k: int
    n_padded: int
    grid: CoreGrid
    in0_block_w: int
    per_core_n: int
    out_subblock_w: int
    l1_bytes: int


@dataclass(frozen=True)
class TextPlan:
    """Every grid and block size of one model on one device (see module docstring)."""

    model: str
    device: DeviceSpec
    hidden_padded: int  # width of the residual stream (`alpamayo.plan.weights.padded_hidden`)
    residual_grid: CoreGrid
    norm_block_w: int
    norm_subblock_w: int
    qkv: DecodeMatmul
    o: DecodeMatmul
    gate: DecodeMatmul | None  # None when every layer is a sparse MoE block (then planned in `moe`)
    up: DecodeMatmul | None
    down: DecodeMatmul | None
    moe: MoEPlan | None  # the MoE block of the sparse layers; None for a dense model
    head: HeadMatmul
    prefill_grid: CoreGrid
    sdpa_decode_grid: CoreGrid
    # a verify block's attention (`DecoderLayer.block_sdpa`): Q and the output interleaved in DRAM, so nothing
    # ties it to the decode rows' 8x8 height-sharded heads and it takes the whole grid, 2x the cores at 8 K/V
    # heads; its padded FLOPs are compute-bound at 8 rows (`alpamayo.plan.estimate.verify_estimate`)
    block_sdpa_grid: CoreGrid
    n_kv_heads: int
    trace_region_bytes: int

    @property
    def decode_matmuls(self) -> list[DecodeMatmul]:
        return [m for m in (self.qkv, self.o, self.gate, self.up, self.down) if m is not None]

    def dense_mlp(self) -> tuple[DecodeMatmul, DecodeMatmul, DecodeMatmul]:
        """The gate, up and down matmuls of the dense layers; ValueError for a model that has none."""
        if self.gate is None or self.up is None or self.down is None:
            raise ValueError(f"{self.model}: every layer is a sparse MoE block, there is no dense MLP plan")
        return self.gate, self.up, self.down

    def prefill_matmul(self, m: int, k: int, n: int) -> PrefillMatmul:
        return plan_prefill_matmul(self.prefill_grid, m, k, n)

    @staticmethod
    def padded_length(length: int) -> int:
        return round_up(length, PREFILL_PAD)

    @staticmethod
    def prefill_sdpa_chunk(padded_length: int) -> int:
        """q/k chunk of the causal prefill SDPA: 256 when it divides the padded length, else 128."""
        return 256 if padded_length % 256 == 0 else 128

    @staticmethod
    def cache_length(max_seq_len: int) -> int:
        """KV cache rows: whole prefill pads and whole flash-decode K chunks."""
        return round_up(max_seq_len, math.lcm(PREFILL_PAD, SDPA_DECODE_K_CHUNK))

    def kv_fill_grid(self, padded_length: int) -> CoreGrid:
        return _kv_fill_grid(self.n_kv_heads, padded_length)

    def describe(self) -> list[str]:
        lines = [
            f"device: {self.device.name}, {self.device.grid_x}x{self.device.grid_y} cores, "
            f"{self.device.dram_banks} DRAM banks",
            f"decode residual stream ({self.hidden_padded} wide) + RMSNorm: width-sharded over {self.residual_grid} "
            f"({self.residual_grid.cores} cores), block_w {self.norm_block_w}, subblock_w {self.norm_subblock_w}",
            *(f"decode {m.describe()}" for m in self.decode_matmuls),
            f"decode lm_head  [{self.head.k}, {self.head.n_padded}] 1D mcast grid {self.head.grid} "
            f"in0_block_w {self.head.in0_block_w} per_core_N {self.head.per_core_n}; "
            f"L1 ~{self.head.l1_bytes / 1024:.0f} KiB/core",
            f"decode SDPA: flash-decode grid {self.sdpa_decode_grid}, k_chunk {SDPA_DECODE_K_CHUNK}; a verify "
            f"block's (where one position's heads fit a tile) on {self.block_sdpa_grid}, "
            f"{flash_decode_cores(self.block_sdpa_grid, self.n_kv_heads) // self.n_kv_heads} cores per K/V head; "
            f"trace region {self.trace_region_bytes / 2**20:.0f} MiB",
            f"prefill: minimal_matmul + causal SDPA on {self.prefill_grid}, length padded to a multiple of "
            f"{PREFILL_PAD}, SDPA chunk 256 (128 when 256 does not divide)",
        ]
        if self.moe is not None:
            lines += self.moe.describe()
        return lines


def _decode_matmul(
    name: str, k: int, n: int, dtype: str, device: DeviceSpec, fused_silu: bool = False
) -> DecodeMatmul:
    banks = device.dram_banks
    n_padded = round_up(n, TILE * banks)
    k_tiles, n_tiles = k // TILE, n_padded // TILE
    grid = grid_dividing((k_tiles, n_tiles), device_grid(device, DECODE_MAX_GRID))
    bank_tiles = n_tiles // banks
    workers = 2 if bank_tiles % 2 == 0 else 1
    per_core_n = n_tiles // grid.cores
    in_tiles = k_tiles // grid.cores

    def l1(block_w: int) -> int:
        # activation shard + output shard (bf16) + triple-buffered weight blocks of one worker's N slice
        return (in_tiles + per_core_n) * TILE_BYTES["bf16"] + 3 * block_w * (
            bank_tiles // workers
        ) * TILE_BYTES[dtype]

    block_w = largest_block(in_tiles, l1, device)
    if block_w is not None:
        return DecodeMatmul(name, k, n, n_padded, grid, block_w, per_core_n, workers, fused_silu, l1(block_w))
    raise PlanError(
        f"decode {name} [{k}, {n_padded}] ({dtype}): the smallest in0_block_w needs {l1(1)} bytes of L1 per "
        f"core on grid {grid}; the budget is {l1_budget(device)} bytes ({device.name})"
    )


def _head_matmul(k: int, n: int, dtype: str, device: DeviceSpec) -> HeadMatmul:
    n_padded = round_up(n, TILE)
    grid = CoreGrid(*device_grid(device, PREFILL_MAX_GRID))
    k_tiles = k // TILE
    per_core_n = -(-(n_padded // TILE) // grid.cores)
    subblock_w = largest_divisor(per_core_n, DEST_TILES)
    block_w = largest_block(k_tiles, lambda b: mcast_l1(b, per_core_n, dtype), device)
    if block_w is not None:
        return HeadMatmul(
            k, n_padded, grid, block_w, per_core_n, subblock_w, mcast_l1(block_w, per_core_n, dtype)
        )
    raise PlanError(
        f"lm_head [{k}, {n_padded}] ({dtype}) on {grid}: {per_core_n} output tiles per core need "
        f"{mcast_l1(1, per_core_n, dtype)} bytes "
        f"of L1; the budget is {l1_budget(device)} bytes ({device.name})"
    )


@lru_cache(maxsize=256)
def _kv_fill_grid(n_kv: int, padded_length: int) -> CoreGrid:
    """Height-shard grid for filling [1, n_kv, Lp, head_dim]: n_kv * d cores, each holding Lp / d rows of
    one head (a whole number of tiles), as many cores as fit in 8x8."""
    max_x, max_y = KV_FILL_MAX_GRID
    row_tiles = padded_length // TILE
    for d in sorted((d for d in range(1, row_tiles + 1) if row_tiles % d == 0), reverse=True):
        if n_kv * d <= max_x * max_y and (grid := rectangle(n_kv * d, max_x, max_y)) is not None:
            return grid
    raise PlanError(
        f"num_key_value_heads = {n_kv}: the prefill KV fill shards one head per core group and supports at "
        f"most {max_x * max_y} heads on an {max_x}x{max_y} grid"
    )


def check_dims(t: TextConfig, dram_banks: int, source: str) -> None:
    """What the device layers need of `t`, whose weights are padded to 32 x `dram_banks` columns."""
    bank_multiple = TILE * dram_banks
    if t.attention_bias:
        raise PlanError(
            f"{source}: attention_bias = true is not supported by the ttnn backend (Qwen3-VL attention has no "
            "biases); run this checkpoint with --backend torch"
        )
    if t.head_dim % TILE or (t.head_dim != TILE and t.head_dim % (2 * TILE)):
        raise PlanError(
            f"{source}: head_dim = {t.head_dim}; the device rotary (rotary_embedding_hf) needs 32 or a "
            f"multiple of 64"
        )
    qkv = t.q_dim + 2 * t.kv_dim
    if qkv % bank_multiple:
        raise PlanError(
            f"{source}: (num_attention_heads + 2 num_key_value_heads) x head_dim = {qkv} must be a multiple of "
            f"{bank_multiple}: the decode head split reads the fused QKV row unpadded"
        )


def plan_text(
    cfg: ModelConfig, precision: Precision, device: DeviceSpec = P150, moe: MoEBlockConfig | None = None
) -> TextPlan:
    """Plan the text backbone of `cfg` in `precision` on `device`; PlanError if it cannot run there.

    A model with sparse MoE layers is planned with its block config `moe` (default: `block_config_for`)."""
    t = cfg.text
    source = model_name(cfg)
    check_dims(t, device.dram_banks, source)
    hp = padded_hidden(t, device.dram_banks)
    h_tiles = hp // TILE
    residual = grid_dividing((h_tiles,), device_grid(device, DECODE_MAX_GRID))
    block_w = h_tiles // residual.cores
    dense = len(t.sparse_layers) < t.num_hidden_layers
    inter_p = round_up(t.intermediate_size, TILE * device.dram_banks)
    mlp = (
        (
            _decode_matmul(
                "gate", hp, t.intermediate_size, precision.dtype("mlp_gate_up"), device, fused_silu=True
            ),
            _decode_matmul("up", hp, t.intermediate_size, precision.dtype("mlp_gate_up"), device),
            _decode_matmul("down", inter_p, hp, precision.dtype("mlp_down"), device),
        )
        if dense
        else (None, None, None)
    )
    sparse = bool(t.sparse_layers)
    moe_plan = plan_moe(cfg, moe or block_config_for(t), precision, device) if sparse else None
    _kv_fill_grid(t.num_key_value_heads, PREFILL_PAD)  # refuses a head count the KV fill cannot shard
    return TextPlan(
        model=source,
        device=device,
        hidden_padded=hp,
        residual_grid=residual,
        norm_block_w=block_w,
        norm_subblock_w=largest_divisor(block_w, DEST_TILES),
        qkv=_decode_matmul("qkv", hp, t.q_dim + 2 * t.kv_dim, precision.dtype("qkv"), device),
        o=_decode_matmul("o", t.q_dim, hp, precision.dtype("o"), device),
        gate=mlp[0],
        up=mlp[1],
        down=mlp[2],
        moe=moe_plan,
        head=_head_matmul(hp, t.vocab_size, precision.dtype("lm_head"), device),
        prefill_grid=CoreGrid(*device_grid(device, PREFILL_MAX_GRID)),
        sdpa_decode_grid=CoreGrid(*device_grid(device, SDPA_DECODE_GRID)),
        block_sdpa_grid=CoreGrid(device.grid_x, device.grid_y),
        n_kv_heads=t.num_key_value_heads,
        trace_region_bytes=TRACE_BYTES_PER_LAYER * t.num_hidden_layers + TRACE_BYTES_FIXED,
    )
