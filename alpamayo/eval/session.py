"""One evaluation from settings to RUN_DIR: list the clips, skip the done ones, evaluate the rest in-process
or on Ray with a progress bar, then write the aggregate report (`alpamayo eval`, `benchmarks/fleet_eval.py`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tqdm import tqdm

from alpamayo.eval.clips import Clip
from alpamayo.eval.evaluator import ClipEvaluator
from alpamayo.eval.ray_workers import WorkerPool, evaluate_on_ray
from alpamayo.eval.report import EvalRun, write_report
from alpamayo.eval.results import RunDir, RunOutcome
from alpamayo.eval.settings import EvalSettings
from alpamayo.profiling.environment import hardware, software, source_commit
from bridges.drives.recording import require_recording_file

R = TypeVar("R", bound=RunOutcome)


def run_info(settings: EvalSettings) -> dict[str, Any]:
    """Settings and environment recorded in report.json."""
    return {
        **settings.as_dict(),
        "hardware": hardware(settings.model.device),
        "software": software(),
        "commit": source_commit(),
    }


def evaluate_in_process(
    settings: EvalSettings, clips: Sequence[Clip], on_result, evaluator: type = ClipEvaluator
) -> WorkerPool:
    """The clips one after another in this process, with one model (`evaluator`, as `evaluate_on_ray`)."""
    worker = evaluator(settings)
    try:
        pool = WorkerPool([worker.ready()])
        start = time.perf_counter()
        for clip in clips:
            on_result(clip, worker.evaluate(clip))
        pool.wall_s = time.perf_counter() - start
    finally:
        worker.close()
    return pool


@dataclass
class Pending:
    """What `evaluate_pending` did: the record of each item by id (held from earlier runs or new), the ids it
    evaluated, how many it skipped as done, and the workers that ran."""

    results: dict[str, dict[str, Any]]
    evaluated: set[str]
    skipped: int
    pool: WorkerPool

    def outcome(self, run_type: type[R], items: Sequence[Any], info: dict[str, Any]) -> R:
        """The run's outcome as `run_type`, with the records in the order of `items`."""
        return run_type(
            records=[self.results.get(c.clip_id) for c in items],
            skipped=self.skipped,
            evaluated=self.evaluated,
            workers=self.pool.workers,
            wall_s=self.pool.wall_s,
            info=info,
        )


def evaluate_pending(
    settings: Any, run_dir: RunDir, items: Sequence[Any], evaluator: type = ClipEvaluator, unit: str = "clip"
) -> Pending:
    """Evaluate the items (clips, or closed-loop scenes: clip_id, result_name, as_dict()) of `items` not yet
    done in `run_dir` (failed ones are tried again), in-process or on Ray (settings.ray), writing each result as
    it arrives, under a progress bar."""
    held = [run_dir.load(c) for c in items]
    todo = [c for c, r in zip(items, held, strict=True) if r is None or r["status"] != "done"]
    results = {c.clip_id: r for c, r in zip(items, held, strict=True) if r is not None}
    evaluated: set[str] = set()
    failures = 0
    pool = WorkerPool()
    if todo:
        with tqdm(
            total=len(todo),
            unit=unit,
            desc="eval" if unit == "clip" else unit,
            disable=None if settings.progress else True,
            file=sys.stderr,
        ) as bar:

            def on_result(item: Any, record: dict[str, Any]) -> None:
                nonlocal failures
                run_dir.write(item, record)
                results[item.clip_id] = record
                evaluated.add(item.clip_id)
                failures += record["status"] == "failed"
                bar.set_postfix(failed=failures, refresh=False)
                bar.update(1)

            evaluate = evaluate_in_process if settings.ray is None else evaluate_on_ray
            pool = evaluate(settings, todo, on_result, evaluator)
    return Pending(results, evaluated, len(items) - len(todo), pool)


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
    pending = evaluate_pending(settings, run_dir, clips)
    run = pending.outcome(EvalRun, clips, run_info(settings))
    run_dir.write_table([r for r in run.records if r is not None])
    run.document = write_report(run, run_dir.path, settings.worst)
    return run
