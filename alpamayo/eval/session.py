"""One evaluation from settings to RUN_DIR: list the clips, skip the done ones, evaluate the rest in-process
or on Ray with a progress bar, then write the aggregate report (`alpamayo eval`, `benchmarks/fleet_eval.py`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from alpamayo.eval.clips import Clip
from alpamayo.eval.evaluator import ClipEvaluator
from alpamayo.eval.ray_workers import WorkerPool, evaluate_on_ray
from alpamayo.eval.report import EvalRun, write_report
from alpamayo.eval.results import RunDir
from alpamayo.eval.settings import EvalSettings
from alpamayo.profiling.environment import hardware, software, source_commit
from bridges.recording import require_recording_file


def run_info(settings: EvalSettings) -> dict[str, Any]:
    """Settings and environment recorded in report.json."""
    return {
        **settings.as_dict(),
        "hardware": hardware(settings.device),
        "software": software(),
        "commit": source_commit(),
    }


def evaluate_in_process(settings: EvalSettings, clips: Sequence[Clip], on_result) -> WorkerPool:
    """The clips one after another in this process, with one model."""
    evaluator = ClipEvaluator(settings)
    try:
        pool = WorkerPool([evaluator.ready()])
        start = time.perf_counter()
        for clip in clips:
            on_result(clip, evaluator.evaluate(clip))
        pool.wall_s = time.perf_counter() - start
    finally:
        evaluator.close()
    return pool


def check_sources(settings: EvalSettings, clips: Sequence[Clip]) -> None:
    """Every clip's drive is there before any model loads: MCAP drives are files, PhysicalAI-AV clips have
    --pai-dir (a directory); RecordingError / ValueError naming the first clip that is not."""
    for clip in clips:
        if not clip.is_pai:
            require_recording_file(clip.drive)
        elif settings.pai_dir is None:
            raise ValueError(
                f"clip {clip.clip_id} ({clip.drive}) is a PhysicalAI-AV clip: give --pai-dir DIR"
            )
        elif not settings.pai_dir.is_dir():
            raise ValueError(f"--pai-dir {settings.pai_dir} is not a directory (clip {clip.clip_id})")


def run_eval(settings: EvalSettings, clips: Sequence[Clip]) -> EvalRun:
    """Evaluate the clips of `clips` not yet done in settings.out (failed ones are tried again), write each
    result as it arrives, then report.json, clips.parquet and the plots."""
    settings.validate()
    check_sources(settings, clips)
    run_dir = RunDir.open(settings.out, settings)
    held = [run_dir.load(c) for c in clips]
    todo = [c for c, r in zip(clips, held, strict=True) if r is None or r["status"] != "done"]
    results = {c.clip_id: r for c, r in zip(clips, held, strict=True) if r is not None}
    evaluated: set[str] = set()
    failures = 0
    pool = WorkerPool()
    if todo:
        with tqdm(
            total=len(todo),
            unit="clip",
            desc="eval",
            disable=None if settings.progress else True,
            file=sys.stderr,
        ) as bar:

            def on_result(clip: Clip, record: dict[str, Any]) -> None:
                nonlocal failures
                run_dir.write(clip, record)
                results[clip.clip_id] = record
                evaluated.add(clip.clip_id)
                failures += record["status"] == "failed"
                bar.set_postfix(failed=failures, refresh=False)
                bar.update(1)

            evaluate = evaluate_in_process if settings.ray is None else evaluate_on_ray
            pool = evaluate(settings, todo, on_result)
    run = EvalRun(
        records=[results.get(c.clip_id) for c in clips],
        skipped=len(clips) - len(todo),
        evaluated=evaluated,
        workers=pool.workers,
        wall_s=pool.wall_s,
        info=run_info(settings),
    )
    run_dir.write_table([r for r in run.records if r is not None])
    run.document = write_report(run, run_dir.path, settings.worst)
    return run
