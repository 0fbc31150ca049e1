"""What an evaluation asks for (`alpamayo eval`): the model, the sampling protocol and where it runs."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from alpamayo.model_spec import ModelSpec
from alpamayo.replay.routes import check_route_options
from alpamayo.replay.settings import ReplaySettings

LOCAL_RAY = "local"  # `--ray` without an address: an embedded Ray on this machine
# What `--ray ADDRESS` accepts: `auto`, Ray Client's ray://HOST:PORT, or a GCS HOST:PORT.
RAY_ADDRESS = re.compile(r"auto|ray://[^\s/]+:\d+|[A-Za-z0-9.\-\[\]:]+:\d+")
# Settings a resumed run must share with the results already in RUN_DIR (anything that changes a prediction):
# the model's keys (alpamayo.model_spec) and the request's.
RESULT_KEYS = (
    "checkpoint",
    "num_samples",
    "decoder",
    "flow_steps",
    "flow_temperature",
    "nav_guidance",
    "route",
    "route_file",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_reasoning_tokens",
    "backend",
    "dtype",
    "recipe",
    "quant",
    "quant_group",
    "quant_head",
    "cameras",
    "reproducible",
)


@dataclass
class EvalSettings:
    """One evaluation: the model (`alpamayo eval` gives it NVIDIA's protocol sampling, temperature 0.6 and
    top_p 0.98, where no flag says otherwise), K samples per clip from the clip's seed, where it runs. ray: None
    (in-process), LOCAL_RAY (embedded) or an address (`auto`, `ray://host:10001`); workers: Ray actors (None: as
    many as the cluster's accelerators, or 1 on CPUs); cpus_per_worker: CPUs each CPU-backend actor requests
    (None: the cluster's CPUs / workers); max_retries: re-runs of a clip whose worker process died (Ray's
    max_task_retries)."""

    model: ModelSpec  # what to load and how to run it (alpamayo.model_spec)
    out: Path
    num_samples: int = 6
    route: str | None = None  # navigation text, or "auto" (alpamayo.replay.routes)
    route_file: Path | None = None  # a t0_ns,route CSV (alpamayo.replay.routes)
    seed: int = 0
    layout: Path | None = None
    pai_dir: Path | None = None
    cameras: tuple[int, ...] | None = None  # PhysicalAI-AV cameras (None: the family's driving cameras)
    ray: str | None = None
    workers: int | None = None
    cpus_per_worker: int | None = None
    max_retries: int = 2
    worst: int = 6
    progress: bool = True

    def replay_settings(self) -> ReplaySettings:
        """The lock-step replay of one tick that evaluates a clip, with this model and sampling; a clip sets its
        drive, window and seed (`dataclasses.replace`)."""
        return ReplaySettings(
            drive="",
            model=self.model,
            max_ticks=1,
            num_samples=self.num_samples,
            seed=self.seed,
            route=self.route,
            route_file=self.route_file,
            layout=self.layout,
            pai_dir=self.pai_dir,
            cameras=self.cameras,
            progress=False,
        )

    def validate(self) -> None:
        """ValueError naming the option, its value and the allowed range for the first one out of range."""
        if self.num_samples < 1:
            raise ValueError(f"--samples must be >= 1, got {self.num_samples}")
        self.model.check_samples(self.num_samples)
        check_route_options(self.route, self.route_file, self.model.nav_guidance)
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.ray not in (None, LOCAL_RAY) and not RAY_ADDRESS.fullmatch(self.ray):
            raise ValueError(
                f"--ray {self.ray!r} is not a Ray address (auto, ray://HOST:10001 or HOST:PORT); a drive right "
                "after a bare --ray is taken as its address: put --ray after the drives"
            )
        for option, value in (("--workers", self.workers), ("--cpus-per-worker", self.cpus_per_worker)):
            if value is not None and self.ray is None:
                raise ValueError(f"{option} {value} needs --ray; without it clips run in this process")
        if self.cpus_per_worker is not None and self.cpus_per_worker < 1:
            raise ValueError(f"--cpus-per-worker must be >= 1, got {self.cpus_per_worker}")
        if not 0 <= self.max_retries <= 100:
            raise ValueError(f"--max-retries must be in [0, 100], got {self.max_retries}")
        if self.worst < 0:
            raise ValueError(f"--worst must be >= 0, got {self.worst}")
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"--out {self.out} is a file; expected a run directory")

    def as_dict(self) -> dict[str, Any]:
        """The settings as report.json records them: the model's keys beside the run's (paths as text)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}
        values = {k: str(v) if isinstance(v, Path) else v for k, v in values.items()} | self.model.to_dict()
        values["cameras"] = None if self.cameras is None else list(self.cameras)  # as JSON reads it back
        return values

    def result_settings(self) -> dict[str, Any]:
        """The settings every result in RUN_DIR must share (see RESULT_KEYS)."""
        values = self.as_dict()
        return {k: values[k] for k in RESULT_KEYS}
