"""Reports of a replay run: the latency table, decode speed, accuracy, and the JSON, trace and plot files.

The JSON document (`REPORT_SCHEMA`) holds:
  run       settings and environment (hardware, commit, backend, dtype, precision, resolution, ...);
  ticks     offered, answered, measured and warm-up tick counts, skipped ticks by reason, achieved Hz, drop %;
  stages    one row per stage: stage, n, mean_ms, p50_ms, p90_ms, p99_ms, max_ms (measured ticks only);
  decode    TTFT and time to first trajectory token (ms statistics), t/s/u, t/s, batch (or null);
  accuracy  ticks, with_future, valid, samples, mean_m {"ade@1s": ..., "fde@6.4s": ..., "min_ade@3s": ...}.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alpamayo.prediction import DT_S
from alpamayo.profiling import STAGES
from alpamayo.profiling import plots as plotting
from alpamayo.profiling.stats import (
    DecodeStats,
    measured_durations,
    simulated_drop_pct,
    stage_table,
    summarize,
)
from alpamayo.replay.accuracy import error_key, summarize_accuracy
from alpamayo.replay.results import ReplayRun

REPORT_SCHEMA = "alpamayo.replay-report/1"
RECORDED_HZ = 1.0 / DT_S
TTFT_STAGES = ("preprocess", "vision", "prefill")


def tick_figures(run: ReplayRun) -> dict[str, Any]:
    """Counts, achieved rate and drops. Lock-step runs back to back, so its drop % is simulated: the share of
    ticks a newest-wins node would skip at the recorded 10 Hz given each tick's measured latency."""
    ticks = run.measured
    e2e_s = sum(t.e2e_ms for t in ticks) / 1e3
    if run.mode == "lockstep":
        hz = len(ticks) / e2e_s if e2e_s > 0 else 0.0
        drop = simulated_drop_pct([t.t0_ns for t in ticks], [round(t.e2e_ms * 1e6) for t in ticks])
        drop_basis = "simulated: newest-wins at the recorded rate with the measured tick latencies"
    else:
        hz = len(ticks) / run.wall_s if run.wall_s > 0 else 0.0
        drop = 100.0 * run.dropped / run.ticks_offered if run.ticks_offered else 0.0
        drop_basis = "measured: recorded ticks the node never answered"
    return {
        "offered": run.ticks_offered,
        "answered": len(run.ticks),
        "measured": len(ticks),
        "warmup": len(run.ticks) - len(ticks),
        "skipped": dict(run.skipped),
        "dropped": run.dropped,
        "recorded_hz": RECORDED_HZ,
        "achieved_hz": hz,
        "drop_pct": drop,
        "drop_basis": drop_basis,
    }


def decode_stats(run: ReplayRun) -> DecodeStats | None:
    """TTFT = preprocess + vision + prefill; first trajectory token = TTFT + reasoning decode + one
    trajectory-token step (trajectory decode / its token count), or with the action expert (no trajectory
    tokens) + its whole sampling, which yields every waypoint at once; t/s/u = decode tokens / decode time."""
    ticks = [t for t in run.measured if "prefill" in t.stages_ms and t.decode_tokens > 0]
    if not ticks:
        return None
    ttft = [sum(t.stages_ms.get(s, 0.0) for s in TTFT_STAGES) for t in ticks]
    first = [
        f
        + t.stages_ms.get("reasoning_decode", 0.0)
        + (
            t.stages_ms.get("trajectory_decode", 0.0) / t.trajectory_tokens
            if t.trajectory_tokens
            else t.stages_ms.get("expert", 0.0)
        )
        for f, t in zip(ttft, ticks, strict=True)
    ]
    decode_s = sum(
        t.stages_ms.get("reasoning_decode", 0.0) + t.stages_ms.get("trajectory_decode", 0.0) for t in ticks
    )
    tokens = sum(t.decode_tokens for t in ticks)
    batch = int(ticks[0].predicted_xyz.shape[0])
    tpsu = tokens / (decode_s / 1e3) if decode_s > 0 else 0.0
    return DecodeStats(summarize("ttft", ttft), summarize("first_trajectory_token", first), tpsu, batch)


def describe_run(info: dict[str, Any]) -> str:
    """One line: backend, device, dtype, precision, cameras and resolution, hardware and commit."""
    hw = info.get("hardware", {})
    res = info.get("resolution", {})
    cameras = info.get("cameras", [])
    return (
        f"{info.get('backend', '?')} {info.get('device', '?')} {info.get('dtype', '?')} "
        f"(precision {info.get('precision', '?')}), {len(cameras)} camera(s) {cameras} "
        f"{res.get('input', '?')} -> {res.get('model', '?')}, {hw.get('cpu', '?')} "
        f"({hw.get('torch_threads', '?')} torch threads), commit {info.get('commit', '?')}"
    )


# Reasons that differ only in their figures ("nearest 100 ms off", "200 ms off") are one kind of reason.
FIGURE = re.compile(r"[-+]?\d+(?:\.\d+)?")
REASON_KINDS_SHOWN = 2


