"""`alpamayo plan`'s stream tick: the frames it sends through vision are the frames the runtime encodes.

The plan prices a first prediction (every frame through the vision tower) and a stream's 10 Hz tick (the new
frames only) from `alpamayo.runtime.frames_to_encode`; here a lock-step replay of a demo drive (one tick per
10 Hz frame) counts the runtime's own vision forwards per tick (`vision` spans not served by its frame
cache), on torch and on ttnn under the dry run, and the plan's printed frame counts are checked against them.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections import Counter

import pytest

from alpamayo.cli import main
from alpamayo.demo_drive import make_demo_drive
from alpamayo.model_spec import ModelSpec
from alpamayo.prediction import FRAMES_PER_CAMERA
from alpamayo.replay.session import run_replay
from alpamayo.replay.settings import ReplaySettings
from alpamayo.runtime import frames_to_encode

CAMERAS = 2
# 1.8 s: ticks at t0 = 1.5, 1.6, 1.7 s (the first needs 1.5 s of ego history), one per 10 Hz frame
DRIVE = {"seconds": 1.8, "cameras": CAMERAS, "seed": 7, "size": (72, 128)}


@pytest.fixture(scope="module")
def drive(tmp_path_factory):
    return make_demo_drive(tmp_path_factory.mktemp("drive") / "drive.mcap", **DRIVE).path


@pytest.fixture(scope="module")
def encoded_per_tick(drive, demo_checkpoint) -> list[int]:
    model = ModelSpec(demo_checkpoint, max_reasoning_tokens=2, decoder="tokens")
    settings = ReplaySettings(drive, model, progress=False, copy_inputs=False)
    run = run_replay(settings)
    misses = Counter(
        s.args["tick"] for s in run.tracer.spans if s.name == "vision" and not s.args.get("cached", True)
    )
    return [misses[t.seq] for t in run.ticks]


def test_the_runtime_encodes_what_frames_to_encode_says_on_a_replayed_drive(encoded_per_tick):
    assert len(encoded_per_tick) == 3
    first, *ticks = encoded_per_tick
    assert first == frames_to_encode(CAMERAS) == CAMERAS * FRAMES_PER_CAMERA
    assert ticks == [frames_to_encode(CAMERAS, shift=1)] * 2 == [CAMERAS] * 2


@pytest.mark.dryrun
def test_the_ttnn_backend_encodes_the_same_frames_per_tick(dryrun_device, drive, demo_checkpoint, tmp_path):
    """The same replay on `--backend ttnn` (a child process under the session's dry run: its device vision
    tower behind the same frame cache): after the first tick only each camera's newest frame is encoded."""
    report = tmp_path / "report.json"
    argv = ["replay", str(drive), "--checkpoint", str(demo_checkpoint), "--out", str(tmp_path / "out.mcap")]
    argv += ["--backend", "ttnn", "--warmup", "1"]
    argv += ["--decoder", "tokens", "--max-reasoning-tokens", "2", "--no-progress", "--json", str(report)]
    proc = subprocess.run([sys.executable, "-m", "alpamayo.cli", *argv], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stages = {row["stage"]: row["n"] for row in json.loads(report.read_text())["stages"]}
    steady = 2  # the ticks after the warm-up one
    assert stages["vision (encoded)"] == steady * frames_to_encode(CAMERAS, shift=1)
    assert stages["vision (cached)"] == steady * (
        frames_to_encode(CAMERAS) - frames_to_encode(CAMERAS, shift=1)
    )


def test_plan_prints_a_stream_tick_with_the_runtimes_frame_counts(encoded_per_tick, capsys):
    images = CAMERAS * FRAMES_PER_CAMERA
    argv = ["plan", "--checkpoint", "alpamayo-1.5-10b", "--images", str(images), "--accept-len", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    cold = float(
        re.search(r"total per prediction: +roofline +([\d.]+) ms .*: a first prediction", out).group(1)
    )
    tick = re.search(r"a stream's tick: +roofline +([\d.]+) ms .*: (\d+) of (\d+) frames through vision", out)
    assert (int(tick.group(2)), int(tick.group(3))) == (encoded_per_tick[1], encoded_per_tick[0])
    per_frame, frames = re.search(r"vision \((\d+) frames\) +([\d.]+) ms x", out).group(2, 1)
    assert int(frames) == encoded_per_tick[0]
    saved = (encoded_per_tick[0] - encoded_per_tick[1]) * float(per_frame)
    assert float(tick.group(1)) == pytest.approx(cold - saved, abs=0.15)
    free = float(re.search(r"model-free draft \(lookup, previous\): roofline +([\d.]+) ms", out).group(1))
    tick_free = float(re.search(r"a stream's tick, model-free draft: roofline +([\d.]+) ms", out).group(1))
    assert tick_free == pytest.approx(free - saved, abs=0.15)


def test_a_prompt_that_is_not_whole_windows_gets_no_tick_line(capsys):
    assert main(["plan", "--checkpoint", "alpamayo-1.5-10b", "--images", "6"]) == 0
    assert "a stream's tick" not in capsys.readouterr().out


def test_the_floor_line_prices_the_ticks_rest_and_what_would_lower_it(capsys):
    """The model-free floor of a stream's tick at tau = 4: its rest (everything but the decode), the first
    block (verified in the prefill) and the other 15 verifies' reads (the weights and the context's K/V, once
    each); the fidelity trades it names are
    the verify estimate at those bfp4 groups over those 15, and one more token per verify drops the verifies
    it saves."""
    from alpamayo.config.builtin import builtin_expert
    from alpamayo.plan.device_spec import P150
    from alpamayo.plan.estimate import decode_estimate, first_block_ms, verify_estimate
    from alpamayo.plan.precision import load_precision

    assert main(["plan", "--checkpoint", "alpamayo-1.5-10b", "--accept-len", "4"]) == 0
    out = capsys.readouterr().out
    tick = float(re.search(r"a stream's tick: +roofline +([\d.]+) ms", out).group(1))
    cfg, precision = builtin_expert("alpamayo-1.5-10b")[0], load_precision("performance")
    context = 3072 + 64
    step, verify = (
        decode_estimate(cfg, precision, context, 64),
        verify_estimate(cfg, precision, context, 8, 16),
    )
    rest, first, floor, least = re.search(
        r"roofline floor, model-free: the rest of a stream's tick .* ([\d.]+) ms, the first block ([\d.]+) ms and the 15 "
        r"verifies' reads alone ([\d.]+) ms .*: ([\d.]+) ms at the least",
        out,
    ).groups()
    assert float(rest) == pytest.approx(tick - 64 * step.ms(P150), abs=0.15)
    assert float(first) == pytest.approx(first_block_ms(cfg, precision, 3072, 7), abs=0.05)
    weights = sum(op.dram_bytes for op in verify.ops if ".sdpa." not in op.name)
    kv = sum(op.dram_bytes for op in verify.ops if ".sdpa." in op.name)
    assert kv > 0 and float(floor) == pytest.approx(15e3 * (weights + kv) / P150.dram_bandwidth, abs=0.05)
    assert float(least) == pytest.approx(float(rest) + float(first) + float(floor), abs=0.15)
    head = re.search(r"a bfp4 lm_head ([\d.]+) ms less", out).group(1)
    bfp4 = load_precision("performance")
    bfp4 = type(bfp4)("bfp4 head", {**bfp4.dtypes, "lm_head": "bfp4"}, bfp4.fidelity)
    saved = 15 * (verify.ms(P150) - verify_estimate(cfg, bfp4, context, 8, 16).ms(P150))
    assert float(head) == pytest.approx(saved, abs=0.05) and saved > 0
    fewer, gain = re.search(r"at 5, (\d+) verifies fewer, ([\d.]+) ms less", out).groups()
    assert int(fewer) == 16 - math.ceil(64 / 5)
    assert float(gain) == pytest.approx(int(fewer) * verify.ms(P150), abs=0.05)
