"""`scripts/gpu-check` (`benchmarks/gpu_check.py`) on the CPU at tiny shapes: the same code paths a GPU run
takes (the device is an argument), every stage ends `ok` with its figures, ours beside transformers with the
ratios, and the report is written; a stage over its time is recorded as such and the run goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpu_check(out: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = ["--device", "cpu", "--tiny", "--skip-tests", "--out", str(out), *extra]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHON": sys.executable}
    return subprocess.run(
        [str(ROOT / "scripts/gpu-check"), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_stage_runs_beside_transformers_and_the_report_is_written(tmp_path):
    proc = gpu_check(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    stages = {s["stage"]: s for s in report["stages"]}
    assert all(s["status"] == "ok" for s in stages.values()), stages
    assert stages["vision, one frame"]["ratio"] > 0
    assert stages["text, transformers bf16"]["decode_ms_per_token"] > 0
    for recipe in ("bf16", "int8", "int4"):
        text = stages[f"text, ours {recipe}"]
        assert text["decode_ratio"] > 0 and text["prefill_ratio"] > 0
        assert text["reasoning_64_plain_ms"] > 0 and text["reasoning_with_draft_tau4_ms"] > 0
        assert stages["expert, 10 steps K=1"][f"{recipe}_ratio"] > 0
    assert report["run"]["shapes"] == "tiny" and report["run"]["device"] == "cpu"
    assert "| text, ours int4 | ok |" in (tmp_path / "report.md").read_text()


def test_a_spent_budget_is_reported_and_the_partial_report_kept(tmp_path):
    proc = gpu_check(tmp_path, "--budget-s", "0.5")
    assert proc.returncode == 1, proc.stderr[
        -3000:
    ]  # the checkpoint could not be made in time: nothing to time
    stages = json.loads((tmp_path / "report.json").read_text())["stages"]
    assert stages[0]["stage"] == "random checkpoint"
    assert stages[0]["status"].startswith(("timed out", "skipped"))
