"""A closed-loop run from settings to RUN_DIR: each scene driven by each policy (an episode) in-process or on Ray,
each result written as it arrives, resumable, with `alpamayo.eval`'s run directory, dispatch, fault tolerance
and progress bar.

`SceneRunner` loads the model once (when the model is one of the policies) and answers `evaluate(episode)` with
the episode's result record, in-process or as a Ray actor alike (`alpamayo.eval.ray_workers.evaluate_on_ray`),
so both write the same bytes except timings and worker ids. The reference policies
(`alpamayo.closed_loop.policies`) need no model and no cameras. An episode that raises is a "failed" record
with the reason; a worker process that dies is retried by Ray as eval's clips are.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any

import grpc
import torch

from alpamayo.closed_loop.driver import Driver, GrpcDriver
from alpamayo.closed_loop.metrics import score
from alpamayo.closed_loop.policies import POLICIES, BaselineDriver
from alpamayo.closed_loop.report import ClosedLoopRun, write_report
from alpamayo.closed_loop.rollout import DEFAULT_CAMERAS, Rollout, make_world, run_scene
from alpamayo.closed_loop.scene import Episode, Scene
from alpamayo.demo_drive.world import SCRIPTS
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
    seeds first_scene .. first_scene + scenes - 1 and, with `scripted`, the SCRIPTS on seed first_scene, each
    driven by each of `policies` (POLICIES) for `seconds` of closed loop, cameras rendered at `size` (height,
    width) pixels. A model without a checkpoint: reference policies only."""

    scenes: int = 2
    first_scene: int = 0
    scripted: bool = False
    policies: tuple[str, ...] = ("model",)
    seconds: float = 4.0
    size: tuple[int, int] = (320, 576)
    camera_names: tuple[str, ...] = DEFAULT_CAMERAS
    num_samples: int = 1

    def validate(self) -> None:
        super().validate()
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown or not self.policies or len(set(self.policies)) < len(self.policies):
            raise ValueError(f"--policy {','.join(self.policies)}: name each once, of {', '.join(POLICIES)}")
        if "model" in self.policies and self.model.checkpoint is None:
            raise ValueError("--policy model needs --checkpoint (the reference policies alone need none)")
        if not (0 if self.scripted else 1) <= self.scenes <= MAX_SCENES:
            low = "0 with --scripted" if self.scripted else "1"
            raise ValueError(f"--scenes must be in {low}..{MAX_SCENES}, got {self.scenes}")
        if not 0 < self.seconds <= MAX_SECONDS:
            raise ValueError(f"--seconds must be in (0, {MAX_SECONDS:g}], got {self.seconds}")
        if self.first_scene < 0:
            raise ValueError(f"--first-scene must be >= 0, got {self.first_scene}")

    def scene_list(self) -> list[Scene]:
        scenes = [Scene(self.first_scene + i) for i in range(self.scenes)]
        return scenes + [Scene(self.first_scene, script) for script in SCRIPTS if self.scripted]

    def episodes(self) -> list[Episode]:
        """Every scene driven by every policy, scene by scene."""
        return [Episode(scene, policy) for scene in self.scene_list() for policy in self.policies]

    def as_dict(self) -> dict[str, Any]:
        values = super().as_dict()
        # as JSON reads it back
        values.update(
            size=list(self.size), camera_names=list(self.camera_names), policies=list(self.policies)
        )
        return values

    def result_settings(self) -> dict[str, Any]:
        """What every result in RUN_DIR shares; the scenes and policies may grow between runs."""
        values = self.as_dict()
        return {k: values[k] for k in SCENE_RESULT_KEYS if k != "scenes"}


@dataclass
class ServedModel:
    """The model behind the AlpaSim egodriver service on a loopback port, and the `Driver` that calls it over
    real gRPC, as AlpaSim's runtime does."""

    predictor: Any
    server: grpc.Server
    client: AlpasimDriverClient
    driver: GrpcDriver

    @classmethod
    def start(cls, settings: ClosedLoopSettings, tracer: Tracer) -> ServedModel:
        predictor = load_predictor(settings.replay_settings(), tracer)
        service = EgodriverService(
            predictor, predictor.model_line(), settings.num_samples, cameras=settings.camera_names
        )
        server, port = serve(service, "127.0.0.1:0")
        client = AlpasimDriverClient(f"127.0.0.1:{port}")
        client.wait_ready()
        return cls(predictor, server, client, GrpcDriver(client, settings.size))

    def close(self) -> None:
        self.client.close()
        self.server.stop(grace=None)
        self.predictor.close()


class SceneRunner:
    """The model of `settings` loaded once (`load_s` seconds) behind the AlpaSim egodriver service on a loopback
    port, and the client that drives it (no model when the policies are reference ones only); `evaluate`
    drives one episode. threads: torch CPU threads (a Ray actor passes the CPUs it was given)."""

    def __init__(self, settings: ClosedLoopSettings, worker: int = 0, threads: int | None = None):
        start = time.perf_counter()
        if threads is not None:
            torch.set_num_threads(threads)  # see ClipEvaluator: Ray sets OMP_NUM_THREADS too late
        self.settings = settings
        self.tracer = Tracer()
        self.model = ServedModel.start(settings, self.tracer) if "model" in settings.policies else None
        self.worker = {"index": worker, "pid": os.getpid(), "host": socket.gethostname()}
        self.load_s = time.perf_counter() - start

    def ready(self) -> dict[str, Any]:
        accelerator = hardware(self.settings.model.device).get("accelerator")
        return {**self.worker, "accelerator": accelerator, "load_s": self.load_s}

    def close(self) -> None:
        if self.model is not None:
            self.model.close()

    def evaluate(self, episode: Episode) -> dict[str, Any]:
        """The result record of `episode`: "done" with its metrics and driven path, or "failed" with why."""
        start = time.perf_counter()
        s, scene = self.settings, episode.scene
        try:
            seed = clip_seed(scene.scene_id, s.seed)
            driver: Driver
            if episode.policy == "model" and self.model is not None:
                driver, cameras = self.model.driver, s.camera_names
            else:  # reference policies look at no camera: none is rendered
                driver, cameras = BaselineDriver(episode.policy, make_world(scene, s.seconds)), ()
            rollout = run_scene(driver, scene, s.seconds, s.size, cameras, seed)
            record = episode_record(episode, rollout)
        except Exception as e:  # one episode's failure is that episode's result; the run goes on
            record = failed_record(episode, f"{type(e).__name__}: {e}", traceback.format_exc())
        record.update(worker=self.worker, wall_s=time.perf_counter() - start)
        return record


def episode_record(episode: Episode, rollout: Rollout) -> dict[str, Any]:
    """A done episode's record: metrics, the driven path (t_s, x, y, yaw) and each tick's selected plan (x, y)."""
    return {
        "schema": CLIP_SCHEMA,
        "clip": episode.as_dict(),
        "clip_id": episode.clip_id,
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
    """Drive the episodes of `settings` not yet done in settings.out, then write report.json and the plots."""
    settings.validate()
    episodes = settings.episodes()
    run_dir = RunDir.open(settings.out, settings)
    pending = evaluate_pending(settings, run_dir, episodes, SceneRunner, unit="episode")
    run = pending.outcome(ClosedLoopRun, episodes, run_info(settings))
    run.document = write_report(run, run_dir.path)
    return run
