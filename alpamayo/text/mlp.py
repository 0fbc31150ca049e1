"""SwiGLU feed-forward block of the dense text decoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from alpamayo.text.linear import Linear


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up run as one fused [2I, H] matmul (gate rows first)."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
        super().__init__()
        self.gate_up = Linear(torch.cat([gate, up], 0))
        self.down = Linear(down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)
