"""One replay from settings to files: open the drive, load the model, replay, write outputs and reports.

This is what `alpamayo replay`, `alpamayo profile` and `alpamayo demo` run; the commands only parse arguments.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from alpamayo.config.loader import checkpoint_family
from alpamayo.input_window import FRAME_OFFSETS_NS, FUTURE_OFFSETS_NS, HISTORY_OFFSETS_NS
from alpamayo.prediction import DT_S
from alpamayo.profiling import Tracer
from alpamayo.profiling.environment import hardware, software, source_commit
from alpamayo.replay.accuracy import summarize_accuracy
from alpamayo.replay.lockstep import replay_lockstep
from alpamayo.replay.outputs import PredictionRecorder
from alpamayo.replay.realtime import replay_realtime
from alpamayo.replay.report import latency_table, speculation_line, write_json, write_plots, write_trace
from alpamayo.replay.results import ReplayRun
from alpamayo.replay.ros2_outputs import Ros2Recorder
from alpamayo.replay.settings import ReplayJob, ReplaySettings
from alpamayo.replay.ticks import FRAME_TOLERANCE_NS
from alpamayo.runtime import AlpamayoVLA
from bridges.drives import PAI_PREFIX, DriveSource, open_drive
from bridges.drives.mcap_writer import RecordingWriter
from bridges.drives.recording import RecordingLayout, Warn

RUN_METADATA = "alpamayo.run"


def pai_cameras(settings: ReplaySettings, drive: str | Path | None = None) -> tuple[int, ...] | None:
    """The cameras to open a PhysicalAI-AV clip (`drive`, default `settings.drive`) with: `settings.cameras`,
    else the checkpoint family's driving cameras (Super: six); None for other drives (their layout decides)."""
    spec = str(settings.drive if drive is None else drive)
    if not spec.startswith(PAI_PREFIX):
        return settings.cameras
    return settings.cameras or checkpoint_family(settings.model.checkpoint).driving_cameras


def load_predictor(settings: ReplaySettings, tracer: Tracer) -> AlpamayoVLA:
    """The model of `settings.model` (`AlpamayoVLA.from_spec`), its stages recorded into `tracer`."""
    return AlpamayoVLA.from_spec(settings.model, tracer)


def run_info(settings: ReplaySettings, drive: DriveSource, predictor: AlpamayoVLA) -> dict[str, Any]:
    """Settings and environment recorded in every output (JSON report, trace metadata, MCAP metadata)."""
    size = drive.frame_size()
    input_size = "?" if size is None else "{}x{}".format(*size)
    return {
        "mode": settings.mode,
        "speed": settings.speed if settings.mode == "realtime" else None,
        "drive": str(settings.drive),
        "drive_kind": drive.kind,
        "checkpoint": settings.model.checkpoint,
        "backend": settings.model.backend,
        "device": settings.model.device,
        "dtype": settings.model.dtype,
        "reproducible": settings.model.reproducible,
        "precision": predictor.precision,
        "cameras": [c.camera for c in drive.layout.cameras],
        "resolution": {
            "input": input_size,
            "model": "?",  # known once a frame has been resized: set after the replay
        },
        "family": predictor.family.name,
        "decoder": predictor.decoder,
        "flow": None if predictor.expert is None else predictor.expert.record(),
        "samples": settings.num_samples,
        "sampling": {
            "temperature": predictor.sampling.temperature,
            "top_p": predictor.sampling.top_p,
            "top_k": predictor.sampling.top_k,
            "seed": settings.seed,
        },
        "warmup_ticks": settings.warmup,
        "hardware": hardware(settings.model.device),
        "software": software(),
        "commit": source_commit(),
    }


def print_warning(message: str) -> None:
    """The commands' `Warn`: one "warning: ..." line on stderr."""
    print(f"warning: {message}", file=sys.stderr)


def tqdm_warn(bar: tqdm) -> Warn:
    return lambda message: bar.write(f"warning: {message}", file=sys.stderr)


