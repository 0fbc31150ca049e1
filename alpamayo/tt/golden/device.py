"""The golden mode's device: nothing is opened."""

from __future__ import annotations

from typing import Any

from alpamayo.plan.device_spec import P150
from alpamayo.tt.golden.namespace import GoldenTTNN


class GoldenDevice:
    """Stands where an opened p150 would: it answers what the planners read from a device (a p150's grid and
    DRAM banks, `alpamayo.plan.device_spec.P150`) and holds the `GoldenTTNN` its models call (`ttnn`), whose
    `calls` count the ops they ran."""

    def __init__(self, real_ttnn: Any, trace_region_size: int = 0):
        self._ttnn = real_ttnn
        self.ttnn = GoldenTTNN(real_ttnn)
        self.trace_region_size = trace_region_size
        self.closed = False

    def arch(self) -> Any:
        return self._ttnn.device.Arch.BLACKHOLE

    def compute_with_storage_grid_size(self) -> Any:
        return self._ttnn.CoreCoord(P150.grid_x, P150.grid_y)

    def dram_grid_size(self) -> Any:
        return self._ttnn.CoreCoord(P150.dram_banks, 1)

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return "GoldenDevice(Blackhole p150 in golden mode: no device opened)"
