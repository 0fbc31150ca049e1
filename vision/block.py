"""Modules of the Qwen3-VL vision tower: pre-LN transformer block with per-image attention, and patch mergers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from alpamayo.text.linear import Linear
from alpamayo.text.rope import apply_rotary

LAYER_NORM_EPS = 1e-6


class LayerNorm(nn.Module):
    """LayerNorm over the last dim with weight and bias (eps 1e-6, as every vision norm uses)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, LAYER_NORM_EPS)


def segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Sequence[int], scale: float
) -> torch.Tensor:
    """Bidirectional attention within each segment of consecutive rows (one segment per image frame).

    q, k, v [N, heads, head_dim] with N = sum(segments) -> [N, heads, head_dim]. Equal-length segments (the
    camera frames of a tick) run as one batched call; mixed lengths run one call per segment.
    """
    n, heads, d = q.shape
    if len(set(segments)) == 1:
        length = segments[0]
        q, k, v = (x.view(n // length, length, heads, d).transpose(1, 2) for x in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(1, 2).reshape(n, heads, d)
    outs = []
    for qs, ks, vs in zip(*(x.split(list(segments)) for x in (q, k, v)), strict=True):
        qs, ks, vs = (x.transpose(0, 1).unsqueeze(0) for x in (qs, ks, vs))
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, scale=scale)[0].transpose(0, 1))
    return torch.cat(outs)


class VisionAttention(nn.Module):
    """Fused qkv (rows [q | k | v], each all heads), rotary on q and k in float32, per-segment attention,
    output projection; every linear has a bias."""

    def __init__(self, qkv: Linear, proj: Linear, num_heads: int):
        super().__init__()
        self.qkv, self.proj, self.num_heads = qkv, proj, num_heads
        self.head_dim = proj.out_features // num_heads
        self.scale = self.head_dim**-0.5

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Sequence[int]
    ) -> torch.Tensor:
        """x [N, C]; cos/sin [N, head_dim] float32 -> [N, C]."""
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        cos, sin = cos[:, None], sin[:, None]
        q = apply_rotary(q.float(), cos, sin).to(x.dtype)
        k = apply_rotary(k.float(), cos, sin).to(x.dtype)
        return self.proj(segment_attention(q, k, v, segments, self.scale).reshape(n, -1))


class VisionMLP(nn.Module):
    """fc2(act(fc1(x))) for x [N, C]; `act` is the config's `hidden_act` (`vision.weights.ACTIVATIONS`)."""

    def __init__(self, fc1: Linear, fc2: Linear, act: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.fc1, self.fc2, self.act = fc1, fc2, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionBlock(nn.Module):
    """x = x + attn(norm1(x)); x = x + mlp(norm2(x))."""

    def __init__(self, norm1: LayerNorm, attn: VisionAttention, norm2: LayerNorm, mlp: VisionMLP):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Sequence[int]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Fuse each run of merge^2 consecutive patch rows (one merge block) into one language-model token.

    [N, C] -> [N / merge^2, out_hidden]: LayerNorm, view(-1, merge^2 * C), fc1, exact (erf) GELU, fc2.
    The main merger normalises each patch (over C) before the fuse; the DeepStack mergers normalise the fused
    row (over merge^2 * C) after it.
    """

    def __init__(self, norm: LayerNorm, fc1: Linear, fc2: Linear, post_shuffle_norm: bool):
        super().__init__()
        self.norm, self.fc1, self.fc2 = norm, fc1, fc2
        self.post_shuffle_norm = post_shuffle_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.fc1.in_features
        x = self.norm(x.view(-1, fused)) if self.post_shuffle_norm else self.norm(x).view(-1, fused)
        return self.fc2(F.gelu(self.fc1(x)))
