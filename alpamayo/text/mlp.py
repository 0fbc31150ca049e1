"""SwiGLU feed-forward block: the dense text decoder's MLP and each expert of a sparse MoE block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from alpamayo.text.linear import Linear


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up run as one fused [2I, H] matmul (gate rows first).

    gate, up: [I, H]; down: [H, I]. The optional biases ([I], [I], [H]) are added after each projection, as in
    MoE checkpoints whose experts carry them (`has_bias` in `alpamayo.config.moe`); Qwen3-VL has none.
    """

    def __init__(
        self,
        gate: torch.Tensor,
        up: torch.Tensor,
        down: torch.Tensor,
        gate_bias: torch.Tensor | None = None,
        up_bias: torch.Tensor | None = None,
        down_bias: torch.Tensor | None = None,
    ):
        super().__init__()
        if (gate_bias is None) != (up_bias is None):
            raise ValueError("SwiGLU needs both gate_bias and up_bias, or neither")
        gate_up_bias = None if gate_bias is None or up_bias is None else torch.cat([gate_bias, up_bias], 0)
        self.gate_up = Linear(torch.cat([gate, up], 0), gate_up_bias)
        self.down = Linear(down, down_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)
