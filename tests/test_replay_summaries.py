"""What a replay tells its user while and after it runs: the progress bar's total for the replayed window, and
a short line for the real-time node's reasons of outputs without a trajectory."""

from __future__ import annotations

from collections import Counter

import pytest

from alpamayo.demo_drive import make_demo_drive
from alpamayo.profiling import Tracer
from alpamayo.replay.report import latency_table
from alpamayo.replay.results import ReplayRun
from alpamayo.replay.session import expected_ticks
from alpamayo.replay.ticks import TickAssembler
from bridges.drives import open_drive


@pytest.fixture(scope="module")
def drive(tmp_path_factory):
    path = make_demo_drive(
        tmp_path_factory.mktemp("d") / "drive.mcap", seconds=3.0, cameras=1, size=(72, 128)
    ).path
    source = open_drive(path)
    yield source
    source.close()


@pytest.mark.parametrize(
    ("start_s", "duration_s"), [(0.0, None), (1.0, 1.0), (2.0, None), (1.6, 0.3), (0.0, 1.7), (1.45, 0.3)]
)
def test_the_progress_total_is_the_windows_tick_count(drive, start_s, duration_s):
    ticks = sum(1 for _ in TickAssembler(drive, start_s, duration_s, warn=lambda message: None))
    assert expected_ticks(drive, start_s, duration_s) == ticks


# The reasons a real-time replay of a 3 s demo drive got from the node while its inputs filled up.
REASONS = [
    "camera 'camera_front_wide_120fov': no frame within 50 ms of t0 - 300 ms (nearest 100 ms off)",
    "camera 'camera_front_wide_120fov': no frame within 50 ms of t0 - 300 ms (nearest 200 ms off)",
    "camera 'camera_front_wide_120fov': nothing received yet",
    "camera 'camera_front_wide_120fov': stale, last message 6732 ms ago (limit 1000 ms)",
    "ego: nothing received yet",
    *(f"ego: poses start -{k / 10:.2f} s from t0, the history needs -1.50 s" for k in range(3, 15)),
]


def test_realtime_reasons_are_summarised_by_kind_in_one_short_line():
    skipped = Counter({reason: 1 for reason in REASONS})
    skipped[REASONS[0]] = 3
    info = {"node": {"warmup_runs": 1}, "speed": 1.0}
    run = ReplayRun("realtime", [], Tracer(), 15, 1.0, info, skipped=skipped, dropped=13)
    (line,) = [row for row in latency_table(run).splitlines() if row.startswith("real-time at")]
    assert len(line) < 400, line
    assert f"{sum(skipped.values())} output(s) without a trajectory (12 x ego: poses start -0.30 s" in line
    assert f"; 4 x {REASONS[0]}; " in line and "3 other kind(s), in the JSON report" in line
