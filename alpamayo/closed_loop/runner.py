"""A closed-loop run from settings to RUN_DIR: scenes in-process or on Ray, each result written as it arrives,
resumable, with `alpamayo.eval`'s run directory, dispatch, fault tolerance and progress bar.

`SceneRunner` loads the model once and answers `evaluate(scene)` with the scene's result record, in-process or
as a Ray actor alike (`alpamayo.eval.ray_workers.evaluate_on_ray`), so both write the same bytes except
timings and worker ids. A scene that raises is a "failed" record with the reason; a worker process that dies
is retried by Ray as eval's clips are.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from alpamayo.closed_loop.driver import GrpcDriver
from alpamayo.closed_loop.metrics import score
from alpamayo.closed_loop.report import ClosedLoopRun, write_report
from alpamayo.closed_loop.rollout import DEFAULT_CAMERAS, Rollout, run_scene
from alpamayo.closed_loop.scene import Scene
from alpamayo.eval.clips import clip_seed
from alpamayo.eval.results import CLIP_SCHEMA, RunDir, failed_record
from alpamayo.eval.session import evaluate_pending, run_info
from alpamayo.eval.settings import RESULT_KEYS, EvalSettings
from alpamayo.profiling import Tracer
from alpamayo.profiling.environment import hardware
from alpamayo.replay.session import load_predictor
from bridges.alpasim.client import AlpasimDriverClient
from bridges.alpasim.service import EgodriverService, serve

MAX_SCENES, MAX_SECONDS = 10_000, 120.0
SCENE_RESULT_KEYS = (*RESULT_KEYS, "scenes", "seconds", "size", "camera_names")


@dataclass
class ClosedLoopSettings(EvalSettings):
    """An evaluation's model, sampling and placement (`EvalSettings`) plus the closed loop's: `scenes` scenes of
    seeds first_scene .. first_scene + scenes - 1, `seconds` of closed-loop driving each, cameras rendered at
    `size` (height, width) pixels."""

    scenes: int = 2
    first_scene: int = 0
    seconds: float = 4.0
    size: tuple[int, int] = (320, 576)
    camera_names: tuple[str, ...] = DEFAULT_CAMERAS
    num_samples: int = 1

    def validate(self) -> None:
        super().validate()
        if not 1 <= self.scenes <= MAX_SCENES:
            raise ValueError(f"--scenes must be in 1..{MAX_SCENES}, got {self.scenes}")
        if not 0 < self.seconds <= MAX_SECONDS:
            raise ValueError(f"--seconds must be in (0, {MAX_SECONDS:g}], got {self.seconds}")
        if self.first_scene < 0:
            raise ValueError(f"--first-scene must be >= 0, got {self.first_scene}")

    def scene_list(self) -> list[Scene]:
        return [Scene(self.first_scene + i) for i in range(self.scenes)]

    def as_dict(self) -> dict[str, Any]:
        values = super().as_dict()
        values.update(size=list(self.size), camera_names=list(self.camera_names))  # as JSON reads it back
        return values

    def result_settings(self) -> dict[str, Any]:
        values = self.as_dict()
        return {k: values[k] for k in SCENE_RESULT_KEYS if k != "scenes"}


class SceneRunner:
    """The model of `settings` loaded once (`load_s` seconds) behind the AlpaSim egodriver service on a loopback
    port, and the client that drives it; `evaluate` drives one scene.
    threads: torch CPU threads (a Ray actor passes the CPUs it was given)."""

    def __init__(self, settings: ClosedLoopSettings, worker: int = 0, threads: int | None = None):
        start = time.perf_counter()
        if threads is not None:
            torch.set_num_threads(threads)  # see ClipEvaluator: Ray sets OMP_NUM_THREADS too late
        self.settings = settings
        self.tracer = Tracer()
        self.predictor = load_predictor(settings.replay_settings(), self.tracer)
        # The scenes drive the AlpaSim service over real gRPC on loopback, as AlpaSim drives it.
        service = EgodriverService(
            self.predictor, self.predictor.model_line(), settings.num_samples, cameras=settings.camera_names
        )
        self.server, port = serve(service, "127.0.0.1:0")
        self.client = AlpasimDriverClient(f"127.0.0.1:{port}")
        self.client.wait_ready()
        self.driver = GrpcDriver(self.client, settings.size)
        self.worker = {"index": worker, "pid": os.getpid(), "host": socket.gethostname()}
        self.load_s = time.perf_counter() - start

    def ready(self) -> dict[str, Any]:
        accelerator = hardware(self.settings.device).get("accelerator")
        return {**self.worker, "accelerator": accelerator, "load_s": self.load_s}

    def close(self) -> None:
        self.client.close()
        self.server.stop(grace=None)
        self.predictor.close()

    def evaluate(self, scene: Scene) -> dict[str, Any]:
        """The result record of `scene`: "done" with its metrics and driven path, or "failed" with why."""
        start = time.perf_counter()
        s = self.settings
        try:
            seed = clip_seed(scene.clip_id, s.seed)
            rollout = run_scene(self.driver, scene, s.seconds, s.size, s.camera_names, seed)
            record = scene_record(scene, rollout)
        except Exception as e:  # one scene's failure is that scene's result; the run goes on
            record = failed_record(scene, f"{type(e).__name__}: {e}", traceback.format_exc())
        record.update(worker=self.worker, wall_s=time.perf_counter() - start)
        return record


def scene_record(scene: Scene, rollout: Rollout) -> dict[str, Any]:
    """A done scene's record: metrics, the driven path (t_s, x, y, yaw) and each tick's selected plan (x, y)."""
    return {
        "schema": CLIP_SCHEMA,
        "clip": scene.as_dict(),
        "clip_id": scene.clip_id,
        "status": "done",
        "reason": None,
        "metrics": score(rollout).as_dict(),
        "path": {
            "t_s": rollout.t_s.tolist(),
            "x": rollout.xy[:, 0].tolist(),
            "y": rollout.xy[:, 1].tolist(),
            "yaw": rollout.yaw.tolist(),
        },
        "plans": [
            {"t_s": t, "x": p.xyz[:, 0].tolist(), "y": p.xyz[:, 1].tolist(), "reasoning": p.reasoning}
            for t, p in rollout.plans
        ],
    }


def run_closed_loop(settings: ClosedLoopSettings) -> ClosedLoopRun:
    """Drive the scenes of `settings` not yet done in settings.out, then write report.json and the plots."""
    settings.validate()
    scenes = settings.scene_list()
    run_dir = RunDir.open(settings.out, settings)
    pending = evaluate_pending(settings, run_dir, scenes, SceneRunner, unit="scene")
    run = pending.outcome(ClosedLoopRun, scenes, run_info(settings))
    run.document = write_report(run, run_dir.path)
    return run