def reason_kinds(reasons: Counter, shown: int = REASON_KINDS_SHOWN) -> str:
    """`reasons` (reason -> count) in one short line: the `shown` most frequent kinds of reason (reasons equal
    up to their figures), each as "N x <its first reason>", then how many other kinds. The JSON report keeps
    every reason."""
    kinds: dict[str, list] = {}
    for reason, n in reasons.items():
        kind = kinds.setdefault(FIGURE.sub("#", reason), [0, reason])
        kind[0] += n
    ranked = sorted(kinds.values(), key=lambda kind: -kind[0])
    parts = [f"{n} x {example}" for n, example in ranked[:shown]]
    if len(ranked) > shown:
        parts.append(f"{len(ranked) - shown} other kind(s), in the JSON report")
    return "; ".join(parts)


def latency_table(run: ReplayRun) -> str:
    """The per-stage latency table (ms) over the measured ticks, then achieved rate, drops and decode speed."""
    figures = tick_figures(run)
    if run.mode == "realtime":  # the node warms up on grey frames before the drive is sent
        excluded = f"the node's {run.info['node']['warmup_runs']} warm-up prediction(s) excluded"
    else:
        excluded = f"{figures['warmup']} warm-up tick(s) excluded"
    rows = [
        f"Latency per stage (ms) over {figures['measured']} measured ticks; {excluded}. {describe_run(run.info)}",
        f"{'stage':<26}{'n':>6}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
    ]
    for row in stage_table(run.tracer.spans):
        rows.append(
            f"{row.stage:<26}{row.n:>6}{row.mean_ms:>10.2f}{row.p50_ms:>10.2f}{row.p90_ms:>10.2f}"
            f"{row.p99_ms:>10.2f}{row.max_ms:>10.2f}"
        )
    rows.append(
        f"achieved {figures['achieved_hz']:.2f} Hz (recorded {RECORDED_HZ:g} Hz); drop {figures['drop_pct']:.1f}% "
        f"({figures['drop_basis']})"
    )
    if run.mode == "realtime":
        node = run.info.get("node", {})
        stale = sum(run.skipped.values())
        rows.append(
            f"real-time at {run.info.get('speed')}x: {run.dropped} of {run.ticks_offered} recorded ticks unanswered, "
            f"node frame_drop_perc {node.get('frame_drop_perc', 0.0):.1f}%, {stale} output(s) without a trajectory"
            f"{' (' + reason_kinds(run.skipped) + ')' if run.skipped else ''}; "
            f"{sum(not t.valid for t in run.ticks)} answer(s) marked invalid (stale inputs or frames)"
        )
    decode = decode_stats(run)
    if decode is not None:
        rows.append(
            f"decode: TTFT {decode.ttft.mean_ms:.1f} ms (p90 {decode.ttft.p90_ms:.1f}), time to first trajectory "
            f"token {decode.first_trajectory_token.mean_ms:.1f} ms, {decode.tokens_per_s_per_user:.1f} t/s/u, "
            f"{decode.tokens_per_s:.1f} t/s (batch {decode.batch})"
        )
    return "\n".join(rows)


def mean_accepted_length(blocks: Sequence[int]) -> float | None:
    """Tokens per verify over speculative blocks (None: no block, plain decoding)."""
    return sum(blocks) / len(blocks) if blocks else None


def speculation_line(blocks: Sequence[int]) -> str | None:
    """The summary's line on speculative decoding (None without a draft)."""
    mean = mean_accepted_length(blocks)
    if mean is None:
        return None
    return (
        f"speculative decoding: mean accepted length {mean:.2f} tokens per verify over {len(blocks)} blocks"
    )


def report_document(run: ReplayRun) -> dict[str, Any]:
    decode = decode_stats(run)
    return {
        "schema": REPORT_SCHEMA,
        "mode": run.mode,
        "run": run.info,
        "ticks": tick_figures(run),
        "stages": [row.as_dict() for row in stage_table(run.tracer.spans)],
        "decode": None if decode is None else decode.as_dict(),
        "accuracy": summarize_accuracy(run.measured).as_dict(),
        "mean_accepted_length": mean_accepted_length([n for t in run.measured for n in t.accepted_lengths]),
    }


def write_json(run: ReplayRun, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report_document(run), indent=2, sort_keys=True) + "\n")
    return path


def write_trace(run: ReplayRun, path: Path) -> Path:
    """Chrome trace JSON (Perfetto opens it): one track per stage, run settings in `metadata`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run.tracer.chrome_trace({"mode": run.mode, **run.info})))
    return path


def write_plots(run: ReplayRun, directory: Path) -> list[Path]:
    """latency_histograms.png, tick_timeline.png and birdseye.png (see alpamayo.profiling.plots)."""
    directory.mkdir(parents=True, exist_ok=True)
    title = describe_run(run.info)
    durations = measured_durations(run.tracer.spans)
    per_tick = {t.seq: {k: v for k, v in t.stages_ms.items() if k != "e2e_age"} for t in run.ticks}
    warmup = {t.seq for t in run.ticks if t.warmup}
    chosen = [run.ticks[i] for i in plotting.select_evenly(len(run.ticks))]
    panels = [
        plotting.BirdseyeTick(
            f"tick {t.seq}: ADE {t.errors_m[error_key('ade', 6.4)]:.2f} m" if t.errors_m else f"tick {t.seq}",
            t.predicted_xyz,
            t.future_xyz,
            t.history_xyz,
        )
        for t in chosen
    ]
    return [
        plotting.latency_histograms(durations, directory / "latency_histograms.png", title),
        plotting.tick_timeline(
            per_tick, warmup, [s for s in STAGES if s != "e2e_age"], directory / "tick_timeline.png", title
        ),
        plotting.birdseye(panels, directory / "birdseye.png", title),
    ]
