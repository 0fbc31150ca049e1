"""Latency statistics, warm-up exclusion, simulated drops and plots."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from alpamayo.profiling import Tracer, plots
from alpamayo.profiling.stats import simulated_drop_pct, stage_table, summarize


def test_spans_inside_a_tick_are_stamped_and_warmup_is_excluded_from_the_table():
    tracer = Tracer()
    for i in range(4):
        with tracer.tick(i, warmup=i == 0):
            tracer.record("prefill", 0, (100 if i == 0 else 10) * 1_000_000)
            tracer.record("vision", 0, 5_000_000, cached=i > 1)
    tracer.record("receive", 0, 1_000_000)  # outside any tick: measured, unstamped
    assert tracer.spans[0].args == {"tick": 0, "warmup": True}
    assert tracer.spans[-1].args == {}
    rows = {r.stage: r for r in stage_table(tracer.spans)}
    assert list(rows) == ["receive", "vision (cached)", "vision (encoded)", "prefill"]
    assert rows["prefill"].n == 3 and rows["prefill"].max_ms == 10.0
    assert rows["vision (cached)"].n == 2 and rows["vision (encoded)"].n == 1


def test_summary_percentiles_follow_numpy_linear_interpolation():
    values = list(np.arange(1.0, 101.0))
    row = summarize("decode", values)
    assert (row.n, row.mean_ms, row.p50_ms, row.max_ms) == (100, 50.5, 50.5, 100.0)
    assert (row.p90_ms, row.p99_ms) == (pytest.approx(90.1), pytest.approx(99.01))
    with pytest.raises(ValueError, match="no measured values"):
        summarize("decode", [])


@pytest.mark.parametrize(
    ("duration_ms", "expected_pct"),
    [(50, 0.0), (100, 0.0), (250, 60.0), (1000, 90.0)],
)
def test_simulated_drops_match_a_newest_wins_consumer(duration_ms, expected_pct):
    arrivals = [i * 100_000_000 for i in range(100)]
    pct = simulated_drop_pct(arrivals, [duration_ms * 1_000_000] * 100)
    assert pct == pytest.approx(expected_pct, abs=1.0)


def test_plots_are_pngs_of_the_stated_size(tmp_path):
    x = np.linspace(0.0, 60.0, 64)
    path = np.stack([x, 0.002 * x**2, 0 * x], axis=1)
    tick = plots.BirdseyeTick("tick 0", path[None], path * [1.0, 0.5, 0.0], path[:16] - path[15])
    written = [
        plots.latency_histograms({"prefill": [1.0, 2.0, 4.0], "e2e_age": [5.0]}, tmp_path / "h.png", "h"),
        plots.tick_timeline(
            {0: {"prefill": 3.0}, 1: {"prefill": 2.0}}, {0}, ["prefill"], tmp_path / "t.png", "t"
        ),
        plots.birdseye([tick, tick], tmp_path / "b.png", "b"),
    ]
    for png in written:
        with Image.open(png) as img:
            assert img.format == "PNG" and img.size == plots.FIGURE_PX


def test_totals_after_a_mark_add_up_per_stage():
    tracer = Tracer()
    assert tracer  # an empty tracer stays truthy: callers write `tracer or Tracer()`
    tracer.record("prefill", 0, 1_000_000)
    mark = tracer.mark()
    tracer.record("vision", 0, 2_000_000, cached=False)
    tracer.record("vision", 0, 3_000_000, cached=True)
    assert tracer.totals_ms(mark) == {"vision": 5.0}
    assert tracer.totals_ms() == {"prefill": 1.0, "vision": 5.0}
