"""RMSNorm as Qwen3-VL computes it."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)), normalised over the last dim.

    The statistics are computed in float32 and the normalised value is cast back to the input dtype
    *before* the weight multiply, as transformers does; in bfloat16 the other order differs in the last bit.
    """

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = weight  # [dim]
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)
