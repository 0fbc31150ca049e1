"""PNG plots of a profiled run, drawn with matplotlib's Agg renderer (no display, no pyplot global state).

Every plot is FIGURE_PX pixels (width, height):
  * `latency_histograms.png`: one histogram per stage over the measured ticks;
  * `tick_timeline.png`: per tick, the stage durations stacked (warm-up ticks shaded);
  * `birdseye.png`: predicted vs recorded trajectories for up to BIRDSEYE_TICKS ticks, in the t0 ego frame
    (x forward up the page, y left to the left).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

FIGURE_PX = (1600, 900)
DPI = 100
BIRDSEYE_TICKS = 6


def _figure() -> Figure:
    return Figure(figsize=(FIGURE_PX[0] / DPI, FIGURE_PX[1] / DPI), dpi=DPI, layout="constrained")


def _grid(n: int) -> tuple[int, int]:
    cols = int(np.ceil(np.sqrt(n * 16 / 9)))
    return int(np.ceil(n / cols)), cols


def _label_panel(ax, title: str, xlabel: str, ylabel: str | None, legend: bool) -> None:
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    if legend:
        ax.legend(fontsize=7)


def latency_histograms(durations_ms: Mapping[str, Sequence[float]], path: Path, title: str) -> Path:
    """One histogram per stage label: durations_ms label -> measured ms."""
    fig = _figure()
    fig.suptitle(title)
    rows, cols = _grid(max(len(durations_ms), 1))
    for i, (label, values) in enumerate(durations_ms.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        v = np.asarray(values, dtype=np.float64)
        ax.hist(v, bins=min(30, max(5, v.size // 2)), color="tab:blue", alpha=0.8)
        ax.axvline(float(np.percentile(v, 50)), color="black", lw=1, label="p50")
        ax.axvline(float(np.percentile(v, 99)), color="tab:red", lw=1, label="p99")
        _label_panel(ax, f"{label} (n={v.size})", "ms", None, legend=i == 0)
    fig.savefig(path)
    return path


def tick_timeline(
    per_tick_ms: Mapping[int, Mapping[str, float]],
    warmup: set[int],
    stages: Sequence[str],
    path: Path,
    title: str,
) -> Path:
    """Stacked per-tick stage durations: per_tick_ms tick -> stage -> ms; `stages` gives the stacking order."""
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    ticks = sorted(per_tick_ms)
    bottom = np.zeros(len(ticks))
    cmap = [f"C{i % 10}" for i in range(len(stages))]
    for stage, color in zip(stages, cmap, strict=True):
        values = np.array([per_tick_ms[t].get(stage, 0.0) for t in ticks])
        if values.any():
            ax.bar(ticks, values, bottom=bottom, color=color, label=stage, width=0.9)
            bottom += values
    for t in warmup:
        ax.axvspan(t - 0.5, t + 0.5, color="grey", alpha=0.2, lw=0)
    ax.set_xlabel("tick (grey: warm-up, excluded from statistics)")
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    fig.savefig(path)
    return path


@dataclass(frozen=True)
class BirdseyeTick:
    """One tick to draw: predicted samples [K, 64, 3], recorded future [64, 3] (or None), history [16, 3], all
    metres in the t0 ego frame; `label` titles the panel."""

    label: str
    predicted: np.ndarray
    recorded: np.ndarray | None
    history: np.ndarray


def select_evenly(n: int, k: int = BIRDSEYE_TICKS) -> list[int]:
    """Up to k indices spread evenly over range(n), first and last included."""
    if n <= k:
        return list(range(n))
    return sorted({round(i) for i in np.linspace(0, n - 1, k)})


def birdseye(ticks: Sequence[BirdseyeTick], path: Path, title: str) -> Path:
    """One panel per tick: history, recorded future and predicted samples (sample 0 bold), seen from above."""
    fig = _figure()
    fig.suptitle(title)
    rows, cols = _grid(max(len(ticks), 1))
    for i, tick in enumerate(ticks):
        ax = fig.add_subplot(rows, cols, i + 1)
        # Plot (-y, x): forward is up the page and left is left, as seen from above the car.
        ax.plot(-tick.history[:, 1], tick.history[:, 0], color="grey", lw=2, label="history")
        if tick.recorded is not None:
            ax.plot(-tick.recorded[:, 1], tick.recorded[:, 0], color="black", lw=2, label="recorded")
        for k, sample in enumerate(tick.predicted):
            ax.plot(
                -sample[:, 1],
                sample[:, 0],
                color="tab:red",
                lw=1.5 if k == 0 else 0.8,
                alpha=1.0 if k == 0 else 0.5,
                label="predicted" if k == 0 else None,
            )
        ax.scatter([0], [0], marker="^", color="tab:blue", zorder=3)
        ax.set_aspect("equal", adjustable="datalim")
        _label_panel(ax, tick.label, "lateral (m, right positive)", "x (m, forward)", legend=i == 0)
    fig.savefig(path)
    return path
