"""Input checks shared by the planner modules; each error names the array, the offending index and value, and
the allowed range or shape."""

from __future__ import annotations

import numpy as np


def require_finite(name: str, value: np.ndarray) -> None:
    """Raise ValueError naming the first NaN/inf entry of `value` (by index) and its value."""
    bad = np.argwhere(~np.isfinite(value))
    if len(bad):
        index = tuple(int(i) for i in bad[0])
        raise ValueError(
            f"{name}{list(index)} = {value[index]}: every value must be finite ({len(bad)} non-finite)"
        )


def require_shape(name: str, value: np.ndarray, shape: tuple[int, ...]) -> None:
    """Raise ValueError unless `value` has exactly `shape`."""
    if value.shape != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(value.shape)}")


def require_bins(name: str, bins: np.ndarray, count: int, num_bins: int) -> np.ndarray:
    """`bins` as int64 [count], every entry in [0, num_bins); raises ValueError naming the first bad entry."""
    bins = np.asarray(bins)
    require_shape(name, bins, (count,))
    if not np.issubdtype(bins.dtype, np.integer):
        raise ValueError(f"{name} must hold integer bins, got dtype {bins.dtype}")
    bad = np.flatnonzero((bins < 0) | (bins >= num_bins))
    if len(bad):
        raise ValueError(f"{name}[{bad[0]}] = {bins[bad[0]]} is outside the bin range [0, {num_bins - 1}]")
    return bins.astype(np.int64)
