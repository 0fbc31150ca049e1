"""PNG plots of an evaluation (matplotlib Agg, `alpamayo.profiling.plots` figure size and labelling):
  * `min_ade_histogram.png`: minADE_K at 6.4 s over the clips, mean and median marked;
  * `error_vs_horizon.png`: mean and median minADE_K, ADE and FDE, and constant-velocity ADE per horizon;
the worst clips' bird's-eye views are `alpamayo.profiling.plots.birdseye`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from alpamayo.profiling.plots import _figure, _label_panel
from alpamayo.replay.accuracy import error_key
from planner.metrics import HORIZONS_S


def min_ade_histogram(values_m: Sequence[float], samples: int, path: Path, title: str) -> Path:
    """Histogram of per-clip minADE_K (metres)."""
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    v = np.asarray(values_m, dtype=np.float64)
    ax.hist(v, bins=min(40, max(5, v.size // 3)), color="tab:blue", alpha=0.8)
    ax.axvline(float(v.mean()), color="black", lw=1, label=f"mean {v.mean():.3f} m")
    ax.axvline(float(np.median(v)), color="tab:red", lw=1, label=f"median {np.median(v):.3f} m")
    _label_panel(ax, f"minADE_{samples} at 6.4 s: {title}", "metres (XY)", "clips", legend=True)
    fig.savefig(path)
    return path


def error_vs_horizon(accuracy: dict[str, Any], path: Path, title: str) -> Path:
    """Mean (solid) and median (dashed) error per horizon for minADE_K, ADE and FDE, and the constant-velocity
    baseline's mean ADE; `accuracy` is report.json's accuracy section."""
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    k = accuracy["samples"]
    for metric, label, color in (
        ("min_ade", f"minADE_{k}", "tab:red"),
        ("ade", "ADE", "tab:blue"),
        ("fde", "FDE", "tab:green"),
    ):
        for stat, style in (("mean_m", "-"), ("median_m", "--")):
            ax.plot(
                HORIZONS_S,
                [accuracy[stat][error_key(metric, h)] for h in HORIZONS_S],
                style,
                marker="o",
                color=color,
                label=f"{label} ({stat.removesuffix('_m')})",
            )
    base = accuracy["constant_velocity_ade_m"]
    ax.plot(
        HORIZONS_S, [base[error_key("ade", h)] for h in HORIZONS_S], ":", color="grey", label="const-vel ADE"
    )
    _label_panel(ax, title, "horizon (s)", "metres (XY)", legend=True)
    fig.savefig(path)
    return path
