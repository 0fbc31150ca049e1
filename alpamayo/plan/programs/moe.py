"""Plan of the ttnn MoE block of the sparse layers (`alpamayo.tt.moe`; pure Python: no ttnn, no device).

`plan_moe` plans router, gate/up and down as `ttnn.sparse_matmul` 1D multicasts with N split over at most 8x8
cores (tt-metal's single-chip MoE1D layout), and refuses block configs the one-chip block does not implement.
"""

from __future__ import annotations

from dataclasses import dataclass

from alpamayo.config.model import ModelConfig
from alpamayo.config.moe import MoEBlockConfig
from alpamayo.plan.device_spec import P150, TILE, DeviceSpec, round_up
from alpamayo.plan.precision import Precision
from alpamayo.plan.programs.grid import (
    CoreGrid,
    PlanError,
    device_grid,
    grid_dividing,
    l1_budget,
    largest_block,
    mcast_l1,
    model_name,
)
from alpamayo.plan.weights import padded_hidden

SPARSE_MAX_GRID = (8, 8)  # sparse_matmul 1D multicast grid (tt-metal MoE1D: cores dividing N within 8x8)


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
            f"[{self.hidden_padded}, {b.num_routed_experts}]; mesh {list(_mesh(b))}",
            f"MoE {self.gate_up.describe()}",
            f"MoE {self.down.describe()}",
        ]


def _mesh(block: MoEBlockConfig) -> tuple[int, int]:
    """`block.mesh_shape`, which `MoEBlockConfig` resolves on construction (None there is a bug)."""
    if block.mesh_shape is None:
        raise ValueError("MoEBlockConfig.mesh_shape is None: it is resolved on construction")
    return block.mesh_shape


def _sparse_matmul(name: str, k: int, n: int, dtype: str, device: DeviceSpec) -> SparseMatmul:
    k_tiles, n_tiles = k // TILE, n // TILE
    grid = grid_dividing((n_tiles,), device_grid(device, SPARSE_MAX_GRID))
    per_core_n = n_tiles // grid.cores
    block_w = largest_block(k_tiles, lambda b: mcast_l1(b, per_core_n, dtype), device)
    if block_w is not None:
        return SparseMatmul(name, k, n, grid, block_w, per_core_n, mcast_l1(block_w, per_core_n, dtype))
    raise PlanError(
        f"MoE {name} [E, {k}, {n}] ({dtype}): {per_core_n} output tiles per core on {grid} need "
        f"{mcast_l1(1, per_core_n, dtype)} bytes "
        f"of L1; the budget is {l1_budget(device)} bytes ({device.name})"
    )


def plan_moe(
    cfg: ModelConfig, block: MoEBlockConfig, precision: Precision, device: DeviceSpec = P150
) -> MoEPlan:
    """Plan the MoE block `block` of `cfg`'s sparse layers on one chip; PlanError for what it does not run."""
    source = model_name(cfg)
    mesh = _mesh(block)
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
