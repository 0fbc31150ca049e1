"""Interleaved multimodal rotary embedding (M-RoPE) of the Qwen3-VL text decoder.

Each token has three position rows (T, H, W); for text tokens the three are equal. Of the head_dim/2 = 64
frequencies, index j takes its position from
    H  if j % 3 == 1 and j < 3 * section[1]
    W  if j % 3 == 2 and j < 3 * section[2]
    T  otherwise                                  (section [24, 20, 20]: "012012...012" then "0000")
and the angle vector is duplicated to head_dim for the rotate-half rotation. transformers always uses this
interleaved layout (the `mrope_interleaved` flag is ignored), and so do we.
"""

from __future__ import annotations

import torch

from alpamayo.config.model import TextConfig


def inv_freq(theta: float, head_dim: int) -> torch.Tensor:
    """[head_dim/2] float32 inverse frequencies, computed exactly as transformers does."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def axis_of_frequency(section: tuple[int, int, int], n_freq: int) -> torch.Tensor:
    """[n_freq] long: which position row (0=T, 1=H, 2=W) drives each frequency."""
    axis = torch.zeros(n_freq, dtype=torch.long)
    axis[1 : 3 * section[1] : 3] = 1
    axis[2 : 3 * section[2] : 3] = 2
    return axis


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, head_dim] by cos/sin [T, head_dim] (already in x's dtype)."""
    return x * cos + rotate_half(x) * sin


class MRope:
    """cos/sin tables for 3-row position ids, in float32 then cast to the activation dtype (as transformers)."""

    def __init__(self, cfg: TextConfig, device: torch.device | str = "cpu"):
        self.inv_freq = inv_freq(cfg.rope_theta, cfg.head_dim).to(device)
        self.axis = axis_of_frequency(cfg.mrope_section, cfg.head_dim // 2).to(device)

    def cos_sin(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [3, T] (T, H, W rows) -> cos, sin [T, head_dim] in `dtype`."""
        freqs = position_ids.to(self.inv_freq.device)[..., None].float() * self.inv_freq  # [3, T, F]
        angles = freqs.gather(0, self.axis.view(1, 1, -1).expand(1, freqs.shape[1], -1))[0]  # [T, F]
        cos, sin = angles.cos(), angles.sin()
        return torch.cat((cos, cos), -1).to(dtype), torch.cat((sin, sin), -1).to(dtype)

    def cos_sin_1d(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Text-only positions [T] (all three rows equal) -> cos, sin [T, head_dim]."""
        return self.cos_sin(positions.view(1, -1).expand(3, -1), dtype)
