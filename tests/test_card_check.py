"""`scripts/card-check` (`alpamayo.tt.card_check`): without a card it says what is missing and exits 2; under
the dry run it runs end to end (models built, every stage timed, the report and the anchor rows written), and
the report says its timings are meaningless."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from alpamayo.plan.calibration.anchors import load_anchors

ROOT = Path(__file__).resolve().parents[1]
DRY_RUN_VARS = ("TT_METAL_MOCK_CLUSTER_DESC_PATH", "TT_METAL_RUNTIME_ROOT")


def card_check(out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    argv = ["--out", str(out), "--skip-tests", "--iters", "1", "--decode-steps", "1", "--prompt", "128"]
    return subprocess.run(
        [str(ROOT / "scripts/card-check"), *argv],
        cwd=ROOT,
        env=env | {"PYTHON": sys.executable, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_without_a_card_it_says_what_is_missing(tmp_path):
    from alpamayo.tt.device import card_present

    if card_present():
        pytest.skip("a card is present")
    env = {k: v for k, v in os.environ.items() if k not in DRY_RUN_VARS}
    proc = card_check(tmp_path / "out", env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "card-check: no p150 to check:" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.dryrun
def test_under_the_dry_run_it_writes_a_report_and_anchor_rows(tmp_path, capsys):
    from alpamayo.cli import main
    from alpamayo.tt.device import dry_run_active

    if not dry_run_active():
        pytest.skip("no ttnn dry run in this session")
    out = tmp_path / "out"
    proc = card_check(out, dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (out / "report.md").read_text()
    assert "TIMINGS ARE MEANINGLESS" in report
    for stage in ("vision_frame", "prefill", "decode_step"):
        assert f"| {stage} |" in report
    rows = load_anchors(out / "anchors.json")
    assert [r.workload["stage"] for r in rows] == ["vision_frame", "prefill", "decode_step"]
    assert all(not r.fit and "meaningless" in r.note and r.measured_ms > 0 for r in rows)
    assert all(r.workload["layers"] == 2 for r in rows)
    # the rows feed the plan's calibration (not fitted: a dry run's times)
    assert main(["plan", "--calibration", "--anchors", str(out / "anchors.json")]) == 0
    assert "card-check." in capsys.readouterr().out
