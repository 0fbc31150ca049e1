"""The action expert: a Qwen3-VL text decoder without token embeddings whose 64 action tokens attend over the
VLM's KV cache, between an input projection of (noisy actions, flow time) and a linear velocity head.

    expert = load_expert(ckpt, expert_cfg, vlm.config.text, dtype=torch.bfloat16)   # alpamayo.expert.weights
    ctx = expert.context(vlm.text.cache, offsets=[...], rope_delta=vlm.text.rope_delta, cache_len=...)
    v = expert.velocity(x, t, ctx)            # x [K, 64, 2] float32, t [K] -> v [K, 64, 2]

How the tokens see the VLM (NVIDIA's `_build_expert_pos_ids_and_attn_mask` and `step_fn`):
  * row i reads VLM cache row i, positions 0 .. offset_i - 1 (prompt, reasoning and `<|traj_future_start|>`),
    and the 64 action tokens of its own row, bidirectionally; positions offset_i .. L-1 (filler decoded after
    that row finished) are masked;
  * expert layer l attends over VLM layer l's cached K/V (post k_norm and RoPE) plus its own 64 K/V. The cache
    is read in place: NVIDIA appends the 64 K/V and crops them again, we attend over the two blocks jointly
    (`alpamayo.text.attention.joint_attention`), which is the same softmax with no cache write or copy;
  * action token j of row i sits at position j + rope_delta + offset_i on all three M-RoPE rows;
  * no DeepStack injection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from alpamayo.config.expert import ACTION_DIMS, ExpertConfig
from alpamayo.expert.in_proj import ActionInProj
from alpamayo.text.kv_cache import KVCache
from alpamayo.text.layer import DecoderLayer
from alpamayo.text.linear import Linear
from alpamayo.text.norm import RMSNorm
from alpamayo.text.rope import MRope

BIAS_ROW_ALIGN = 16  # the CUDA attention kernel wants each bias row to start on a 16-element boundary


@dataclass
class ExpertContext:
    """What one sampling reads of a VLM cache, built once and reused by every Euler step.

    keys/values: per layer, views [B, nkv, L, D] of the cache rows (never copied); bias [B, 1, 1, L] additive
    (0 where visible, -inf after each row's offset); cos/sin [B, 1, T, D] of the action positions.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    bias: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    offsets: torch.Tensor  # [B] int64, the first masked cache position of each row
    positions: torch.Tensor  # [B, T] int64, the action tokens' M-RoPE position (equal on all three rows)

    @property
    def rows(self) -> int:
        return self.bias.shape[0]


class ActionExpert(nn.Module):
    """Decoder layers (alpamayo.text's, attending over a prefix), final RMSNorm, in- and out-projections."""

    def __init__(
        self,
        cfg: ExpertConfig,
        layers: Sequence[DecoderLayer],
        norm: RMSNorm,
        in_proj: ActionInProj,
        out_proj: Linear,
        n_tokens: int,
    ):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(layers)
        self.norm, self.in_proj, self.out_proj = norm, in_proj, out_proj
        self.n_tokens = n_tokens  # action tokens per row: the action space's waypoints (64)
        self.dtype, self.device = norm.weight.dtype, norm.weight.device
        self.rope = MRope(cfg.text, self.device)

    def context(
        self,
        cache: KVCache,
        offsets: Sequence[int] | torch.Tensor,
        rope_delta: int | Sequence[int] | torch.Tensor,
        cache_len: int,
    ) -> ExpertContext:
        """Read-only view of cache rows [0, B) for B = len(offsets), positions [0, cache_len).

        offsets[i]: row i's cache index of `<|traj_future_start|>` plus 1 (1 <= offsets[i] <= cache_len);
        rope_delta: the VLM's M-RoPE delta (one int, or one per row).
        """
        offsets = torch.as_tensor(offsets, dtype=torch.long).reshape(-1)
        rows = offsets.numel()
        if not 1 <= rows <= cache.max_batch:
            raise ValueError(
                f"the expert needs 1..{cache.max_batch} cache rows (one offset each), got {rows}"
            )
        if not 1 <= cache_len <= cache.max_seq_len:
            raise ValueError(f"cache_len must be in [1, {cache.max_seq_len}], got {cache_len}")
        if int(offsets.min()) < 1 or int(offsets.max()) > cache_len:
            raise ValueError(
                f"offsets must be in [1, cache_len={cache_len}] (after <|traj_future_start|>), got {offsets.tolist()}"
            )
        if len(cache.k) != len(self.layers):
            raise ValueError(f"the cache has {len(cache.k)} layers, the expert {len(self.layers)}")
        delta = torch.as_tensor(rope_delta, dtype=torch.long).reshape(-1).expand(rows)
        positions = torch.arange(self.n_tokens)[None, :] + (delta + offsets)[:, None]  # [B, T]
        cos, sin = self.rope.cos_sin_1d(positions.reshape(-1), self.dtype)
        d = cos.shape[-1]
        padded = -(-cache_len // BIAS_ROW_ALIGN) * BIAS_ROW_ALIGN
        bias = torch.zeros(rows, 1, 1, padded, dtype=self.dtype, device=self.device)[..., :cache_len]
        visible = torch.arange(cache_len)[None, :] < offsets[:, None]
        bias.masked_fill_(~visible.to(self.device).view(rows, 1, 1, cache_len), float("-inf"))
        return ExpertContext(
            keys=[k[:rows, :, :cache_len] for k in cache.k],
            values=[v[:rows, :, :cache_len] for v in cache.v],
            bias=bias,
            cos=cos.view(rows, 1, self.n_tokens, d),
            sin=sin.view(rows, 1, self.n_tokens, d),
            offsets=offsets,
            positions=positions,
        )

    @torch.inference_mode()
    def hidden(self, embeds: torch.Tensor, ctx: ExpertContext) -> torch.Tensor:
        """Token embeddings [B, T, H] -> final-normed hidden states [B, T, H]."""
        h = embeds
        for layer, k, v in zip(self.layers, ctx.keys, ctx.values, strict=True):
            h = cast(DecoderLayer, layer).over_prefix(h, ctx.cos, ctx.sin, (k, v, ctx.bias))
        return self.norm(h)

    @torch.inference_mode()
    def velocity(self, x: torch.Tensor, t: torch.Tensor, ctx: ExpertContext) -> torch.Tensor:
        """x [B, T, 2] float32 normalised actions at flow time t [B] -> velocity [B, T, 2] (model dtype)."""
        if tuple(x.shape) != (ctx.rows, self.n_tokens, ACTION_DIMS):
            raise ValueError(
                f"x must be [{ctx.rows}, {self.n_tokens}, {ACTION_DIMS}] (rows, waypoints, accel/curvature), "
                f"got {list(x.shape)}"
            )
        embeds = self.in_proj(x.to(self.device), t.to(self.device))
        return self.out_proj(self.hidden(embeds, ctx))
