"""Replay and profiling through the real runtime and the demo checkpoint, end to end through the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import zmq
from mcap.reader import make_reader
from PIL import Image

from alpamayo.cli import build_parser, main
from alpamayo.commands.replay_args import settings_from_args
from alpamayo.demo_drive import START_NS, make_demo_drive
from alpamayo.model_spec import ModelSpec
from alpamayo.prediction import DT_S, FUTURE_STEPS, Prediction, TrajectorySample
from alpamayo.profiling import Tracer, plots
from alpamayo.replay.outputs import TIMINGS_TOPIC
from alpamayo.replay.realtime import _Collector, _drain, replay_realtime
from alpamayo.replay.report import REPORT_SCHEMA
from alpamayo.replay.settings import ReplayJob, ReplaySettings
from bridges.drives import open_drive
from bridges.node.server import InferenceNode
from bridges.wire.client import TrajectorySubscriber
from bridges.wire.protocol import TrajectoryMessage, encode_trajectory
from tests.bridge_nodes import node_config
from tests.test_recording import rewrite
from tests.test_tracer import assert_tracks_nest

# 1.7 s of the front camera: ticks at t0 = 1.5 and 1.6 s (the first needs 1.5 s of ego history). The random
# demo weights never end their reasoning, so a short cap keeps each tick to ~140 decode steps.
DRIVE = {"seconds": 1.7, "cameras": 1, "seed": 5, "size": (72, 128)}
FAST = ["--max-reasoning-tokens", "4", "--no-progress"]
# The discrete decoder (the demo checkpoint's default is its action expert), for tests that check the tokens.
TOKENS = [*FAST, "--decoder", "tokens"]


@pytest.fixture(scope="module")
def drive(tmp_path_factory) -> Path:
    return make_demo_drive(tmp_path_factory.mktemp("drive") / "drive.mcap", **DRIVE).path


def replay(drive: Path, checkpoint: Path, out: Path, *args: str) -> int:
    """`alpamayo replay DRIVE --checkpoint CHECKPOINT --out OUT ARGS...`; returns the exit code."""
    return main(["replay", str(drive), "--checkpoint", str(checkpoint), "--out", str(out), *args])


def messages(path: Path) -> dict[str, list[tuple[int, bytes]]]:
    out: dict[str, list[tuple[int, bytes]]] = {}
    with open(path, "rb") as f:
        for _, channel, message in make_reader(f).iter_messages(log_time_order=True):
            out.setdefault(channel.topic, []).append((message.log_time, message.data))
    return out


def test_lockstep_replay_is_byte_identical_across_runs_except_timings(
    tmp_path, demo_checkpoint, drive, capsys, record_figure
):
    outs = [tmp_path / "a.mcap", tmp_path / "b.mcap"]
    for out in outs:
        assert replay(drive, demo_checkpoint, out, "--no-progress") == 0
    printed = capsys.readouterr().out
    first, second = (messages(p) for p in outs)
    timings = first.pop(TIMINGS_TOPIC), second.pop(TIMINGS_TOPIC)
    assert len(timings[0]) == len(timings[1]) == 2
    assert first == second, _replay_difference(first, second)
    assert len(first["/alpamayo/prediction"]) == 2 and len(first["/alpamayo/recorded_future"]) == 2
    # The inputs are copied in, so one file opens in Foxglove with cameras, poses and predictions.
    assert {"/cameras/camera_front_wide_120fov/compressed", "/ego/pose", "/tf"} <= set(first)
    prediction = json.loads(first["/alpamayo/prediction"][0][1])
    # The demo checkpoint's default decoder, the action expert (its seeded noise replays identically too).
    assert prediction["valid"] and prediction["decoder"] == "expert"
    assert len(prediction["samples"][0]["x"]) == 64 and prediction["samples"][0]["token_ids"] == []
    assert "ADE" in printed and "Latency per stage" in printed and "t/s/u" in printed
    record_figure("ADE@6.4s of the first tick (m, random weights)", prediction["errors_m"]["ade@6.4s"])


def concurrent_replays(
    drive: Path, checkpoint: Path, out: Path, runs: dict[str, tuple[int, list[str]]]
) -> dict:
    """Lock-step replays in separate processes at once, each `name: (torch threads, extra args)`, beside a busy
    loop; returns each run's messages by topic, the timings topic left out."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "alpamayo.cli", "replay", str(drive), "--checkpoint", str(checkpoint)]
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        procs = {
            name: subprocess.Popen(
                [
                    *command,
                    "--out",
                    str(out / f"{name}.mcap"),
                    "--no-progress",
                    "--max-reasoning-tokens",
                    "8",
                    *args,
                ],
                env={**env, "OMP_NUM_THREADS": str(threads)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name, (threads, args) in runs.items()
        }
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, (name, err[-2000:])
    finally:
        busy.kill()
        busy.wait()
    outputs = {name: messages(out / f"{name}.mcap") for name in runs}
    for topics in outputs.values():
        assert len(topics.pop(TIMINGS_TOPIC)) == 2
    return outputs


# Sampled at T 0.6, the Alpamayo families' default (the demo layout's own is greedy), with a fixed seed, in the
# mode whose bytes do not depend on the thread count (on this project's AMD host the default mode's do not
# either, measured; on an Intel host MKL's GEMM rounds by thread count, alpamayo.reproducibility.mode).
SAMPLED = ["--temperature", "0.6", "--seed", "3", "--reproducible"]


def test_lockstep_replays_in_three_processes_at_1_2_2_threads_under_load_with_any_draft_publish_the_same_bytes(
    tmp_path, demo_checkpoint, drive
):
    """Plain decoding at one thread, `--draft lookup` and `--draft previous` at two, at once beside a busy loop:
    a verify block keeps exactly the tokens plain sampling draws (keyed by row seed and position) and its
    float32 K/V are one-token decoding's bit for bit (alpamayo.text.linear), so every run publishes the same
    bytes."""
    runs = {
        "plain": (1, SAMPLED),
        "lookup": (2, [*SAMPLED, "--draft", "lookup"]),
        "previous": (2, [*SAMPLED, "--draft", "previous"]),
    }
    outputs = concurrent_replays(drive, demo_checkpoint, tmp_path, runs)
    assert len(outputs["plain"]["/alpamayo/prediction"]) == 2
    for name in ("lookup", "previous"):
        assert outputs[name] == outputs["plain"], (name, _replay_difference(outputs["plain"], outputs[name]))


def test_k_sampled_rows_each_equal_a_one_sample_run_of_their_seed(tmp_path, demo_checkpoint, drive):
    """--samples 3 and --samples 1 at the same seed, --reproducible, at once beside a busy loop: the first row of
    every prediction is the one-sample run's bit for bit (a row's tokens and expert noise depend only on its own
    row seed, `alpamayo.generation.row_seeds`, and the CPU linears round each row alike whatever their number),
    and the other rows are samples of their own."""
    runs = {"one": (1, [*SAMPLED, "--samples", "1"]), "three": (2, [*SAMPLED, "--samples", "3"])}
    outputs = concurrent_replays(drive, demo_checkpoint, tmp_path, runs)
    one, three = (
        [json.loads(data) for _, data in outputs[name]["/alpamayo/prediction"]] for name in ("one", "three")
    )
    assert len(one) == len(three) == 2
    for alone, rows in zip(one, three, strict=True):
        assert len(alone["samples"]) == 1 and len(rows["samples"]) == 3
        assert rows["samples"][0] == alone["samples"][0]
        assert rows["samples"][1] != rows["samples"][0] and rows["samples"][2] != rows["samples"][1]


def _replay_difference(first: dict, second: dict) -> str:
    """Which topics of two replays' outputs differ, and by how much their waypoints and reasoning do: this
    comparison failed twice in ~40 runs on the loaded 2-core machine (2026-12-03) and never in 75 repeats in
    one process, and the next failure should say whether it is rounding or another input."""
    topics = sorted(t for t in first.keys() | second.keys() if first.get(t) != second.get(t))
    lines = [f"differing topics: {topics}"]
    pairs = zip(first.get("/alpamayo/prediction", []), second.get("/alpamayo/prediction", []), strict=False)
    for (_, a), (_, b) in pairs:
        pa, pb = json.loads(a), json.loads(b)
        sa, sb = pa["samples"][0], pb["samples"][0]
        drift = max(abs(u - v) for k in "xyz" for u, v in zip(sa[k], sb[k], strict=True))
        same = sa["reasoning_token_ids"] == sb["reasoning_token_ids"]
        lines.append(f"t0 {pa['t0_ns']}: max waypoint difference {drift:.3g} m, same reasoning {same}")
    return "; ".join(lines)


def test_profile_writes_the_report_a_valid_trace_and_plots(tmp_path, demo_checkpoint, capsys):
    trace, report, plot_dir = tmp_path / "trace.json", tmp_path / "report.json", tmp_path / "plots"
    args = ["profile", "--synthetic", "--checkpoint", str(demo_checkpoint), "--warmup", "1", "--iters", "2"]
    args += ["--cameras", "1", "--size", "72x128", *FAST]
    args += ["--trace", str(trace), "--json", str(report), "--plots", str(plot_dir)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "1 warm-up tick(s) excluded" in printed

    doc = json.loads(report.read_text())
    assert doc["schema"] == REPORT_SCHEMA
    assert doc["ticks"]["measured"] == 2 and doc["ticks"]["warmup"] == 1
    assert {"hardware", "commit", "backend", "dtype", "precision", "resolution"} <= set(doc["run"])
    stages = {row["stage"]: row for row in doc["stages"]}
    for stage in ("receive", "decode", "prefill", "reasoning_decode", "expert", "e2e_age"):
        assert stages[stage]["n"] == 2, stage
        assert 0 < stages[stage]["p50_ms"] <= stages[stage]["p90_ms"] <= stages[stage]["max_ms"]
    # After the warm-up tick only each camera's newest frame is encoded; the three older ones are cached.
    assert stages["vision (encoded)"]["n"] == 2 and stages["vision (cached)"]["n"] == 6
    assert doc["decode"]["tokens_per_s_per_user"] > 0 and doc["decode"]["ttft_ms"]["n"] == 2

    tracks = assert_tracks_nest(json.loads(trace.read_text()))
    assert set(tracks.values()) == {row["stage"].split(" (")[0] for row in doc["stages"]}  # one per stage

    for name in ("latency_histograms.png", "tick_timeline.png", "birdseye.png"):
        with Image.open(plot_dir / name) as img:
            assert img.format == "PNG" and img.size == plots.FIGURE_PX


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not an mcap file", "not an MCAP file"),
        (None, "lacks topic(s)"),
    ],
)
def test_broken_recordings_are_a_clear_error_not_a_traceback(
    tmp_path, demo_checkpoint, drive, capsys, content, message
):
    path = tmp_path / "broken.mcap"
    layout = []
    if content is None:  # a layout naming a camera the drive does not have
        (tmp_path / "layout.yaml").write_text(
            "cameras:\n  - {topic: /cameras/missing/compressed, camera: 3}\n"
        )
        path = drive
        layout = ["--layout", str(tmp_path / "layout.yaml")]
    else:
        path.write_bytes(content)
    code = replay(path, demo_checkpoint, tmp_path / "o.mcap", *layout)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err


def test_truncated_recording_replays_what_is_left_with_a_warning(tmp_path, demo_checkpoint, drive, capsys):
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(drive.read_bytes()[:-200])  # footer and summary lost
    out = tmp_path / "o.mcap"
    assert replay(cut, demo_checkpoint, out, "--no-progress") == 0
    assert "truncated" in capsys.readouterr().err
    assert len(messages(out)["/alpamayo/prediction"]) == 2


def test_a_window_without_ticks_is_a_clear_error(tmp_path, demo_checkpoint, drive, capsys):
    assert replay(drive, demo_checkpoint, tmp_path / "o.mcap", "--start", "100") == 2
    err = capsys.readouterr().err
    assert "has no tick between 100 s and the end" in err and "Traceback" not in err


def test_realtime_replay_drives_the_node_and_accounts_for_every_tick(
    tmp_path, demo_checkpoint, drive, capsys
):
    out, report = tmp_path / "rt.mcap", tmp_path / "rt.json"
    assert (
        replay(drive, demo_checkpoint, out, "--json", str(report), "--realtime", "--speed", "2", *TOKENS) == 0
    )
    printed = capsys.readouterr().out
    assert (
        "real-time at 2.0x" in printed
        and "measured ticks; the node's 1 warm-up prediction(s) excluded" in printed
    )
    result = json.loads(report.read_text())
    ticks = result["ticks"]
    # A failure here once (a clean-clone run, 2026-12-03) answered neither tick and waited out the drain's
    # 120 s; what the node saw and said is kept in the message so the next one can be told apart.
    assert ticks["offered"] == 2 and ticks["answered"] >= 1, (ticks, result["run"]["node"])
    assert ticks["answered"] + ticks["dropped"] == ticks["offered"]
    answered = [json.loads(data) for _, data in messages(out)["/alpamayo/prediction"]]
    assert len(answered) == ticks["answered"]
    # Answers are for recorded ticks (t0 = 1.5 or 1.6 s into the drive) and carry 64 waypoints and 128 tokens.
    for prediction in answered:
        assert round((prediction["t0_ns"] - START_NS) / 1e8) in (15, 16)
        assert len(prediction["samples"][0]["x"]) == 64 and len(prediction["samples"][0]["token_ids"]) == 128


def test_the_real_time_collector_counts_an_undecodable_output_and_raises_what_ends_it():
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    good = encode_trajectory(
        TrajectoryMessage(seq=7, t0_ns=None, valid=False, invalid_reasons=["ego: stale"])
    )
    collector = _Collector(TrajectorySubscriber(f"tcp://127.0.0.1:{port}"))
    collector.start()
    try:
        deadline = time.monotonic() + 10.0
        while not collector.outputs:  # PUB drops what it sends before the subscription arrives
            assert time.monotonic() < deadline, "the collector received nothing"
            pub.send(b"\x93not a trajectory")
            pub.send(good)
            time.sleep(0.05)
        assert collector.is_alive() and collector.error is None
        assert collector.undecodable and all(
            r.startswith("an output that does not decode (malformed): ") for r in collector.undecodable
        )
        assert collector.outputs[0][1].seq == 7
    finally:
        collector.stop.set()
        collector.join()
        collector.subscriber.close()
        pub.close()

    # A socket error is no output to skip: it ends the collector, which ends the drain at once.
    dead = _Collector(TrajectorySubscriber(f"tcp://127.0.0.1:{port}"))
    dead.subscriber.close()
    dead.start()
    dead.join(5.0)
    assert not dead.is_alive() and isinstance(dead.error, zmq.ZMQError)
    start = time.monotonic()
    _drain(dead, InferenceNode(None, node_config()), 0)
    assert time.monotonic() - start < 1.0


class PacedPredictor:
    """A predictor that sleeps `warmup_s` on each warm-up call (no frame times) and, on the drive's calls,
    `tick_s` or, with `stall` set, until `release` is set; answers straight ahead at 10 m/s."""

    def __init__(self, warmup_s: float, tick_s: float, stall: bool = False):
        self.warmup_s, self.tick_s, self.stall = warmup_s, tick_s, stall
        self.release = threading.Event()

    def predict(
        self,
        frames,
        ego_history,
        route=None,
        num_samples=1,
        seed=None,
        frame_times_ns=None,
        stream=None,
        cancel=None,
    ):
        if frame_times_ns is None:
            time.sleep(self.warmup_s)
        elif self.stall:
            self.release.wait()
        else:
            time.sleep(self.tick_s)
        t = DT_S * np.arange(1, FUTURE_STEPS + 1)
        xyz = np.stack([10.0 * t, np.zeros_like(t), np.zeros_like(t)], axis=1)
        return Prediction(
            [TrajectorySample("", [], [], np.zeros((FUTURE_STEPS, 2)), xyz, np.zeros_like(t))], t
        )

    def reset(self) -> None:
        pass

    def close(self) -> None:
        self.release.set()


def realtime_job(drive: Path, predictor: PacedPredictor) -> ReplayJob:
    settings = ReplaySettings(drive=drive, model=ModelSpec("unused"), mode="realtime", speed=2.0)
    return ReplayJob(open_drive(drive, None, None, None, print), predictor, Tracer(), settings)


def test_realtime_replay_waits_for_a_slow_node_and_calls_a_stalled_one_stalled(drive):
    # Each tick takes 8x the warm-up: the replay waits for both answers (it once gave up after a fixed 120 s).
    slow = PacedPredictor(warmup_s=0.25, tick_s=2.0)
    run = replay_realtime(realtime_job(drive, slow))
    assert run.ticks_offered == 2 and len(run.ticks) + run.dropped == 2
    assert run.ticks[-1].t0_ns == START_NS + 1_600_000_000  # the last tick is always answered
    # A prediction that does not return: the replay says so once it has run 20x the warm-up, and ends.
    stuck = PacedPredictor(warmup_s=0.25, tick_s=0.0, stall=True)
    start = time.monotonic()
    with pytest.raises(
        RuntimeError, match=r"the node's prediction has run \d+ s, 20x its warm-up prediction"
    ):
        replay_realtime(realtime_job(drive, stuck))
    stuck.close()
    assert time.monotonic() - start < 60.0


@pytest.mark.parametrize(
    ("broken_frame", "expected_ticks"),
    [
        (13, (2, 1, 1)),  # frames at 0.0, 0.1, ... s: the oldest frame of the tick at 1.5 s, which lacks it
        (1, None),  # the first frame sent (0.0 s, before either tick's frames): the warm-up size comes later
    ],
)
def test_realtime_replay_skips_a_frame_that_does_not_decode_with_a_warning(
    tmp_path, demo_checkpoint, drive, capsys, broken_frame, expected_ticks
):
    frames = {"n": 0}

    def corrupt_one_frame(topic, message):
        if topic.endswith("/compressed"):
            frames["n"] += 1
            if frames["n"] == broken_frame:
                message["data"] = message["data"][:50]
        return message

    broken = rewrite(drive, tmp_path / "broken.mcap", corrupt_one_frame)
    report = tmp_path / "rt.json"
    code = replay(broken, demo_checkpoint, tmp_path / "rt.mcap", "--json", str(report), "--realtime", *FAST)
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    t_ns = START_NS + (broken_frame - 1) * 100_000_000
    assert f"warning: skipped a frame: camera 1 frame at {t_ns} ns: jpeg header" in err
    ticks = json.loads(report.read_text())["ticks"]
    if expected_ticks is not None:
        assert (ticks["offered"], ticks["answered"], ticks["dropped"]) == expected_ticks
    else:
        assert ticks["offered"] == 2 and ticks["answered"] >= 1


def test_realtime_replay_of_a_drive_whose_frames_all_fail_to_decode_is_a_clear_error(
    tmp_path, demo_checkpoint, drive, capsys
):
    def corrupt(topic, message):
        if topic.endswith("/compressed"):
            message["data"] = message["data"][:50]
        return message

    broken = rewrite(drive, tmp_path / "broken.mcap", corrupt)
    assert replay(broken, demo_checkpoint, tmp_path / "rt.mcap", "--realtime", *FAST) == 2
    err = capsys.readouterr().err
    assert f"alpamayo replay: error: {broken}: no camera frame between" in err and "Traceback" not in err


def test_backend_arguments_reach_the_replay_settings():
    backend = ["--backend", "ttnn", "--recipe", "accuracy", "--tt-cache", "cache", "--moe-config", "moe.yaml"]
    args = build_parser().parse_args(["profile", "--synthetic", "--checkpoint", "ck", *backend])
    settings = settings_from_args(args, Path("drive.mcap"), None)
    assert (settings.model.backend, settings.model.recipe) == ("ttnn", "accuracy")
    assert (settings.model.tt_cache, settings.model.moe_config) == ("cache", "moe.yaml")


def test_speed_without_realtime_is_refused_not_ignored():
    def settings(*args: str):
        parsed = build_parser().parse_args(["profile", "--synthetic", "--checkpoint", "ck", *args])
        return settings_from_args(parsed, Path("d.mcap"), None)

    assert settings().speed == settings("--lockstep").speed == 1.0
    assert settings("--realtime", "--speed", "2").speed == 2.0
    for mode in ([], ["--lockstep"]):
        with pytest.raises(ValueError, match="--speed 2 applies to --realtime only"):
            settings(*mode, "--speed", "2")


def test_output_paths_are_checked_before_the_replay_runs(tmp_path):
    (tmp_path / "file.png").write_bytes(b"")
    base = ReplaySettings(drive=tmp_path / "d.mcap", model=ModelSpec(tmp_path))
    base.validate()
    for option, field, value, message in [
        ("--out", "out", tmp_path, "is a directory; expected a file path"),
        ("--trace", "trace", tmp_path, "is a directory; expected a file path"),
        ("--json", "json", tmp_path, "is a directory; expected a file path"),
        ("--plots", "plots", tmp_path / "file.png", "is a file; expected a directory"),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"{option} {value} {message}")):
            replace(base, **{field: value}).validate()
