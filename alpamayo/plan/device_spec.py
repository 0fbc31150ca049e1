"""What the planners know about the chip: compute grid, DRAM banks, capacity and bandwidth, L1 per core, and
the matmul rate the time estimates (`alpamayo.plan.estimate`) divide by.

`P150` is the planning default (no device needed); `DeviceSpec.from_device` reads the grid of an opened
device, so a harvested chip is planned for the cores it really has.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

TILE = 32  # tile edge: every device dimension is counted in 32x32 tiles
GIB = 1 << 30


def round_up(n: int, multiple: int) -> int:
    """`n` rounded up to a multiple of `multiple` (a whole number of tiles, banks, chunks)."""
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class DeviceSpec:
    """A single Tenstorrent chip as the planners see it (x = columns, y = rows of Tensix cores)."""

    name: str
    grid_x: int
    grid_y: int
    dram_banks: int
    dram_bytes: int
    l1_bytes: int
    dram_bandwidth: float  # bytes / s
    clock_hz: float
    matmul_flops_per_cycle: int  # per Tensix core, one LoFi pass (HiFi2/3/4 take 2/3/4 passes)

    @classmethod
    def from_device(cls, device: Any) -> DeviceSpec:
        """The opened device's compute grid and DRAM bank count; capacity, L1 and rates as on a p150."""
        grid = device.compute_with_storage_grid_size()
        return replace(
            P150,
            name=f"{P150.name} (device grid {grid.x}x{grid.y})",
            grid_x=grid.x,
            grid_y=grid.y,
            dram_banks=device.dram_grid_size().x,
        )


# Blackhole p150: 13x10 usable Tensix grid, 8 GDDR6 banks of 4 GiB (32 GiB, 512 GB/s), 1.5 MiB L1 per core,
# AI clock up to 1.35 GHz (docs.tenstorrent.com, Blackhole specifications). 140 cores x 1.35 GHz give the
# published 774 TFLOPS of 8-bit (block-float) math at 4096 FLOP per core per cycle, one LoFi pass; the
# published 16-bit figure (372-387 TFLOPS) is half of it, two passes.
P150 = DeviceSpec(
    name="Blackhole p150",
    grid_x=13,
    grid_y=10,
    dram_banks=8,
    dram_bytes=32 * GIB,
    l1_bytes=1536 * 1024,
    dram_bandwidth=512e9,
    clock_hz=1.35e9,
    matmul_flops_per_cycle=4096,
)
