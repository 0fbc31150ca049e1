"""Reading one sparse layer's expert tensors into the single in-memory layout, whatever the disk layout."""

from __future__ import annotations

import torch

from alpamayo.checkpoint import Getter, Shape, expert_layout
from alpamayo.config.model import TextConfig

GATE = "gate.weight"  # router [E, H]
GATE_UP = "experts.gate_up_proj"
DOWN = "experts.down_proj"


def expert_weights(cfg: TextConfig, prefix: str, get: Getter) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up [E, 2I, H], down [E, H, I]) of the sparse layer under `prefix` (e.g. 'language_model.layers.3.mlp.').

    In memory every expert is `[out_features, in_features]` like any linear weight, gate rows before up rows:
    transformers 5's layout. Hub files (transformers 4.57: gate_up [E, H, 2I], down [E, I, H]) are transposed
    once here; `alpamayo.checkpoint.expert_layout` detects which by shape and refuses anything else.
    """
    if cfg.moe is None:
        raise ValueError(f"{prefix}: expert weights need a text config with MoE settings (cfg.moe is None)")
    gate_up, down = get(prefix + GATE_UP), get(prefix + DOWN)
    if disk_layout(cfg, prefix, tuple(gate_up.shape), tuple(down.shape)) == "hub":
        gate_up, down = gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
    return gate_up, down


def disk_layout(cfg: TextConfig, prefix: str, gate_up: Shape, down: Shape) -> str:
    """On-disk layout ("hub" or "v5") of the fused expert tensors of shapes `gate_up` and `down` of the sparse
    layer under `prefix`: `alpamayo.checkpoint.expert_layout` at the config's expert dimensions."""
    moe = cfg.moe
    if moe is None:
        raise ValueError(f"{prefix}: a sparse layer's expert layout, but the text config names no experts")
    return expert_layout(
        prefix + "experts", gate_up, down, moe.num_experts, cfg.hidden_size, moe.moe_intermediate_size
    )


# Per-projection views of a sparse layer's fused expert tensors (suffixes under `language_model.layers.{i}.mlp.`),
# in the in-memory layout: gate and up [E, I, H], down [E, H, I]. They name no tensor on disk.
EXPERT_GATE = "experts.gate"
EXPERT_UP = "experts.up"
EXPERT_DOWN = "experts.down"
_VIEWS = (EXPERT_GATE, EXPERT_UP, EXPERT_DOWN)


class ExpertView:
    """A getter that also serves the per-projection expert views (`EXPERT_GATE`, ...), whatever the disk layout.

    A view is read through `expert_weights` (hub files transposed once); the last layer's pair of fused tensors
    is kept, so its three views cost one read. Every other name goes straight to `get`.
    """

    def __init__(self, cfg: TextConfig, get: Getter):
        self.cfg, self._get = cfg, get
        self._layer: tuple[str, tuple[torch.Tensor, torch.Tensor]] | None = None

    def __call__(self, name: str) -> torch.Tensor:
        prefix, _, view = name.rpartition("experts.")
        view = "experts." + view
        if view not in _VIEWS:
            return self._get(name)
        if self._layer is None or self._layer[0] != prefix:
            self._layer = (prefix, expert_weights(self.cfg, prefix, self._get))
        gate_up, down = self._layer[1]
        inter = gate_up.shape[1] // 2
        return {EXPERT_GATE: gate_up[:, :inter], EXPERT_UP: gate_up[:, inter:], EXPERT_DOWN: down}[view]


def fused_expert_tensors(
    gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of the views: (gate_up_proj, down_proj) in the on-disk `layout` ("hub" or "v5", see
    `alpamayo.checkpoint.expert_layout`) from gate, up [E, I, H] and down [E, H, I]."""
    gate_up = torch.cat([gate, up], dim=1)
    if layout == "hub":
        return gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
    return gate_up, down
