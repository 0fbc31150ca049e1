"""Where each vision patch sits: its (row, col) in the patch grid, the learned position embedding resampled
to the image's grid, and the 2-D axial rotary angles.

Patches arrive in merge-block-major order (see `vision.preprocess`): for a grid of h x w patches and merge
size m, patch i is at block (i // m^2) of the (h/m) x (w/m) block grid, and at (row, col) = ((i // m) % m,
i % m) inside its block. Both position schemes below use that order, so the mergers can fuse m^2
consecutive rows.
"""

from __future__ import annotations

import torch

from alpamayo.text.rope import inv_freq


def patch_rows_cols(grid_thw: torch.Tensor, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """grid_thw [n, 3] -> (rows [N], cols [N]) long, each image's t frames repeating its h x w grid."""
    rows, cols = [], []
    for t, h, w in grid_thw.tolist():
        r = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
        c = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
        # (block_row, row_in_block, block_col, col_in_block) -> (block_row, block_col, row_in, col_in)
        rows.append(r.permute(0, 2, 1, 3).flatten().repeat(t))
        cols.append(c.permute(0, 2, 1, 3).flatten().repeat(t))
    return torch.cat(rows), torch.cat(cols)


def _axis_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear align_corners=True taps into a `side`-long table for positions `index` of a `size`-long axis.

    Returns (taps [N, 2] long, weights [N, 2] float32): the source coordinate is index * (side-1)/(size-1)
    (endpoints map to endpoints), its floor and floor+1 (clamped to the table) weighted 1-frac and frac.
    """
    src = index.float() * (side - 1) / max(size - 1, 1)
    floor = src.floor()
    offsets = torch.arange(2)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def learned_position_embeds(
    table: torch.Tensor, grid_thw: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor
) -> torch.Tensor:
    """The square learned table [side^2, C] resampled bilinearly (align_corners=True) to every image's grid.

    rows/cols [N] from `patch_rows_cols`. Returns [N, C] float32: the four taps are summed in float32 (as
    transformers does, also for a bfloat16 table); the caller casts to the activation dtype.
    """
    side = round(table.shape[0] ** 0.5)
    out = []
    start = 0
    for t, h, w in grid_thw.tolist():
        n = t * h * w
        h_taps, h_w = _axis_taps(rows[start : start + n], h, side)
        w_taps, w_w = _axis_taps(cols[start : start + n], w, side)
        index = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(n, 4)
        weights = (h_w[:, :, None] * w_w[:, None, :]).reshape(n, 4)
        taps = table[index.to(table.device)]
        out.append((taps * weights.to(table.device)[:, :, None]).sum(1))
        start += n
    return torch.cat(out)


def rotary_cos_sin(
    rows: torch.Tensor, cols: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """2-D axial rotary tables cos, sin [N, head_dim] float32: angles cat(row*f, col*f, row*f, col*f) with
    head_dim/4 frequencies f, applied by rotate-half over the full head_dim."""
    freqs = inv_freq(theta, head_dim // 2)
    half = torch.cat([rows[:, None].float() * freqs, cols[:, None].float() * freqs], dim=-1)
    angles = torch.cat([half, half], dim=-1)
    return angles.cos(), angles.sin()
