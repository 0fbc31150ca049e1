"""Plan of the ttnn vision tower (`alpamayo.tt.vision`; pure Python: no ttnn, no device).

`plan_vision` picks the padded head width, the patch-count padding and the prefill-style matmuls' grid.
"""

from __future__ import annotations

from dataclasses import dataclass

from alpamayo.config.model import VisionConfig
from alpamayo.plan.device_spec import P150, TILE, DeviceSpec, round_up
from alpamayo.plan.programs.grid import (
    PREFILL_MAX_GRID,
    CoreGrid,
    PlanError,
    PrefillMatmul,
    device_grid,
    plan_prefill_matmul,
)
from alpamayo.plan.weights import rotary_head_dim

VISION_PAD = 128  # patches per vision forward are padded to this multiple (SDPA chunks, 4-row merge)
VISION_SDPA_CHUNK = 128  # q and k chunk of the vision tower's windowed SDPA: divides every padded length
# block MLP activations the device computes exactly: hidden_act -> the `ttnn.GeluVariant` member that does
VISION_GELU = {"gelu_pytorch_tanh": "Tanh", "gelu": "Accurate"}


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
        return plan_prefill_matmul(self.grid, m, k, n)

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
        grid=CoreGrid(*device_grid(device, PREFILL_MAX_GRID)),
    )
