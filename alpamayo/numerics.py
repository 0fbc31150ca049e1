"""Agreement figures used across the project: Pearson correlation (PCC), max abs and relative error.

PCC is the figure tt-metal and the Qwen-VL ports report (`comp_pcc`); all figures are computed in float64.

PCC alone cannot gate an output: it ignores scale and offset (`[1, 2, 3]` against `[101, 102, 103]` is 1.0, and
so is `2 * x` against `x`). `agreement` / `assert_agrees` pair it with a magnitude figure, the relative error
`|actual - expected| / |expected|` (Frobenius norms), and derive that figure's bound from the PCC gate itself:

    actual = expected + n, n uncorrelated noise  =>  PCC = 1 / sqrt(1 + |n|^2 / |expected - mean|^2)
    PCC >= p  <=>  |n| / |expected - mean| <= sqrt(1 / p^2 - 1)          (0.99 -> 0.142, 0.97 -> 0.251)

and |expected - mean| <= |expected|, so any output that passes the PCC gate by noise alone also passes
`relative_error <= sqrt(1/p^2 - 1)`; a wrong scale or offset, which PCC cannot see, does not (a scale s gives a
relative error |s - 1|, an offset c gives |c| sqrt(numel) / |expected|). A tighter bound may be passed where a
test has measured its own figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def _flat64(expected: torch.Tensor, actual: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if expected.shape != actual.shape:
        raise ValueError(f"{what}: shapes differ, {list(expected.shape)} vs {list(actual.shape)}")
    return expected.detach().double().flatten().cpu(), actual.detach().double().flatten().cpu()


def pcc(expected: torch.Tensor, actual: torch.Tensor) -> float:
    """Pearson correlation of the flattened tensors, in [-1, 1]; NaN if either holds a non-finite value.

    Correlation is undefined when either tensor is constant. Then the answer is 1.0 only for two identical
    tensors and 0.0 otherwise (a constant against zeros, or against anything that varies), so a device that
    writes a constant never passes a PCC gate by accident.
    """
    a, b = _flat64(expected, actual, "pcc")
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("nan")
    if torch.equal(a, b):
        return 1.0
    a, b = a - a.mean(), b - b.mean()
    denom = a.norm() * b.norm()
    if denom == 0:
        return 0.0
    return float(((a @ b) / denom).clamp(-1.0, 1.0))


def max_abs_error(expected: torch.Tensor, actual: torch.Tensor) -> float:
    """max |expected - actual| over tensors of one shape (no broadcasting: it could hide a missing dim)."""
    a, b = _flat64(expected, actual, "max_abs_error")
    return float((a - b).abs().max())


def relative_error(expected: torch.Tensor, actual: torch.Tensor) -> float:
    """|actual - expected| / |expected| in Frobenius norms; 0.0 for identical tensors, inf against zeros."""
    a, b = _flat64(expected, actual, "relative_error")
    diff, scale = float((b - a).norm()), float(a.norm())
    if diff == 0:
        return 0.0
    return diff / scale if scale > 0 else math.inf


def noise_bound(min_pcc: float) -> float:
    """The relative error that uncorrelated noise at exactly PCC = min_pcc has: sqrt(1 / min_pcc^2 - 1)."""
    if not 0 < min_pcc <= 1:
        raise ValueError(f"noise_bound: min_pcc must be in (0, 1], got {min_pcc}")
    return math.sqrt(1.0 / min_pcc**2 - 1.0)


@dataclass(frozen=True)
class Agreement:
    """How closely `actual` follows `expected`: PCC, max |error| and relative error (see the module doc)."""

    pcc: float
    max_abs: float
    relative: float

    def __str__(self) -> str:
        return f"PCC {self.pcc:.6f}, max abs error {self.max_abs:.4g}, relative error {self.relative:.4g}"


def agreement(expected: torch.Tensor, actual: torch.Tensor) -> Agreement:
    """PCC, max abs error and relative error of two tensors of one shape."""
    return Agreement(pcc(expected, actual), max_abs_error(expected, actual), relative_error(expected, actual))


def assert_agrees(
    expected: torch.Tensor,
    actual: torch.Tensor,
    *,
    min_pcc: float,
    max_relative: float | None = None,
    max_abs: float | None = None,
    what: str = "output",
) -> Agreement:
    """Gate `actual` on PCC >= min_pcc AND relative error <= max_relative (default `noise_bound(min_pcc)`).

    `max_abs`, when given, also bounds max |actual - expected|. Returns the figures so the caller can record
    the worst; the AssertionError names `what` and every figure. NaN fails every gate.
    """
    got = agreement(expected, actual)
    rel_bound = noise_bound(min_pcc) if max_relative is None else max_relative
    problems = []
    if not got.pcc >= min_pcc:
        problems.append(f"PCC {got.pcc:.6f} < {min_pcc}")
    if not got.relative <= rel_bound:
        problems.append(f"relative error {got.relative:.4g} > {rel_bound:.4g}")
    if max_abs is not None and not got.max_abs <= max_abs:
        problems.append(f"max abs error {got.max_abs:.4g} > {max_abs:.4g}")
    if problems:
        raise AssertionError(f"{what}: {'; '.join(problems)} ({got})")
    return got
