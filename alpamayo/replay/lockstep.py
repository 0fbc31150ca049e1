"""Lock-step replay: every tick of a recorded drive, in order, through the predictor; nothing is dropped.

Stages per tick (spans stamped with the tick by `Tracer.tick`): `receive` (read and parse the tick's
messages), `decode` (JPEG/raw to RGB, new frames only), the predictor's own stages (it records into the same
tracer), `serialise` and `publish` (MCAP output), and `e2e_age` = publish end minus the tick's start. With
greedy decoding and the same machine, two runs write byte-identical outputs except the timings topic
(`MKL_CBWR` pins float32 GEMM paths, and MKL's first vector-math call runs on one thread; see
`alpamayo.reproducibility.process`).
"""

from __future__ import annotations

import time
from collections import Counter

from alpamayo.replay.accuracy import invalid_reasons, score_tick
from alpamayo.replay.outputs import TickOutput
from alpamayo.replay.results import ReplayRun, TickResult
from alpamayo.replay.routes import route_source
from alpamayo.replay.settings import ReplayJob
from alpamayo.replay.ticks import Tick, TickAssembler
from bridges.drives.recording import FrameError

# A tick whose route source has no text for it (past a route file's rows, the recording's end) has no guided
# branch: with --nav-guidance it is skipped.
NO_ROUTE = "no route text at this tick (--nav-guidance needs one)"


def replay_lockstep(job: ReplayJob) -> ReplayRun:
    """Replay the ticks of the drive in [start_s, start_s + duration_s) (at most `max_ticks`), the first
    `warmup` answered ticks marked warm-up."""
    drive, tracer, settings, recorder, warn = job.drive, job.tracer, job.settings, job.recorder, job.warn
    settings.validate()
    max_ticks, warmup = settings.max_ticks, settings.warmup
    assembler = TickAssembler(drive, settings.start_s, settings.duration_s, warn)
    routes = route_source(settings.route, settings.route_file, drive.poses)
    ticks = iter(assembler)
    results: list[TickResult] = []
    skipped: Counter = Counter()
    offered = 0
    wall_start = time.perf_counter()
    while max_ticks is None or offered < max_ticks:
        begin = time.perf_counter_ns()
        tick = next(ticks, None)
        if tick is None:
            break
        offered += 1
        route = None if routes is None else routes.text_at(tick.t0_ns)
        if route is None and settings.model.nav_guidance is not None:
            skipped[NO_ROUTE] += 1
            warn(f"skipped the tick at t0 = {tick.t0_ns} ns: {NO_ROUTE}")
            continue
        mark = tracer.mark()
        with tracer.tick(tick.index, warmup=len(results) < warmup):
            tracer.record("receive", begin, time.perf_counter_ns() - begin)
            result = _run_tick(tick, job, begin, route)
        if isinstance(result, FrameError):
            skipped["a frame does not decode"] += 1
            warn(f"skipped the tick at t0 = {tick.t0_ns} ns: {result}")
            continue
        result.warmup = len(results) < warmup
        result.stages_ms = tracer.totals_ms(mark)
        result.e2e_ms = result.stages_ms.get("e2e_age", 0.0)
        if recorder is not None:
            recorder.timings(result.seq, result.t0_ns, result.stages_ms, result.e2e_ms)
        results.append(result)
        job.progress(1)
    if offered == 0:
        raise assembler.no_ticks_error()
    skipped.update(assembler.skipped)
    skipped.update(drive.skipped)
    return ReplayRun(
        "lockstep", results, tracer, offered, time.perf_counter() - wall_start, job.info, skipped=skipped
    )


def _run_tick(tick: Tick, job: ReplayJob, begin: int, route: str | None) -> TickResult | FrameError:
    tracer, recorder = job.tracer, job.recorder
    try:
        with tracer.span("decode") as args:
            args["frames"] = sum(not f.decoded for fs in tick.frames.values() for f in fs)
            frames = {c: [f.rgb() for f in fs] for c, fs in tick.frames.items()}
    except FrameError as e:
        return e
    prediction = job.predictor.predict(
        frames,
        tick.ego_history,
        route=route,
        num_samples=job.settings.num_samples,
        seed=job.settings.seed,
        frame_times_ns=tick.frame_times_ns,
        stream=str(job.settings.drive),  # the `previous` draft's stream: this drive (an eval clip: its own)
    )
    best = prediction.best
    result = score_tick(
        tick.index,
        tick.t0_ns,
        tick.ego_history,
        prediction,
        tick.future,
        invalid_reasons(prediction),
        decode_tokens=len(best.reasoning_token_ids) + len(best.token_ids),
    )
    if recorder is not None:
        output = TickOutput.of(result, tick.frame_times_ns, tick.ego_history, prediction, tick.future, route)
        with tracer.span("serialise"):
            encoded = recorder.serialise(output)
        with tracer.span("publish"):
            recorder.publish(encoded, tick.t0_ns)
    tracer.record("e2e_age", begin, time.perf_counter_ns() - begin)
    return result
