"""Grids, block sizes and L1 budgets shared by the ttnn component plans (pure Python: no ttnn, no device).

The text backbone (`alpamayo.plan.programs.text`), its MoE block (`.moe`), the vision tower (`.vision`) and the
action expert (`.expert`) each plan their programs from these: the core grid of a matmul, the `minimal_matmul`
block sizes of a prefill-style matmul, the largest in0 block whose circular buffers fit L1, and the error a plan
raises when a model, recipe and device cannot run together.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from alpamayo.config.model import ModelConfig
from alpamayo.errors import ConfigError
from alpamayo.plan.device_spec import TILE, DeviceSpec
from alpamayo.plan.precision import TILE_BYTES

PREFILL_MAX_GRID = (11, 10)  # minimal_matmul, SDPA and lm_head grid
SDPA_DECODE_K_CHUNK = 128
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
class PrefillMatmul:
    """`minimal_matmul` block sizes (tiles) for one `[M, K] x [K, N]` prefill matmul."""

    grid: CoreGrid
    m_block: int
    k_block: int
    n_block: int
    subblock_h: int
    subblock_w: int


def model_name(cfg: ModelConfig) -> str:
    """Short name of a config for reports: the checkpoint directory, or the built-in config's name."""
    path = Path(cfg.source or "config")
    return path.parent.name if path.name == "config.json" else path.stem


def largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def rectangle(cores: int, max_x: int, max_y: int) -> CoreGrid | None:
    """`cores` as an x-by-y rectangle (fewest rows) within max_x columns and max_y rows, if possible."""
    for y in range(1, max_y + 1):
        if cores % y == 0 and cores // y <= max_x:
            return CoreGrid(cores // y, y)
    return None


def grid_dividing(tiles: tuple[int, ...], max_grid: tuple[int, int]) -> CoreGrid:
    """Largest rectangular grid within max_grid whose core count divides every count in `tiles`."""
    common = math.gcd(*tiles)
    for cores in range(min(common, max_grid[0] * max_grid[1]), 0, -1):
        if common % cores == 0 and (grid := rectangle(cores, *max_grid)) is not None:
            return grid
    raise AssertionError("a 1x1 grid always divides")  # unreachable: cores = 1 is a rectangle


def device_grid(device: DeviceSpec, max_grid: tuple[int, int]) -> tuple[int, int]:
    return min(device.grid_x, max_grid[0]), min(device.grid_y, max_grid[1])


def l1_budget(device: DeviceSpec) -> int:
    return device.l1_bytes - L1_HEADROOM


def largest_block(k_tiles: int, l1: Callable[[int], int], device: DeviceSpec) -> int | None:
    """The largest in0_block_w (a divisor of k_tiles, at most MAX_BLOCK) whose `l1` bytes fit; None if none."""
    for block_w in range(min(k_tiles, MAX_BLOCK), 0, -1):
        if k_tiles % block_w == 0 and l1(block_w) <= l1_budget(device):
            return block_w
    return None


def mcast_l1(block_w: int, per_core_n: int, dtype: str) -> int:
    """L1 per core of a 1D multicast matmul: double-buffered activation and weight blocks, one output row
    block (bf16)."""
    bf16 = TILE_BYTES["bf16"]
    return 2 * block_w * bf16 + 2 * block_w * per_core_n * TILE_BYTES[dtype] + per_core_n * bf16


@lru_cache(maxsize=256)
def plan_prefill_matmul(grid: CoreGrid, m: int, k: int, n: int) -> PrefillMatmul:
    m_tiles, k_tiles, n_tiles = -(-m // TILE), -(-k // TILE), -(-n // TILE)
    m_block = min(MAX_BLOCK, -(-m_tiles // grid.y))
    n_block = min(MAX_BLOCK, -(-n_tiles // grid.x))
    sub_h = 2 if m_block % 2 == 0 else 1
    sub_w = largest_divisor(n_block, DEST_TILES // sub_h)
    return PrefillMatmul(grid, m_block, largest_divisor(k_tiles, MAX_BLOCK), n_block, sub_h, sub_w)
