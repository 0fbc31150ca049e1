"""The aggregate of an evaluation, the way the field reports open-loop planning (NVIDIA's protocol).

Accuracy over the clips that are done and have a recorded 6.4 s future, in metres over the XY plane
(`alpamayo.replay.accuracy.tick_errors`, `planner.metrics`): per horizon h in 1, 2, 3, 6.4 s, the mean and
median over clips of minADE_K@h (the sample with the smallest 6.4 s ADE, its ADE over [0, h]; at 6.4 s this
is NVIDIA's `MinADECalculator`), ADE@h and FDE@h of sample 0, and the constant-velocity baseline's ADE@h.

report.json (`REPORT_SCHEMA`):
  run         the settings, hardware, software and commit;
  clips       total, done, failed, skipped (done by an earlier run), evaluated (by this run), pending (not
              evaluated: the run stopped), without_future, failed_reasons {clip_id: reason};
  accuracy    samples (K), clips (scored), mean_m, median_m, constant_velocity_ade_m ({"min_ade@6.4s": m, ...});
  throughput  wall_s, clips_per_hour (this run's clips over its wall time), workers [{index, host, clips,
              clips_per_hour, busy_s, load_s}];
  stages      the per-stage latency table over the done clips (`alpamayo.profiling.stats.stage_table`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from alpamayo.eval import plots as eval_plots
from alpamayo.eval.results import RunOutcome
from alpamayo.profiling import Span
from alpamayo.profiling import plots as plotting
from alpamayo.profiling.stats import stage_table
from alpamayo.replay.accuracy import ERROR_KEYS, baseline_ade, error_key
from alpamayo.replay.report import mean_accepted_length
from planner.metrics import HORIZONS_S

REPORT_SCHEMA = "alpamayo.eval-report/1"
HEADLINE = error_key("min_ade", HORIZONS_S[-1])  # minADE_K at 6.4 s, the published figure


class EvalRun(RunOutcome):
    """One evaluation's outcome (`RunOutcome`, over clips), with the clips it could score."""

    @property
    def scored(self) -> list[dict[str, Any]]:
        return [r for r in self.done if r["errors_m"] is not None]


def predicted_xyz(record: dict[str, Any]) -> np.ndarray:
    """A done record's samples as [K, 64, 3] metres (t0 ego frame)."""
    return np.array([np.stack([s["x"], s["y"], s["z"]], axis=-1) for s in record["prediction"]["samples"]])


def recorded_xyz(record: dict[str, Any]) -> np.ndarray | None:
    future = record["recorded_future"]
    return None if future is None else np.stack([future["x"], future["y"], future["z"]], axis=-1)


def accuracy(run: EvalRun) -> dict[str, Any]:
    scored = run.scored
    values = {k: [r["errors_m"][k] for r in scored] for k in ERROR_KEYS}
    baseline = baseline_ade([np.array(r["history_xyz"]) for r in scored], [recorded_xyz(r) for r in scored])
    done = run.done
    return {
        "samples": len(done[0]["prediction"]["samples"]) if done else 0,
        "clips": len(scored),
        "mean_m": {k: float(np.mean(v)) for k, v in values.items()} if scored else {},
        "median_m": {k: float(np.median(v)) for k, v in values.items()} if scored else {},
        "constant_velocity_ade_m": baseline,
    }


def throughput(run: EvalRun) -> dict[str, Any]:
    """Clips per hour of this run: in total over its wall time, and per worker (the clips it answered)."""
    mine = [r for r in run.records if r is not None and r["clip_id"] in run.evaluated]
    per_hour = 3600.0 / run.wall_s if run.wall_s > 0 else 0.0
    workers = []
    for w in run.workers:
        answered = [r for r in mine if r.get("worker", {}).get("index") == w["index"]]
        workers.append(
            {
                "index": w["index"],
                "host": w["host"],
                "accelerator": w["accelerator"],
                "clips": len(answered),
                "clips_per_hour": len(answered) * per_hour,
                "busy_s": float(sum(r.get("wall_s", 0.0) for r in answered)),
                "load_s": w["load_s"],
            }
        )
    return {"wall_s": run.wall_s, "clips_per_hour": len(mine) * per_hour, "workers": workers}


def clip_spans(records: Sequence[dict[str, Any]]) -> list[Span]:
    """The done clips' stage spans (label, duration) for the latency table."""
    return [Span(s["stage"], 0, round(s["ms"] * 1e6)) for r in records for s in r["spans"]]


