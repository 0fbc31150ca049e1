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
    `alpamayo.tt.weights`), so every hidden size plans; the fused QKV row must still split over the banks.

`plan_expert` plans the flow-matching action expert's Euler step beside the VLM's KV cache (see
`ExpertPlan`). `plan_moe` plans the MoE block of sparse layers (`alpamayo.tt.moe`): router, gate/up and down as
`ttnn.sparse_matmul` 1D multicasts with N split over at most 8x8 cores (tt-metal's single-chip MoE1D layout),
and refuses block configs the one-chip block does not implement. `plan_vision` plans the vision tower
(`alpamayo.tt.vision`): padded head width, patch-count padding and the prefill-style matmuls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from alpamayo.config import ModelConfig, TextConfig, VisionConfig
from alpamayo.errors import ConfigError
from alpamayo.expert.config import ExpertConfig, validate_against_vlm
from alpamayo.moe.config import MoEBlockConfig, block_config_for
from alpamayo.prediction import FUTURE_STEPS
from alpamayo.tt.device_spec import P150, TILE, DeviceSpec, round_up
from alpamayo.tt.expert_weights import EXPERT_BANKS
from alpamayo.tt.precision import TILE_BYTES, Precision
from alpamayo.tt.weights import padded_hidden, rotary_head_dim

DECODE_MAX_GRID = (8, 10)  # activation grids of the decode matmuls and norms (seed: 8x10 = 80 cores)
PREFILL_MAX_GRID = (11, 10)  # minimal_matmul, SDPA and lm_head grid
KV_FILL_MAX_GRID = (8, 8)
SPARSE_MAX_GRID = (8, 8)  # sparse_matmul 1D multicast grid (tt-metal MoE1D: cores dividing N within 8x8)
VISION_PAD = 128  # patches per vision forward are padded to this multiple (SDPA chunks, 4-row merge)
VISION_SDPA_CHUNK = 128  # q and k chunk of the vision tower's windowed SDPA: divides every padded length
# block MLP activations the device computes exactly: hidden_act -> the `ttnn.GeluVariant` member that does
VISION_GELU = {"gelu_pytorch_tanh": "Tanh", "gelu": "Accurate"}
SDPA_DECODE_GRID = (8, 8)
SDPA_DECODE_K_CHUNK = 128
# query positions per block flash-decode (`TextDecode._block_sdpa`): its circular buffers grow with them, and
# 32 positions ask 4.08 MB of L1 per core at k_chunk 128 (1.46 MB there; the dry run's op check, 8B shape), so
# a block of up to 32 rows reads the context's K/V once per 8 rows (the DFlash block size: once per block)
BLOCK_SDPA_POSITIONS = 8
PREFILL_PAD = 128  # prompts are padded to a multiple of this many rows
# Alpamayo samples up to 16 trajectories per prediction (1.5 README: K = 16 in ~40 GB on an H100); one p150
# holds the 16 x 64 rows' activations and K/V region easily (alpamayo.tt.memory).
MAX_EXPERT_SAMPLES = 16
# largest in0_block_w / minimal_matmul block in tiles (tt_transformers' find_largest_divisor cap)
MAX_BLOCK = 8
DEST_TILES = 4  # dest-register tiles with fp32 accumulation: bounds a matmul output subblock (h * w)
# L1 kept free beside the planned circular buffers (allocator alignment, semaphores, kernel config buffers).
L1_HEADROOM = 64 * 1024
# Trace region: tt-metal's Qwen3-VL-32B decode trace takes 28,467,200 B for 64 layers (~445 KB per layer);
# 1 MiB per layer plus 8 MiB for embedding, head and logits leaves more than 2x headroom.
TRACE_BYTES_PER_LAYER = 1 << 20
TRACE_BYTES_FIXED = 8 << 20


class PlanError(ConfigError):
    """The model, recipe and device cannot be planned: the message names the dimension and the rule."""


def flash_decode_cores(grid: CoreGrid, users: int) -> int:
    """Cores a flash-decode (`ttnn.transformer.scaled_dot_product_attention_decode`, paged or not) of `users`
    batch rows keeps busy on `grid`: its program factory gives each user grid.cores // users of them (split
    over the user's K/V heads, then the keys) and leaves the remainder idle."""
    return grid.cores // users * users


def sdpa_cores(grid_cores: int, units: int) -> float:
    """Cores busy on average in a prefill-style SDPA (`ttnn.transformer.scaled_dot_product_attention`, which
    parallelizes over batch, query heads and Q chunks only) of `units` = batch x heads x Q chunks work units
    on a grid of `grid_cores`: units / the waves they take (fewer units than cores leave the rest idle)."""
    return units / -(-units // grid_cores)


def block_sdpa_applies(n_heads: int) -> bool:
    """Whether a verify block's attention reads the context's K/V once per `BLOCK_SDPA_POSITIONS` rows
    (`TextDecode._block_sdpa`): where the query heads of one position fit one tile (the Qwen3-VL text
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
class CoreGrid:
    x: int
    y: int

    @property
    def cores(self) -> int:
        return self.x * self.y

    def __str__(self) -> str:
        return f"{self.x}x{self.y}"


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
class PrefillMatmul:
    """`minimal_matmul` block sizes (tiles) for one `[M, K] x [K, N]` prefill matmul."""

    grid: CoreGrid
    m_block: int
    k_block: int
    n_block: int
    subblock_h: int
    subblock_w: int


@dataclass(frozen=True)
class TextPlan:
    """Every grid and block size of one model on one device (see module docstring)."""

    model: str
    device: DeviceSpec
    hidden_padded: int  # width of the residual stream (`alpamayo.tt.weights.padded_hidden`)
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
    # a verify block's attention (`TextDecode._block_sdpa`): Q and the output interleaved in DRAM, so nothing
    # ties it to the decode rows' 8x8 height-sharded heads and it takes the whole grid, 2x the cores at 8 K/V
    # heads; its padded FLOPs are compute-bound at 8 rows (`alpamayo.tt.estimate.verify_estimate`)
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
        return _prefill_matmul(self.prefill_grid, m, k, n)

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


def model_name(cfg: ModelConfig) -> str:
    """Short name of a config for reports: the checkpoint directory, or the built-in config's name."""
    path = Path(cfg.source or "config")
    return path.parent.name if path.name == "config.json" else path.stem


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def _rectangle(cores: int, max_x: int, max_y: int) -> CoreGrid | None:
    """`cores` as an x-by-y rectangle (fewest rows) within max_x columns and max_y rows, if possible."""
    for y in range(1, max_y + 1):
        if cores % y == 0 and cores // y <= max_x:
            return CoreGrid(cores // y, y)
    return None


def _grid_dividing(tiles: tuple[int, ...], max_grid: tuple[int, int]) -> CoreGrid:
    """Largest rectangular grid within max_grid whose core count divides every count in `tiles`."""
    common = math.gcd(*tiles)
    for cores in range(min(common, max_grid[0] * max_grid[1]), 0, -1):
        if common % cores == 0 and (grid := _rectangle(cores, *max_grid)) is not None:
            return grid
    raise AssertionError("a 1x1 grid always divides")  # unreachable: cores = 1 is a rectangle


def _device_grid(device: DeviceSpec, max_grid: tuple[int, int]) -> tuple[int, int]:
    return min(device.grid_x, max_grid[0]), min(device.grid_y, max_grid[1])


def _l1_budget(device: DeviceSpec) -> int:
    return device.l1_bytes - L1_HEADROOM


def _largest_block(k_tiles: int, l1: Callable[[int], int], device: DeviceSpec) -> int | None:
    """The largest in0_block_w (a divisor of k_tiles, at most MAX_BLOCK) whose `l1` bytes fit; None if none."""
    for block_w in range(min(k_tiles, MAX_BLOCK), 0, -1):
        if k_tiles % block_w == 0 and l1(block_w) <= _l1_budget(device):
            return block_w
    return None


def _mcast_l1(block_w: int, per_core_n: int, dtype: str) -> int:
    """L1 per core of a 1D multicast matmul: double-buffered activation and weight blocks, one output row
    block (bf16)."""
    bf16 = TILE_BYTES["bf16"]
    return 2 * block_w * bf16 + 2 * block_w * per_core_n * TILE_BYTES[dtype] + per_core_n * bf16


def _decode_matmul(
    name: str, k: int, n: int, dtype: str, device: DeviceSpec, fused_silu: bool = False
) -> DecodeMatmul:
    banks = device.dram_banks
    n_padded = round_up(n, TILE * banks)
    k_tiles, n_tiles = k // TILE, n_padded // TILE
    grid = _grid_dividing((k_tiles, n_tiles), _device_grid(device, DECODE_MAX_GRID))
    bank_tiles = n_tiles // banks
    workers = 2 if bank_tiles % 2 == 0 else 1
    per_core_n = n_tiles // grid.cores
    in_tiles = k_tiles // grid.cores

    def l1(block_w: int) -> int:
        # activation shard + output shard (bf16) + triple-buffered weight blocks of one worker's N slice
        return (in_tiles + per_core_n) * TILE_BYTES["bf16"] + 3 * block_w * (
            bank_tiles // workers
        ) * TILE_BYTES[dtype]

    block_w = _largest_block(in_tiles, l1, device)
    if block_w is not None:
        return DecodeMatmul(name, k, n, n_padded, grid, block_w, per_core_n, workers, fused_silu, l1(block_w))
    raise PlanError(
        f"decode {name} [{k}, {n_padded}] ({dtype}): the smallest in0_block_w needs {l1(1)} bytes of L1 per "
        f"core on grid {grid}; the budget is {_l1_budget(device)} bytes ({device.name})"
    )


def _head_matmul(k: int, n: int, dtype: str, device: DeviceSpec) -> HeadMatmul:
    n_padded = round_up(n, TILE)
    grid = CoreGrid(*_device_grid(device, PREFILL_MAX_GRID))
    k_tiles = k // TILE
    per_core_n = -(-(n_padded // TILE) // grid.cores)
    subblock_w = _largest_divisor(per_core_n, DEST_TILES)
    block_w = _largest_block(k_tiles, lambda b: _mcast_l1(b, per_core_n, dtype), device)
    if block_w is not None:
        return HeadMatmul(
            k, n_padded, grid, block_w, per_core_n, subblock_w, _mcast_l1(block_w, per_core_n, dtype)
        )
    raise PlanError(
        f"lm_head [{k}, {n_padded}] ({dtype}) on {grid}: {per_core_n} output tiles per core need "
        f"{_mcast_l1(1, per_core_n, dtype)} bytes "
        f"of L1; the budget is {_l1_budget(device)} bytes ({device.name})"
    )


@lru_cache(maxsize=256)
def _prefill_matmul(grid: CoreGrid, m: int, k: int, n: int) -> PrefillMatmul:
    m_tiles, k_tiles, n_tiles = -(-m // TILE), -(-k // TILE), -(-n // TILE)
    m_block = min(MAX_BLOCK, -(-m_tiles // grid.y))
    n_block = min(MAX_BLOCK, -(-n_tiles // grid.x))
    sub_h = 2 if m_block % 2 == 0 else 1
    sub_w = _largest_divisor(n_block, DEST_TILES // sub_h)
    return PrefillMatmul(grid, m_block, _largest_divisor(k_tiles, MAX_BLOCK), n_block, sub_h, sub_w)


@lru_cache(maxsize=256)
def _kv_fill_grid(n_kv: int, padded_length: int) -> CoreGrid:
    """Height-shard grid for filling [1, n_kv, Lp, head_dim]: n_kv * d cores, each holding Lp / d rows of
    one head (a whole number of tiles), as many cores as fit in 8x8."""
    max_x, max_y = KV_FILL_MAX_GRID
    row_tiles = padded_length // TILE
    for d in sorted((d for d in range(1, row_tiles + 1) if row_tiles % d == 0), reverse=True):
        if n_kv * d <= max_x * max_y and (grid := _rectangle(n_kv * d, max_x, max_y)) is not None:
            return grid
    raise PlanError(
        f"num_key_value_heads = {n_kv}: the prefill KV fill shards one head per core group and supports at "
        f"most {max_x * max_y} heads on an {max_x}x{max_y} grid"
    )


def _check_dims(t: TextConfig, dram_banks: int, source: str) -> None:
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
    _check_dims(t, device.dram_banks, source)
    hp = padded_hidden(t, device.dram_banks)
    h_tiles = hp // TILE
    residual = _grid_dividing((h_tiles,), _device_grid(device, DECODE_MAX_GRID))
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
        norm_subblock_w=_largest_divisor(block_w, DEST_TILES),
        qkv=_decode_matmul("qkv", hp, t.q_dim + 2 * t.kv_dim, precision.dtype("qkv"), device),
        o=_decode_matmul("o", t.q_dim, hp, precision.dtype("o"), device),
        gate=mlp[0],
        up=mlp[1],
        down=mlp[2],
        moe=moe_plan,
        head=_head_matmul(hp, t.vocab_size, precision.dtype("lm_head"), device),
        prefill_grid=CoreGrid(*_device_grid(device, PREFILL_MAX_GRID)),
        sdpa_decode_grid=CoreGrid(*_device_grid(device, SDPA_DECODE_GRID)),
        block_sdpa_grid=CoreGrid(device.grid_x, device.grid_y),
        n_kv_heads=t.num_key_value_heads,
        trace_region_bytes=TRACE_BYTES_PER_LAYER * t.num_hidden_layers + TRACE_BYTES_FIXED,
    )


# ---------------------------------------------------------------------------------------------- MoE


@dataclass(frozen=True)
class SparseMatmul:
    """One `ttnn.sparse_matmul` of 32-row activation tiles by expert weights `[1, E, K, N]`: a 1D multicast
    over `grid` with N split evenly across its cores (`per_core_n` tiles each)."""

    name: str
    k: int
    n: int
    grid: CoreGrid
    in0_block_w: int
    per_core_n: int
    l1_bytes: int

    def describe(self) -> str:
        return (
            f"{self.name:<8} [32, {self.k}] x [E, {self.k}, {self.n}] grid {self.grid} in0_block_w "
            f"{self.in0_block_w} per_core_N {self.per_core_n}; L1 ~{self.l1_bytes / 1024:.0f} KiB/core"
        )


@dataclass(frozen=True)
class MoEPlan:
    """The one-chip MoE block of every sparse layer: its validated config and sparse-matmul configs.

    Decode routes the token's 32-row tile to its k experts (sparsity with exactly k nonzeros); prefill groups
    the prompt's (token, expert) rows by expert in 32-row groups and runs each group with its expert only."""

    block: MoEBlockConfig
    hidden_padded: int
    intermediate_padded: int
    gate_up: SparseMatmul
    down: SparseMatmul

    def describe(self) -> list[str]:
        b = self.block
        return [
            f"MoE: {b.num_routed_experts} experts, top-{b.select_experts_k}, router fp32 logits on "
            f"[{self.hidden_padded}, {b.num_routed_experts}]; mesh {list(b.mesh_shape)}",
            f"MoE {self.gate_up.describe()}",
            f"MoE {self.down.describe()}",
        ]


def _sparse_matmul(name: str, k: int, n: int, dtype: str, device: DeviceSpec) -> SparseMatmul:
    k_tiles, n_tiles = k // TILE, n // TILE
    grid = _grid_dividing((n_tiles,), _device_grid(device, SPARSE_MAX_GRID))
    per_core_n = n_tiles // grid.cores
    block_w = _largest_block(k_tiles, lambda b: _mcast_l1(b, per_core_n, dtype), device)
    if block_w is not None:
        return SparseMatmul(name, k, n, grid, block_w, per_core_n, _mcast_l1(block_w, per_core_n, dtype))
    raise PlanError(
        f"MoE {name} [E, {k}, {n}] ({dtype}): {per_core_n} output tiles per core on {grid} need "
        f"{_mcast_l1(1, per_core_n, dtype)} bytes "
        f"of L1; the budget is {_l1_budget(device)} bytes ({device.name})"
    )


def plan_moe(
    cfg: ModelConfig, block: MoEBlockConfig, precision: Precision, device: DeviceSpec = P150
) -> MoEPlan:
    """Plan the MoE block `block` of `cfg`'s sparse layers on one chip; PlanError for what it does not run."""
    source = model_name(cfg)
    mesh = block.mesh_shape
    if mesh != (1, 1):
        raise PlanError(
            f"{source}: MoE mesh_shape {list(mesh)} ({mesh[0] * mesh[1]} devices): the ttnn MoE block runs on "
            f"one chip, mesh_shape [1, 1]. Several chips (experts sharded over the mesh, tokens dispatched to "
            f"their experts' devices and combined back, as tt-metal's TTMoEDecode) are not implemented"
        )
    if block.num_shared_experts:
        raise PlanError(
            f"{source}: num_shared_experts = {block.num_shared_experts}: the one-chip MoE block has routed "
            "experts only (Qwen3-VL-MoE has no shared experts); allowed: 0"
        )
    if block.has_bias:
        raise PlanError(
            f"{source}: has_bias = true: the one-chip MoE block has no expert biases; allowed: false"
        )
    if block.num_routed_experts % TILE:
        raise PlanError(
            f"{source}: num_routed_experts = {block.num_routed_experts}: the device router's softmax, top-k "
            f"and sparsity rows run over whole {TILE}-wide tiles; allowed: multiples of {TILE}"
        )
    t = cfg.text
    hp = padded_hidden(t, device.dram_banks)
    ip = round_up(block.intermediate_size, TILE)
    dtype = precision.dtype("experts")
    return MoEPlan(
        block=block,
        hidden_padded=hp,
        intermediate_padded=ip,
        gate_up=_sparse_matmul("gate/up", hp, ip, dtype, device),
        down=_sparse_matmul("down", ip, hp, dtype, device),
    )


# ---------------------------------------------------------------------------------------------- vision


@dataclass(frozen=True)
class VisionPlan:
    """Grids and padding of the vision tower on the device (prefill-style: every patch row at once)."""

    head_dim: int
    padded_head_dim: int
    grid: CoreGrid

    @staticmethod
    def padded_length(patches: int) -> int:
        return round_up(patches, VISION_PAD)

    def matmul(self, m: int, k: int, n: int) -> PrefillMatmul:
        return _prefill_matmul(self.grid, m, k, n)

    def describe(self) -> str:
        return (
            f"vision: head_dim {self.head_dim} padded to {self.padded_head_dim} lanes, patches padded to a "
            f"multiple of {VISION_PAD}, minimal_matmul + windowed SDPA (one window per frame) on {self.grid}"
        )


def plan_vision(vision: VisionConfig, device: DeviceSpec = P150, source: str = "vision_config") -> VisionPlan:
    """Plan the vision tower; PlanError if the device layout cannot hold it."""
    if vision.hidden_size % TILE:
        raise PlanError(
            f"{source}: vision hidden_size = {vision.hidden_size} must be a multiple of {TILE}: the device "
            "LayerNorm averages over whole tiles, so the width cannot be zero-padded"
        )
    if vision.head_dim % 2:
        raise PlanError(f"{source}: vision head_dim = {vision.head_dim} must be even for the 2-D rotary")
    if vision.hidden_act not in VISION_GELU:
        raise PlanError(
            f"{source}: vision hidden_act = {vision.hidden_act!r}; the device vision blocks support "
            f"{', '.join(VISION_GELU)}"
        )
    return VisionPlan(
        head_dim=vision.head_dim,
        padded_head_dim=rotary_head_dim(vision.head_dim),
        grid=CoreGrid(*_device_grid(device, PREFILL_MAX_GRID)),
    )


# ---------------------------------------------------------------------------------------------- action expert


@dataclass(frozen=True)
class ExpertPlan:
    """The action expert's Euler step on the device (prefill-style: all 64 x K action rows at once).

    The K samples' action rows form one [1, 1, rows, H_p] stream; sample b reads cache slot b (the text
    model's K rows decode as K slots, each at its own length). Each layer writes sample b's 64 K/V rows into
    slot b of the VLM cache at the fixed tile-aligned rows [region_start, region_start + region_rows) behind
    every prompt position (`TextPlan.cache_length(max_seq_len + 64)` rows per slot), so the captured step
    never depends on the prompt lengths. Sample b attends non-causally to columns [0, offset_b) of slot b
    plus its own region. NVIDIA's expert appends its K/V to the cache and crops them away again, which is the
    same computation.

    The attention is one paged flash-decode over the cache in place (`TTActionExpert._attend`), not a
    prefill-style SDPA: that one parallelizes over slots, heads and 32-row Q chunks only, 32 work units at
    K = 1 (16 heads x 2 chunks) on a 110-core grid, compute-bound at 1.42 ms a step against 0.51 ms of K/V
    reads (`alpamayo plan`, Alpamayo 1.5). Flash-decode splits the keys over cores too. Its users are the K
    slots' K/V heads (`users`), each a query of `q_tiles` tiles: the 64 action rows of the `group` query
    heads that K/V head serves (head-major: q [K, n_heads, 64, hd] read as [1, users, 64 x group, hd], the
    same tiles in order), every tile at the same causal bound (`spec_multi_pos_tiles`, one `cur_pos` per
    tile). The cache is read as pages of `region_rows` rows of one K/V head ([K x n_kv x pages, 1,
    region_rows, hd], the same tiles in order) and each user's page table (`page_table`) lists its own
    region's page first, then the slot's pages in order: its visible keys are then the logical positions
    [0, region_rows + offset), which the causal bound `cur_pos(offset)` cuts exactly, so no mask is read and
    the prefix's stale tail (the rest of its last page) lies past the bound. Softmax attention does not
    depend on the order of its keys. Only those positions' K chunks are read (`attended_rows`)."""

    samples: int
    rows: int  # action rows per step: FUTURE_STEPS x samples, whole tiles
    hidden_padded: int
    cache_rows: int  # rows of each layer's K / V per cache slot, expert region included
    region_start: int
    region_rows: int  # one sample's action rows, kept behind max_seq_len in every slot (one page)
    kv_heads: int
    group: int  # query heads per K/V head
    grid: CoreGrid  # the matmuls'
    sdpa_grid: CoreGrid  # the attention's: the whole device grid
    k_chunk: int
    trace_region_bytes: int

    @property
    def pages(self) -> int:
        """Pages of `region_rows` rows per slot and K/V head (the page table's width)."""
        return self.cache_rows // self.region_rows

    @property
    def users(self) -> int:
        """Flash-decode users: every slot's K/V heads."""
        return self.samples * self.kv_heads

    @property
    def q_tiles(self) -> int:
        """Query tiles per user: the 64 action rows of each of its `group` query heads."""
        return self.region_rows * self.group // TILE

    def page_table(self) -> list[list[int]]:
        """[users] rows of `pages` physical pages: user s x n_kv + g (slot s, K/V head g) reads its own
        region's page, then pages 0, 1, ... of its slot and head (the region's page last among them, never
        reached: the causal bound stops at max_seq_len)."""
        own = self.region_start // self.region_rows
        return [
            [base + own, *(base + j for j in range(self.pages - 1))]
            for base in (u * self.pages for u in range(self.users))
        ]

    def cur_pos(self, offset: int) -> int:
        """The causal bound (last visible logical key) of a sample at `offset`: its own region, then the
        prefix rows [0, offset) (0: an idle slot, its own region only)."""
        return self.region_rows + offset - 1

    def attended_rows(self, offset: int) -> int:
        """Cache rows per layer, K and V each, the attention reads for a sample at `offset`: its logical
        positions in whole K chunks."""
        return min(round_up(self.region_rows + offset, self.k_chunk), self.cache_rows)

    def describe(self) -> list[str]:
        return [
            f"expert step: {self.samples} sample(s) x {FUTURE_STEPS} action rows = {self.rows} rows, residual "
            f"{self.hidden_padded} wide, minimal_matmul on {self.grid}",
            f"expert attention: paged flash-decode over the VLM cache in place, sample b in slot b "
            f"({self.cache_rows} rows per layer and slot; own K/V at rows {self.region_start}.."
            f"{self.region_start + self.region_rows - 1}, read first), {self.users} users (slots x K/V heads) "
            f"of {self.q_tiles} query tiles on {self.sdpa_grid}, {flash_decode_cores(self.sdpa_grid, self.users)} "
            f"cores busy, k_chunk {self.k_chunk}; step trace region {self.trace_region_bytes / 2**20:.0f} MiB",
        ]


def expert_rows(samples: int) -> int:
    """Action rows of one Euler step for `samples` samples (one 64-row block each)."""
    return round_up(FUTURE_STEPS * samples, TILE)


def plan_expert(
    cfg: ModelConfig,
    expert: ExpertConfig,
    precision: Precision,
    max_seq_len: int,
    samples: int = 1,
    device: DeviceSpec = P150,
) -> ExpertPlan:
    """Plan the action expert of `cfg` beside its VLM's KV cache of `max_seq_len` positions; PlanError when
    the device layout cannot hold it (ConfigError when the expert does not fit the VLM at all)."""
    source = model_name(cfg)
    validate_against_vlm(expert, cfg.text)
    t = expert.text
    if t.moe is not None:
        raise PlanError(f"{source}: the action expert has MoE layers; the ttnn expert runs dense layers only")
    _check_dims(t, EXPERT_BANKS, f"{source} (action expert)")
    if t.hidden_size % TILE or expert.in_proj.hidden_size % TILE:
        raise PlanError(
            f"{source}: the action expert's hidden_size {t.hidden_size} and in-projection hidden_size "
            f"{expert.in_proj.hidden_size} must be multiples of {TILE}: its LayerNorm and RMSNorms average "
            "over whole tiles"
        )
    if not 1 <= samples <= MAX_EXPERT_SAMPLES:
        raise PlanError(
            f"samples = {samples}: the device expert runs 1..{MAX_EXPERT_SAMPLES} samples per batch"
        )
    rows, region = expert_rows(samples), expert_rows(1)
    cache_rows = TextPlan.cache_length(max_seq_len + region)
    group = t.num_attention_heads // t.num_key_value_heads
    if region * group // TILE > BLOCK_SDPA_POSITIONS:
        raise PlanError(
            f"{source}: the action expert has {group} query heads per K/V head; its attention runs one K/V "
            f"head's {region} x {group} query rows as at most {BLOCK_SDPA_POSITIONS} tiles of one flash-decode "
            f"user (L1), so at most {BLOCK_SDPA_POSITIONS * TILE // region} query heads per K/V head"
        )
    sdpa_grid = CoreGrid(device.grid_x, device.grid_y)
    if samples * t.num_key_value_heads > sdpa_grid.cores:
        raise PlanError(
            f"samples = {samples}: the expert's attention runs a flash-decode user per slot and K/V head, "
            f"{samples} x {t.num_key_value_heads} of them on {sdpa_grid.cores} cores; at most "
            f"{sdpa_grid.cores // t.num_key_value_heads} samples"
        )
    return ExpertPlan(
        samples=samples,
        rows=rows,
        hidden_padded=padded_hidden(t, EXPERT_BANKS),
        cache_rows=cache_rows,
        region_start=cache_rows - region,
        region_rows=region,
        kv_heads=t.num_key_value_heads,
        group=group,
        grid=CoreGrid(*_device_grid(device, PREFILL_MAX_GRID)),
        sdpa_grid=sdpa_grid,
        k_chunk=SDPA_DECODE_K_CHUNK,
        trace_region_bytes=TRACE_BYTES_PER_LAYER * t.num_hidden_layers + TRACE_BYTES_FIXED,
    )
