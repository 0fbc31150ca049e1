"""One pre-norm decoder layer of the Qwen3-VL text model."""

from __future__ import annotations

import torch
from torch import nn

from alpamayo.text.attention import Attention, KVBlock
from alpamayo.text.kv_cache import KVCache
from alpamayo.text.norm import RMSNorm


class DecoderLayer(nn.Module):
    """h = x + attn(norm_in(x)); y = h + mlp(norm_post(h)). `mlp` is a dense SwiGLU or a sparse MoE block."""

    def __init__(self, attn: Attention, mlp: nn.Module, input_norm: RMSNorm, post_norm: RMSNorm):
        super().__init__()
        self.attn, self.mlp = attn, mlp
        self.input_norm, self.post_norm = input_norm, post_norm

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        start: int | list[int],
        stepwise: bool = False,
    ) -> torch.Tensor:
        """x [B, T, H] at cache positions from `start` (one int, or one per row) and `stepwise` as in
        `Attention.forward`."""
        h = x + self.attn(self.input_norm(x), cos, sin, cache, start, stepwise)
        return h + self.mlp(self.post_norm(h))

    def over_prefix(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, prefix: KVBlock
    ) -> torch.Tensor:
        """The same layer with non-causal attention over a read-only K/V prefix (`Attention.over_prefix`)."""
        h = x + self.attn.over_prefix(self.input_norm(x), cos, sin, prefix)
        return h + self.mlp(self.post_norm(h))
