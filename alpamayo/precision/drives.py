"""The recorded drive in `alpamayo precision`: its first ticks, one model's lock-step predictions on them
(`DriveRun`), the figures that compare two such runs (trajectory token agreement, ADE drift, each run's ADE to
the recorded future) and the eval-style minADE of the drive's first tick.

The lock-step runs are greedy, 4 frames per camera, the trajectory decoded as tokens. The minADE is what
`alpamayo eval` computes for the drive's clip: its first tick, `Settings.eval_samples` samples at eval's protocol
sampling (temperature 0.6, top-p 0.98), the clip's seed `clip_seed(id, 0)`, the checkpoint's trajectory decoder;
min over samples of the ADE to the recorded future at 6.4 s. Sampled, so the difference of two models' minADE
on one clip includes sampling noise wherever their reasoning tokens part.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alpamayo.backends import TORCH_CPU, BackendOptions
from alpamayo.config.loader import model_tokenizer
from alpamayo.config.model import ModelConfig
from alpamayo.contract import TextBackbone
from alpamayo.families.registry import REFERENCE_SAMPLING
from alpamayo.model_spec import ModelSpec
from alpamayo.precision.settings import Progress, Settings
from alpamayo.text import TextModel
from alpamayo.tt.quantized import QuantizedCheckpoint
from planner.metrics import ade

EVAL_SEED = 0  # alpamayo eval's default --seed
EVAL_HORIZON_S = 6.4


@dataclass
class DriveRun:
    """One model's lock-step predictions: per tick the 128 trajectory token ids, waypoints [64, 3] (t0 ego
    frame, metres) and the recorded future waypoints (None where the recording ends first)."""

    tokens: list[list[int]]
    xyz: list[np.ndarray]
    future: list[np.ndarray | None]


def drive_ticks(
    path: str | Path,
    count: int,
    warn: Callable[[str], None],
    layout: str | Path | None = None,
    pai_dir: str | Path | None = None,
    cameras: Sequence[int] | None = None,
) -> list[Any]:
    """The first `count` ticks of a recorded drive of any kind (`bridges.drives.open_drive`, with the YAML
    topic `layout` of an MCAP drive; the source stays open while its frames are decoded, and closes when
    collected)."""
    from alpamayo.replay.ticks import TickAssembler
    from bridges.drives import open_drive
    from bridges.drives.recording import RecordingLayout

    mapping = None if layout is None else RecordingLayout.load(layout)
    source = open_drive(path, mapping, pai_dir=pai_dir, cameras=cameras, warn=warn)
    ticks = list(islice(TickAssembler(source, warn=warn), count))
    if not ticks:
        raise ValueError(f"{path}: no tick has 4 frames per camera and 1.5 s of ego history")
    return ticks


def torch_text(text: TextBackbone) -> TextModel:
    """`text` as the torch `TextModel` the precision runs are (only it takes a K/V `kv_store`)."""
    if not isinstance(text, TextModel):
        raise TypeError(f"the precision drive runs the torch text model, not {type(text).__name__}")
    return text


def drive_vla(
    directory: Path,
    weights: QuantizedCheckpoint | None,
    cfg: ModelConfig,
    settings: Settings,
    store: Callable[[torch.Tensor], torch.Tensor] | None = None,
    options: BackendOptions = TORCH_CPU,
) -> Any:
    """The torch AlpamayoVLA (float32, CPU; `options` may quantise it) on the directory's weights, or on
    `weights` with K/V `store`; it decodes the trajectory tokens."""
    from alpamayo.runtime import AlpamayoVLA, planner_config
    from alpamayo.vlm import VisionLanguageModel
    from planner.pipeline import Planner

    vlm = VisionLanguageModel.from_checkpoint(directory, options, weights=weights, cfg=cfg)
    torch_text(vlm.text).kv_store = store
    planner = Planner.from_config(planner_config(vlm.config), model_tokenizer(vlm.config))
    return AlpamayoVLA(vlm, planner, max_reasoning_tokens=settings.max_reasoning_tokens)


def drive_run(vla: Any, ticks: Sequence[Any], label: str, progress: Progress) -> DriveRun:
    """The drive's ticks through `vla`; `progress` hears of each answered tick (a drive tick of a real model
    on the CPU takes tens of seconds)."""
    run = DriveRun([], [], [])
    for i, tick in enumerate(ticks):
        start = time.perf_counter()
        frames = {c: [f.rgb() for f in fs] for c, fs in tick.frames.items()}
        (sample,) = vla.predict(frames, tick.ego_history, frame_times_ns=tick.frame_times_ns).samples
        progress(f"{label}: drive tick {i + 1}/{len(ticks)} in {time.perf_counter() - start:.1f} s")
        run.tokens.append(list(sample.token_ids))
        run.xyz.append(sample.xyz)
        run.future.append(None if tick.future is None else tick.future[0])
    return run


def drive_figures(ref: DriveRun, run: DriveRun) -> dict[str, float]:
    """ticks, token_agreement, ade_drift_m (`run` against `ref`), and over the ticks with a recorded future
    ade_reference_m and ade_recipe_m (each run's ADE to it)."""
    with_future = [(i, f) for i, f in enumerate(ref.future) if f is not None]
    tokens = [
        np.mean([a == b for a, b in zip(x, y, strict=True)])
        for x, y in zip(ref.tokens, run.tokens, strict=True)
    ]
    figures = {
        "ticks": len(ref.tokens),
        "token_agreement": float(np.mean(tokens)),
        "ade_drift_m": float(np.mean([ade(b, a) for a, b in zip(ref.xyz, run.xyz, strict=True)])),
    }
    if with_future:
        figures["ade_reference_m"] = float(np.mean([ade(ref.xyz[i], f) for i, f in with_future]))
        figures["ade_recipe_m"] = float(np.mean([ade(run.xyz[i], f) for i, f in with_future]))
    return figures


def eval_min_ade(
    directory: Path,
    cfg: ModelConfig,
    settings: Settings,
    tick: Any,
    seed: int,
    label: str,
    progress: Progress,
    weights: QuantizedCheckpoint | None = None,
    store: Callable[[torch.Tensor], torch.Tensor] | None = None,
    options: BackendOptions = TORCH_CPU,
) -> float | None:
    """minADE @ 6.4 s of `tick` as `alpamayo eval` scores a clip (`alpamayo.replay.accuracy.tick_errors` over
    `settings.eval_samples` samples from `seed` at eval's protocol sampling `REFERENCE_SAMPLING`, the
    checkpoint's trajectory decoder);
    None where the recording ends before the tick's future does."""
    from alpamayo.replay.accuracy import error_key, tick_errors
    from alpamayo.runtime import AlpamayoVLA

    if tick.future is None:
        return None
    spec = ModelSpec(checkpoint=str(directory), max_reasoning_tokens=settings.max_reasoning_tokens)
    vla = AlpamayoVLA.from_spec(spec, options=options, weights=weights, cfg=cfg)
    torch_text(vla.vlm.text).kv_store = store
    start = time.perf_counter()
    frames = {c: [f.rgb() for f in fs] for c, fs in tick.frames.items()}
    prediction = vla.predict(
        frames,
        tick.ego_history,
        num_samples=settings.eval_samples,
        seed=seed,
        frame_times_ns=tick.frame_times_ns,
        sampling=REFERENCE_SAMPLING,
    )
    progress(f"{label}: eval tick, {settings.eval_samples} samples in {time.perf_counter() - start:.1f} s")
    errors = tick_errors(np.stack([s.xyz for s in prediction.samples]), tick.future[0])
    return None if errors is None else errors[error_key("min_ade", EVAL_HORIZON_S)]


def min_ade_figures(reference: float | None, got: float | None) -> dict[str, float] | None:
    """min_ade_m (`got`), reference_m and difference_m (got less reference); None where either is missing."""
    if reference is None or got is None:
        return None
    return {"min_ade_m": got, "reference_m": reference, "difference_m": got - reference}
