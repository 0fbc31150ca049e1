"""The settings of one replay (what `alpamayo replay`, `profile` and `demo` ask for), and the job a replay
mode runs: the opened drive, the predictor, the tracer and where outputs go."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alpamayo.model_spec import ModelSpec
from alpamayo.prediction import Predictor
from alpamayo.profiling import Tracer
from alpamayo.replay.routes import check_route_options
from bridges.drives import DriveSource
from bridges.drives.recording import Warn

if TYPE_CHECKING:  # outputs imports the MCAP writer stack; settings stay importable without it
    from alpamayo.replay.outputs import PredictionRecorder

MODES = ("lockstep", "realtime")
OUTPUT_FORMATS = ("foxglove", "ros2")


@dataclass
class ReplaySettings:
    """Everything a replay needs; times in seconds of the drive (start from its first reference frame).
    drive: an MCAP path or `pai:CLIP_ID[@T0_US]` (with pai_dir; cameras picks the clip's cameras)."""

    drive: Path | str
    model: ModelSpec  # what to load and how to run it (alpamayo.model_spec)
    out: Path | None = None
    mode: str = "lockstep"
    speed: float = 1.0
    start_s: float = 0.0
    duration_s: float | None = None
    max_ticks: int | None = None
    warmup: int = 0
    num_samples: int = 1
    seed: int | None = None
    route: str | None = None  # navigation text, or "auto" (alpamayo.replay.routes)
    route_file: Path | None = None  # a t0_ns,route CSV (alpamayo.replay.routes)
    layout: Path | None = None
    pai_dir: Path | None = None
    cameras: tuple[int, ...] | None = None
    output_format: str = "foxglove"
    encoding: str = "protobuf"
    copy_inputs: bool = True
    trace: Path | None = None
    json: Path | None = None
    plots: Path | None = None
    progress: bool = True

    def validate(self) -> None:
        """ValueError naming the option, its value and the allowed range for the first one out of range."""
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} unknown; allowed: {list(MODES)}")
        if self.output_format not in OUTPUT_FORMATS:
            raise ValueError(f"--format {self.output_format!r} unknown; allowed: {list(OUTPUT_FORMATS)}")
        if not 0.05 <= self.speed <= 20.0:
            raise ValueError(f"--speed must be in [0.05, 20], got {self.speed}")
        if self.num_samples < 1:
            raise ValueError(f"--samples must be >= 1, got {self.num_samples}")
        self.model.check_samples(self.num_samples)
        if self.max_ticks is not None and self.max_ticks < 1:
            raise ValueError(f"--max-ticks must be >= 1, got {self.max_ticks}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        check_route_options(self.route, self.route_file, self.model.nav_guidance, self.mode)
        # Checked before the replay runs, so a bad output path cannot lose a finished (possibly long) replay.
        for option, path in (("--out", self.out), ("--trace", self.trace), ("--json", self.json)):
            if path is not None and Path(path).is_dir():
                raise ValueError(f"{option} {path} is a directory; expected a file path")
        if self.plots is not None and Path(self.plots).exists() and not Path(self.plots).is_dir():
            raise ValueError(f"--plots {self.plots} is a file; expected a directory")


@dataclass
class ReplayJob:
    """One replay to run (`replay_lockstep` or `replay_realtime`): `predictor` records its stages into
    `tracer`; `recorder` (optional) receives the outputs; `info` (run settings and environment) goes into every
    report; `progress(n)` is told of answered ticks; `warn` of skipped data."""

    drive: DriveSource
    predictor: Predictor
    tracer: Tracer
    settings: ReplaySettings
    recorder: PredictionRecorder | None = None
    info: dict[str, Any] = field(default_factory=dict)
    progress: Callable[[int], None] = lambda n: None
    warn: Warn = print