def run_replay(settings: ReplaySettings, warn: Warn = print_warning) -> ReplayRun:
    """Validate `settings`, open the drive, load the model, replay in the chosen mode and write the MCAP
    output and the trace, JSON and plot files asked for; `warn` is told of skipped data."""
    settings.validate()
    layout = None if settings.layout is None else RecordingLayout.load(settings.layout)
    drive = open_drive(settings.drive, layout, settings.pai_dir, pai_cameras(settings), warn)
    tracer = Tracer()
    try:
        predictor = load_predictor(settings, tracer)
    except BaseException:
        drive.close()
        raise
    print(predictor.model_line(), file=sys.stderr)
    writer = None
    try:
        info = run_info(settings, drive, predictor)
        recorder = None
        if settings.out is not None and settings.output_format == "ros2":
            writer = recorder = Ros2Recorder(settings.out)
        elif settings.out is not None:
            writer = RecordingWriter(settings.out)
            recorder = PredictionRecorder(writer, settings.encoding)
        total = expected_ticks(drive, settings.start_s, settings.duration_s)
        if settings.max_ticks is not None:
            total = min(total, settings.max_ticks)
        with tqdm(
            total=total,
            unit="tick",
            desc=settings.mode,
            disable=None if settings.progress else True,
            file=sys.stderr,
        ) as bar:
            replay = replay_realtime if settings.mode == "realtime" else replay_lockstep
            job = ReplayJob(drive, predictor, tracer, settings, recorder, info, bar.update, tqdm_warn(bar))
            run = replay(job)
        if predictor.model_resolution is not None:
            info["resolution"]["model"] = "{}x{}".format(*predictor.model_resolution)
        if isinstance(writer, RecordingWriter):
            writer.metadata(RUN_METADATA, {"json": json.dumps(info, sort_keys=True)})
        if writer is not None and settings.copy_inputs:
            copy_inputs(drive, run, writer)
    finally:
        predictor.close()
        drive.close()
        if writer is not None:
            writer.close()
    for path, write in ((settings.trace, write_trace), (settings.json, write_json)):
        if path is not None:
            write(run, path)
    if settings.plots is not None:
        write_plots(run, settings.plots)
    return run


def expected_ticks(drive: DriveSource, start_s: float = 0.0, duration_s: float | None = None) -> int:
    """Ticks the progress bar expects in the window [start_s, start_s + duration_s) after the first tick time
    or frame: the fixed tick times in it, or (MCAP drives) the reference camera's frames in it, taken at the
    model's 10 Hz, less those in the first 1.5 s (no history yet)."""
    if drive.tick_times_ns is not None:
        times = np.asarray(drive.tick_times_ns, dtype=np.int64)
        if len(times) == 0:
            return 1
        begin = times[0] + round(start_s * 1e9)
        end = None if duration_s is None else begin + round(duration_s * 1e9)
        return max(int(np.sum((times >= begin) & (True if end is None else times < end))), 1)
    frames = drive.info.message_counts[drive.layout.cameras[0].topic]

    def frame_at(t_s: float) -> int:  # the first frame at or after t_s (frames every DT_S from 0)
        return math.ceil(round(t_s / DT_S, 6))

    first = max(frame_at(start_s), len(HISTORY_OFFSETS_NS) - 1)
    end = frames if duration_s is None else min(frames, frame_at(start_s + duration_s))
    return max(end - first, 1)


def copy_inputs(drive: DriveSource, run: ReplayRun, writer: RecordingWriter | Ros2Recorder) -> None:
    """Copy the camera and pose messages the replayed ticks used (with their history and recorded future) into
    the output, so it opens in Foxglove on its own. A ROS 2 output takes only a bag's own CDR messages; a
    PhysicalAI-AV clip has no messages to copy."""
    if not run.ticks:
        return
    begin = run.ticks[0].t0_ns + min(HISTORY_OFFSETS_NS[0], FRAME_OFFSETS_NS[0] - FRAME_TOLERANCE_NS)
    end = run.ticks[-1].t0_ns + FUTURE_OFFSETS_NS[-1] + 1
    for schema, channel, message in drive.raw_messages(begin, end):
        writer.copy(schema, channel, message)


def summary(run: ReplayRun) -> str:
    """The accuracy and latency tables, and what was skipped."""
    lines = [summarize_accuracy(run.measured).table(), "", latency_table(run)]
    speculation = speculation_line([n for t in run.measured for n in t.accepted_lengths])
    if speculation is not None:
        lines.append(speculation)
    skipped = run.skipped if run.mode == "lockstep" else run.info.get("input_skips", {})
    if skipped:
        lines.append("skipped: " + ", ".join(f"{n} x {reason}" for reason, n in skipped.items()))
    return "\n".join(lines)
