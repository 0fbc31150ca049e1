"""Reading one sparse layer's expert tensors into the single in-memory layout, whatever the disk layout."""

from __future__ import annotations

import torch

from alpamayo.checkpoint import expert_layout
from alpamayo.config import TextConfig
from alpamayo.text.weights import Getter

GATE = "gate.weight"  # router [E, H]
GATE_UP = "experts.gate_up_proj"
DOWN = "experts.down_proj"


def expert_weights(cfg: TextConfig, prefix: str, get: Getter) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up [E, 2I, H], down [E, H, I]) of the sparse layer under `prefix` (e.g. 'language_model.layers.3.mlp.').

    In memory every expert is `[out_features, in_features]` like any linear weight, gate rows before up rows:
    transformers 5's layout. Hub files (transformers 4.57: gate_up [E, H, 2I], down [E, I, H]) are transposed
    once here; `alpamayo.checkpoint.expert_layout` detects which by shape and refuses anything else.
    """
    moe = cfg.moe
    if moe is None:
        raise ValueError(f"{prefix}: expert weights need a text config with MoE settings (cfg.moe is None)")
    gate_up, down = get(prefix + GATE_UP), get(prefix + DOWN)
    layout = expert_layout(
        prefix + "experts",
        tuple(gate_up.shape),
        tuple(down.shape),
        moe.num_experts,
        cfg.hidden_size,
        moe.moe_intermediate_size,
    )
    if layout == "hub":
        gate_up, down = gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
    return gate_up, down
