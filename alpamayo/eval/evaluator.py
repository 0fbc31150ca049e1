"""One worker's model and the evaluation of one clip: the drive's tick at t0 through the lock-step replay.

`ClipEvaluator` loads the model once and answers `evaluate(clip)` with the clip's result record (see
`alpamayo.eval.results`), in-process or as a Ray actor alike, so both produce the same bytes. A clip that
raises is a "failed" record with the reason; only the death of the process itself escapes (Ray retries it).
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import replace
from typing import Any

import torch

from alpamayo.eval.clips import Clip, clip_seed
from alpamayo.eval.results import CLIP_SCHEMA, failed_record
from alpamayo.eval.settings import EvalSettings
from alpamayo.prediction import DT_S
from alpamayo.profiling import Tracer
from alpamayo.profiling.environment import hardware
from alpamayo.profiling.stats import stage_label
from alpamayo.replay.lockstep import replay_lockstep
from alpamayo.replay.outputs import TickOutput, path_record, prediction_record
from alpamayo.replay.session import load_predictor, pai_cameras
from alpamayo.replay.settings import ReplayJob
from bridges.drives import DriveSource, open_drive
from bridges.drives.recording import RecordingLayout


class ClipCapture:
    """The replay's recorder for one clip: `serialise` builds the clip's JSON-ready prediction record and
    `publish` keeps it (a replay writes MCAP topics instead; eval writes one file per clip)."""

    def __init__(self) -> None:
        self.record: dict[str, Any] | None = None

    def serialise(self, out: TickOutput) -> dict[str, Any]:
        future = None
        if out.future_xyz is not None and out.future_heading is not None:
            future = path_record(out.future_xyz, out.future_heading)
        return {"prediction": prediction_record(out), "recorded_future": future}

    def publish(self, encoded: dict[str, Any], t0_ns: int) -> None:
        self.record = encoded

    def timings(self, seq: int, t0_ns: int, stages_ms: dict[str, float], e2e_age_ms: float) -> None:
        """Timings travel in the tick result (`stages_ms`)."""


class ClipEvaluator:
    """The model of `settings` loaded once (`load_s` seconds); `evaluate` answers one clip at a time.
    threads: torch CPU threads (a Ray actor passes the CPUs it was given; None keeps torch's default)."""

    def __init__(self, settings: EvalSettings, worker: int = 0, threads: int | None = None):
        start = time.perf_counter()
        if threads is not None:
            # Ray exports OMP_NUM_THREADS only once the actor is placed, after torch may have read it (a worker
            # setup hook importing torch early): the worker then ran both cores' threads on one reserved CPU,
            # and on the loaded 2-core machine a demo clip's trajectory decode took 29 s; with this call 2.6 s
            # (2.4 s without the early import).
            torch.set_num_threads(threads)
        self.settings = settings
        self.replay = settings.replay_settings()
        self.tracer = Tracer()
        self.predictor = load_predictor(self.replay, self.tracer)
        self.layout = None if settings.layout is None else RecordingLayout.load(settings.layout)
        self.worker = {"index": worker, "pid": os.getpid(), "host": socket.gethostname()}
        self.load_s = time.perf_counter() - start

    def ready(self) -> dict[str, Any]:
        """Who this worker is, its accelerator (the CUDA device Ray gave it) and how long the model took to
        load; the Ray driver waits on it before handing out clips."""
        accelerator = hardware(self.settings.model.device).get("accelerator")
        return {**self.worker, "accelerator": accelerator, "load_s": self.load_s}

    def close(self) -> None:
        self.predictor.close()

    def evaluate(self, clip: Clip) -> dict[str, Any]:
        """The result record of `clip`: "done" with the prediction and its errors, or "failed" with why."""
        start = time.perf_counter()
        warnings: list[str] = []
        seed = clip_seed(clip.clip_id, self.settings.seed)
        try:
            record = self._evaluate(clip, seed, warnings.append)
        except Exception as e:  # any failure of one clip is that clip's result; the run goes on
            record = failed_record(clip, f"{type(e).__name__}: {e}", traceback.format_exc())
        record.update(
            seed=seed,
            warnings=warnings,
            worker=self.worker,
            wall_s=time.perf_counter() - start,
        )
        return record

    def _evaluate(self, clip: Clip, seed: int, warn) -> dict[str, Any]:
        self.tracer.clear()
        s = self.settings
        cameras = pai_cameras(self.replay, clip.drive) if clip.is_pai else None
        with self.tracer.span("open_drive"):
            drive = open_drive(clip.drive, self.layout, s.pai_dir, cameras, warn)
        try:
            return self._evaluate_tick(clip, drive, seed, warn)
        finally:
            drive.close()

    def _evaluate_tick(self, clip: Clip, drive: DriveSource, seed: int, warn) -> dict[str, Any]:
        # Every demo drive (and many fleets' logs) starts at the same clock time: features cached by frame time
        # must not carry over from the previous clip.
        self.predictor.reset()
        # A PhysicalAI-AV spec's source yields its t0's tick only; an MCAP drive's window starts at t0.
        offset_us = None if clip.is_pai else clip.t0_us
        replay = replace(
            self.replay,
            drive=clip.drive,
            start_s=0.0 if offset_us is None else offset_us / 1e6,
            # One period from t0: the tick at t0 or none, never a later tick scored in its place.
            duration_s=None if offset_us is None else DT_S,
            seed=seed,
        )
        capture = ClipCapture()
        job = ReplayJob(drive, self.predictor, self.tracer, replay, capture, warn=warn)
        run = replay_lockstep(job)
        if not run.ticks or capture.record is None:
            reasons = "; ".join(f"{n} x {why}" for why, n in run.skipped.items()) or "no tick answered"
            return failed_record(clip, f"the tick at t0 was skipped: {reasons}")
        tick = run.ticks[0]
        return {
            "schema": CLIP_SCHEMA,
            "clip": clip.as_dict(),
            "clip_id": clip.clip_id,
            "status": "done",
            "reason": None,
            "t0_ns": tick.t0_ns,
            **capture.record,
            "history_xyz": tick.history_xyz.tolist(),
            "errors_m": tick.errors_m,
            "stages_ms": tick.stages_ms,
            "spans": [{"stage": stage_label(sp), "ms": sp.ms} for sp in self.tracer.spans],
            "decode_tokens": tick.decode_tokens,
            "accepted_lengths": tick.accepted_lengths,
        }
