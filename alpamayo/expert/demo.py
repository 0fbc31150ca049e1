"""Random action-expert weights under a family's real tensor names, for demo and test checkpoints."""

from __future__ import annotations

import math

import torch

from alpamayo.config.expert import ExpertConfig


def random_expert_weights(cfg: ExpertConfig, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor of `cfg.weight_shapes()` (float32), drawn in name order from one seeded generator with
    `alpamayo.demo_checkpoint.randomize_weights`' rule: norm weights 1 + 0.1 N (every 1-D expert weight is a
    norm: RMSNorms, q/k norms, the trunk RMSNorms, the in-projection LayerNorm), biases 0.05 N, matrices
    N / sqrt(fan_in) (an MoE expert's fused experts: in the hub layout)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in sorted(cfg.weight_shapes().items()):
        noise = torch.randn(shape, generator=g)
        if len(shape) == 1:
            out[name] = 1.0 + 0.1 * noise if name.endswith(".weight") else 0.05 * noise
        else:  # fan-in: a linear's last dim; fused MoE experts in the hub layout [E, in, out] have it at dim 1
            out[name] = noise / math.sqrt(shape[1] if len(shape) == 3 else shape[-1])
    return out
