"""Test access to one block of a `TTVisionEncoder` at a time (per-block PCC on a card).

This drives the tower's own block code with a reference's inputs; it is not part of the product.
"""

from __future__ import annotations

from typing import Any

import torch


@torch.inference_mode()
def vision_block(tt: Any, j: int, hidden: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """Block j of the `TTVisionEncoder` `tt` alone on hidden [N, C] (the patches of `grid_thw`) -> [N, C]
    bf16."""
    n = hidden.shape[0]
    with tt._inputs(grid_thw) as inputs:
        x = tt.upload_rows(hidden, tt.plan.padded_length(n), tt.cfg.hidden_size)
        return tt._fetch(tt._block(j, x, inputs), n, tt.cfg.hidden_size)
