"""The action expert's input projection (NVIDIA's `PerWaypointActionInProjV2`): noisy normalised actions and
the flow time -> one token embedding per waypoint.

    features(j) = [F(a_j) (20), F(k_j) (20), F(t) (20)]              60 per waypoint (release sizes)
    F(u)        = sqrt(2) * [sin(2 pi f u) x10, cos(2 pi f u) x10],   f = logspace(0, log10(max_freq), 10)
    embed(j)    = LayerNorm(trunk(features(j)))                       trunk: Linear, SiLU, (RMSNorm, Linear,
                                                                     SiLU) x (layers - 1), RMSNorm, Linear
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from alpamayo.config.expert import InProjConfig
from alpamayo.text.linear import Linear
from alpamayo.text.norm import RMSNorm

TRUNK_NORM_EPS = 1e-5  # NVIDIA's MLPEncoder RMSNorm
OUT_NORM_EPS = 1e-5  # torch.nn.LayerNorm default


def default_freqs(cfg: InProjConfig) -> torch.Tensor:
    """[num_freqs] float32 Fourier frequencies, rounded to bfloat16.

    NVIDIA's 1.5 model builds these buffers (non-persistent, so never in its checkpoint) while bfloat16 is the
    default dtype, so their values are bfloat16-rounded ([1, 1.671875, 2.78125, 4.65625, ...]) even when the
    model then runs in float32; we match that. R1 stores them (persistent buffers), and the stored values win.
    """
    freqs = torch.logspace(0, math.log10(cfg.max_freq), steps=cfg.num_freqs, dtype=torch.float32)
    return freqs.to(torch.bfloat16).float()


def fourier_features(u: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """u [...] -> [..., 2 * len(freqs)] float32: sqrt(2) [sin(2 pi f u), cos(2 pi f u)], sines first.

    The products run in NVIDIA's order, (u f) 2 pi, so float32 results agree bit for bit."""
    arg = u.float()[..., None] * freqs * 2 * torch.pi
    return torch.cat([torch.sin(arg), torch.cos(arg)], -1) * math.sqrt(2)


class ActionInProj(nn.Module):
    """x [B, T, A] normalised actions (float32) and t [B] flow times -> embeddings [B, T, hidden].

    `freqs`: one [num_freqs] table per action dimension, then one for t. `trunk`: the linears (weight
    [out, in], bias [out]) and the RMSNorm weights between them, in order. `norm`: LayerNorm weight, bias.
    """

    def __init__(
        self,
        freqs: Sequence[torch.Tensor],
        linears: Sequence[tuple[torch.Tensor, torch.Tensor]],
        trunk_norms: Sequence[torch.Tensor],
        norm: tuple[torch.Tensor, torch.Tensor],
    ):
        super().__init__()
        if len(trunk_norms) != len(linears) - 1:
            raise ValueError(
                f"the trunk needs one RMSNorm between linears: {len(linears)} linears, {len(trunk_norms)} norms"
            )
        self.freqs = [f.float().reshape(-1) for f in freqs]
        self.linears = nn.ModuleList(Linear(w, b, role="embedding") for w, b in linears)
        self.norms = nn.ModuleList(RMSNorm(w, TRUNK_NORM_EPS) for w in trunk_norms)
        self.norm_weight, self.norm_bias = norm
        self.dtype = linears[0][0].dtype

    def features(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x [B, T, A], t [B] -> the trunk's float32 input [B, T, (A + 1) * num_fourier_feats]."""
        *action_freqs, t_freqs = self.freqs
        per_dim = [fourier_features(x[:, :, i], f) for i, f in enumerate(action_freqs)]
        t_feats = fourier_features(t.reshape(-1, 1), t_freqs).expand(-1, x.shape[1], -1)
        return torch.cat([*per_dim, t_feats], dim=-1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.linears[0](self.features(x, t).to(self.dtype))
        for norm, linear in zip(self.norms, self.linears[1:], strict=True):
            h = linear(norm(F.silu(h)))
        return F.layer_norm(h, h.shape[-1:], self.norm_weight, self.norm_bias, OUT_NORM_EPS)