def report_document(run: EvalRun) -> dict[str, Any]:
    records = [r for r in run.records if r is not None]
    return {
        "schema": REPORT_SCHEMA,
        "run": run.info,
        "clips": {
            "total": len(run.records),
            "done": len(run.done),
            "failed": len(run.failed),
            "skipped": run.skipped,
            "evaluated": len(run.evaluated),
            "pending": len(run.records) - len(records),
            "without_future": len(run.done) - len(run.scored),
            "failed_reasons": {r["clip_id"]: r["reason"] for r in run.failed},
        },
        "accuracy": accuracy(run),
        "throughput": throughput(run),
        "stages": [row.as_dict() for row in stage_table(clip_spans(run.done))],
        "mean_accepted_length": mean_accepted_length(
            [n for r in run.done for n in r.get("accepted_lengths", [])]
        ),
    }


def report_table(doc: dict[str, Any]) -> str:
    """The printed report: counts, accuracy per horizon (mean / median), throughput and stage latencies."""
    clips, acc, speed = doc["clips"], doc["accuracy"], doc["throughput"]
    k = acc["samples"]
    rows = [
        f"Clips: {clips['done']} done, {clips['failed']} failed, {clips['skipped']} skipped (done earlier), "
        f"{clips['pending']} pending, of {clips['total']}; {clips['without_future']} done without a 6.4 s future",
    ]
    rows += [f"  failed {cid}: {why}" for cid, why in clips["failed_reasons"].items()]
    if acc["clips"]:
        rows.append(f"Accuracy over {acc['clips']} clip(s), metres over XY (mean / median), K = {k}:")
        rows.append(f"{'horizon':>8} {f'minADE_{k}':>15} {'ADE':>15} {'FDE':>15} {'const-vel ADE':>14}")
        for h in HORIZONS_S:
            cells = [
                f"{acc['mean_m'][error_key(m, h)]:.3f} / {acc['median_m'][error_key(m, h)]:.3f}"
                for m in ("min_ade", "ade", "fde")
            ]
            base = acc["constant_velocity_ade_m"][error_key("ade", h)]
            rows.append(f"{h:>7g}s {cells[0]:>15} {cells[1]:>15} {cells[2]:>15} {base:>14.3f}")
    else:
        rows.append("Accuracy: no done clip has a recorded 6.4 s future")
    rows.append(
        f"Throughput: {speed['clips_per_hour']:.1f} clips/h over {speed['wall_s']:.1f} s with "
        f"{len(speed['workers'])} worker(s)"
        + "".join(
            f"; worker {w['index']} ({w['host']}): {w['clips']} clips, {w['clips_per_hour']:.1f} clips/h, "
            f"model load {w['load_s']:.1f} s"
            for w in speed["workers"]
        )
    )
    if doc.get("mean_accepted_length") is not None:
        rows.append(
            f"Speculative decoding: mean accepted length {doc['mean_accepted_length']:.2f} tokens per verify"
        )
    if doc["stages"]:
        rows.append(f"{'stage':<26}{'n':>6}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}  (ms)")
        for s in doc["stages"]:
            rows.append(
                f"{s['stage']:<26}{s['n']:>6}{s['mean_ms']:>10.2f}{s['p50_ms']:>10.2f}{s['p90_ms']:>10.2f}"
                f"{s['p99_ms']:>10.2f}{s['max_ms']:>10.2f}"
            )
    return "\n".join(rows)


def write_report(run: EvalRun, directory: Path, worst: int) -> dict[str, Any]:
    """report.json and plots/ (min_ade_histogram.png, error_vs_horizon.png, worst_clips.png) in `directory`."""
    doc = report_document(run)
    (directory / "report.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    plot_dir = directory / "plots"
    plot_dir.mkdir(exist_ok=True)
    scored = run.scored
    if scored:
        k = doc["accuracy"]["samples"]
        title = f"{len(scored)} clips, K = {k}, {run.info.get('checkpoint', '')}"
        eval_plots.min_ade_histogram(
            [r["errors_m"][HEADLINE] for r in scored], k, plot_dir / "min_ade_histogram.png", title
        )
        eval_plots.error_vs_horizon(doc["accuracy"], plot_dir / "error_vs_horizon.png", title)
        ranked = sorted(scored, key=lambda r: -r["errors_m"][HEADLINE])[:worst]
        panels = [
            plotting.BirdseyeTick(
                f"{r['clip_id']}: minADE {r['errors_m'][HEADLINE]:.2f} m",
                predicted_xyz(r),
                recorded_xyz(r),
                np.array(r["history_xyz"]),
            )
            for r in ranked
        ]
        if panels:
            plotting.birdseye(panels, plot_dir / "worst_clips.png", f"worst {len(panels)} of {title}")
    return doc
