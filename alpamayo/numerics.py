"""Agreement figures used across the project: Pearson correlation (PCC) and max abs error.

PCC is the figure tt-metal and the Qwen-VL ports report (`comp_pcc`); both are computed in float64.
"""

from __future__ import annotations

import torch


def pcc(expected: torch.Tensor, actual: torch.Tensor) -> float:
    """Pearson correlation of the flattened tensors; 1.0 for two identical constant tensors."""
    a = expected.detach().double().flatten().cpu()
    b = actual.detach().double().flatten().cpu()
    if a.shape != b.shape:
        raise ValueError(f"pcc: shapes differ, {list(expected.shape)} vs {list(actual.shape)}")
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("nan")
    a, b = a - a.mean(), b - b.mean()
    denom = a.norm() * b.norm()
    if denom == 0:
        return 1.0 if torch.equal(a, b) else 0.0
    return float((a @ b) / denom)


def max_abs_error(expected: torch.Tensor, actual: torch.Tensor) -> float:
    """max |expected - actual| over tensors of one shape (no broadcasting: it could hide a missing dim)."""
    if expected.shape != actual.shape:
        raise ValueError(f"max_abs_error: shapes differ, {list(expected.shape)} vs {list(actual.shape)}")
    return float((expected.detach().double().cpu() - actual.detach().double().cpu()).abs().max())
