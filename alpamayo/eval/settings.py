"""What an evaluation asks for (`alpamayo eval`): the model, the sampling protocol and where it runs."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from alpamayo.backends import check_num_samples
from alpamayo.config.flow import DEFAULT_FLOW, FlowSettings
from alpamayo.expert.decoding import DECODERS
from alpamayo.quant.recipe import NO_QUANT, QuantRecipe
from alpamayo.replay.routes import check_route_options
from alpamayo.replay.settings import ReplaySettings

LOCAL_RAY = "local"  # `--ray` without an address: an embedded Ray on this machine
# What `--ray ADDRESS` accepts: `auto`, Ray Client's ray://HOST:PORT, or a GCS HOST:PORT.
RAY_ADDRESS = re.compile(r"auto|ray://[^\s/]+:\d+|[A-Za-z0-9.\-\[\]:]+:\d+")
# Settings a resumed run must share with the results already in RUN_DIR (anything that changes a prediction).
RESULT_KEYS = (
    "checkpoint",
    "num_samples",
    "decoder",
    "flow",
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
    "cameras",
    "reproducible",
)


@dataclass
class EvalSettings:
    """One evaluation. ray: None (in-process), LOCAL_RAY (embedded) or an address (`auto`, `ray://host:10001`);
    workers: Ray actors (None: as many as the cluster's accelerators, or 1 on CPUs); cpus_per_worker: CPUs
    each CPU-backend actor requests (None: the cluster's CPUs / workers); max_retries: re-runs of a clip whose
    worker process died (Ray's max_task_retries)."""

    checkpoint: Path
    out: Path
    num_samples: int = 6
    decoder: str | None = None  # "expert" / "tokens"; None: the expert when the checkpoint has its weights
    flow: FlowSettings = DEFAULT_FLOW  # the action expert's steps, noise temperature, navigation guidance
    route: str | None = None  # navigation text, or "auto" (alpamayo.replay.routes)
    route_file: Path | None = None  # a t0_ns,route CSV (alpamayo.replay.routes)
    draft: str = (
        "none"  # speculative draft of the reasoning (alpamayo.drafts): none, lookup, previous, dflash:DIR
    )
    temperature: float = 0.6
    top_p: float = 0.98
    top_k: int | None = None
    seed: int = 0
    max_reasoning_tokens: int = 256
    base_model: Path | None = None  # Alpamayo R1 / 1.5: base-model directory (alpamayo.families.base_model)
    backend: str = "torch"
    device: str = "cpu"
    dtype: str = "float32"
    recipe: str = "performance"
    tt_cache: Path | None = None
    tt_mode: str | None = None  # ttnn backend: device or golden (alpamayo.tt.device.tt_mode)
    moe_config: Path | None = None
    quant: QuantRecipe = NO_QUANT  # torch backend: weight-only int8 / int4 (alpamayo.quant)
    reproducible: bool = False  # one compute thread: the same bytes in-process and on any Ray worker layout
    quant_cache: Path | None = None  # its packed-weight cache directory (alpamayo.quant.cache)
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
            checkpoint=self.checkpoint,
            max_ticks=1,
            num_samples=self.num_samples,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            max_reasoning_tokens=self.max_reasoning_tokens,
            base_model=self.base_model,
            decoder=self.decoder,
            flow=self.flow,
            route=self.route,
            route_file=self.route_file,
            draft=self.draft,
            backend=self.backend,
            device=self.device,
            dtype=self.dtype,
            recipe=self.recipe,
            tt_cache=self.tt_cache,
            tt_mode=self.tt_mode,
            moe_config=self.moe_config,
            quant=self.quant,
            quant_cache=self.quant_cache,
            reproducible=self.reproducible,
            layout=self.layout,
            pai_dir=self.pai_dir,
            cameras=self.cameras,
            progress=False,
        )

    def validate(self) -> None:
        """ValueError naming the option, its value and the allowed range for the first one out of range."""
        if self.decoder is not None and self.decoder not in DECODERS:
            raise ValueError(f"--decoder {self.decoder!r} unknown; allowed: {list(DECODERS)}")
        if self.num_samples < 1:
            raise ValueError(f"--samples must be >= 1, got {self.num_samples}")
        check_num_samples(self.backend, self.num_samples, self.temperature, self.checkpoint, self.base_model)
        check_route_options(self.route, self.route_file, self.flow.guidance)
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
        values = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        values["cameras"] = None if self.cameras is None else list(self.cameras)  # as JSON reads it back
        return values

    def result_settings(self) -> dict[str, Any]:
        """The settings every result in RUN_DIR must share (see RESULT_KEYS)."""
        values = self.as_dict()
        return {k: values[k] for k in RESULT_KEYS}
