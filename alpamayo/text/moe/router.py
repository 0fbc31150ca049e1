"""Top-k router of a Qwen3-VL-MoE sparse layer, exactly as transformers computes it."""

from __future__ import annotations

import torch
from torch import nn

from alpamayo.text.linear import Linear


class TopKRouter(nn.Module):
    """Scores and picks `k` experts per token.

    logits = x W^T in the model dtype (W: [E, H]); probs = softmax(logits) in float32; the k largest probs
    (ties broken by `torch.topk` itself, so the same experts as transformers win); renormalised to sum to 1
    *unconditionally* (transformers ignores `norm_topk_prob`); cast back to the model dtype.
    """

    def __init__(self, weight: torch.Tensor, k: int):
        super().__init__()
        num_experts = weight.shape[0]
        if not 1 <= k <= num_experts:
            raise ValueError(f"router top-k must be in [1, {num_experts}] (the number of experts), got {k}")
        self.proj = Linear(weight, role="router")
        self.k = k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (scores [T, k] in x's dtype, expert ids [T, k] int64), best first."""
        logits = self.proj(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top, ids = torch.topk(probs, self.k, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        return top.to(logits.dtype), ids
