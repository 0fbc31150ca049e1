"""`--backend ttnn` commands end to end under the dry run (marked `dryrun`; see `alpamayo.tt.dryrun`).

Each command runs as the console script in a child process, which inherits the session's dry run and opens
its own mock p150: `generate` (text and `--json`, with and without an image, the packed-weight cache written
and then loaded) and the runtime's `predict` on the demo checkpoint. The mock computes nothing, so these
check that every command gets through the device code and what reaches stdout, not the tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from PIL import Image

from alpamayo.tt.device import dry_run_active
from tests.test_runtime import frames_at, predict_argv, straight_history, write_prediction_inputs
from tests.tt_checkpoints import TT_TINY, save_tt_checkpoint

pytestmark = pytest.mark.dryrun
DEVICE_OPEN_LINE = "Opening user mode device driver"  # tt-metal's, written on file descriptor 1


def alpamayo(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "alpamayo.cli", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def checkpoint(dryrun_device, tmp_path_factory):
    """gqa2 with the small test vision tower; `dryrun_device` only for its skip and the session's dry run."""
    path = tmp_path_factory.mktemp("gqa2")
    save_tt_checkpoint(path, "gqa2", seed=13)
    return path


def generate(checkpoint, cache, *extra: str) -> subprocess.CompletedProcess:
    args = ["generate", "--checkpoint", str(checkpoint), "--prompt", "Lane ahead?", "--max-new-tokens", "3"]
    return alpamayo(*args, "--backend", "ttnn", "--recipe", "accuracy", "--tt-cache", str(cache), *extra)


def test_generate_json_keeps_stdout_to_the_json_and_caches_the_packed_weights(checkpoint, tmp_path):
    assert dry_run_active()
    cache = tmp_path / "cache"
    proc = generate(checkpoint, cache, "--json")
    out = json.loads(proc.stdout)  # tt-metal's device lines went to stderr, not into the JSON
    assert DEVICE_OPEN_LINE in proc.stderr and DEVICE_OPEN_LINE not in proc.stdout
    assert 1 <= len(out["token_ids"]) <= 3
    assert all(0 <= t < TT_TINY["gqa2"]["text"]["vocab_size"] for t in out["token_ids"])
    written = {p.name: p.stat().st_mtime_ns for p in cache.glob("*.tensorbin")}
    assert any(name.startswith("layers.0.wqkv.bfp8.256x1024.") for name in written)

    image = tmp_path / "frame.png"
    Image.new("RGB", (96, 64), (90, 120, 30)).save(image)
    proc = generate(checkpoint, cache, "--image", str(image))
    assert DEVICE_OPEN_LINE not in proc.stdout and proc.stdout.endswith("\n")
    again = {p.name: p.stat().st_mtime_ns for p in cache.glob("*.tensorbin")}
    assert {name: again[name] for name in written} == written  # loaded from the cache, not rewritten
    assert any(name.startswith("vision.") for name in set(again) - set(written))


def test_predict_backend_ttnn_on_the_demo_checkpoint(dryrun_device, demo_checkpoint, tmp_path):
    write_prediction_inputs(tmp_path, *frames_at(5), straight_history())
    # --decoder tokens: the demo checkpoint carries an expert; this test pins the 128 discrete tokens.
    argv = predict_argv(demo_checkpoint, tmp_path)
    proc = alpamayo(*argv, "--backend", "ttnn", "--decoder", "tokens", "--json")
    (sample,) = json.loads(proc.stdout)["samples"]
    assert len(sample["xyz"]) == 64 and len(sample["trajectory_token_ids"]) == 128
    assert proc.stderr.count("ttnn dry run: trace capture is card-only") == 1


def test_predict_backend_ttnn_decodes_with_the_device_expert(dryrun_device, tmp_path):
    """On an Alpamayo 1.5 checkpoint (the demo's 1.5 layout, with its tiny expert) `--backend ttnn` predicts
    with the action expert on the device (`alpamayo.tt.expert`): 64 waypoints and no trajectory tokens."""
    from alpamayo.demo_release import make_demo_checkpoint

    checkpoint = make_demo_checkpoint(tmp_path / "r15", 0, layout="alpamayo1.5")
    write_prediction_inputs(tmp_path, *frames_at(5), straight_history())
    proc = alpamayo(*predict_argv(checkpoint, tmp_path), "--backend", "ttnn", "--json", "--flow-steps", "2")
    out = json.loads(proc.stdout)
    (sample,) = out["samples"]
    assert out["decoder"] == "expert" and out["flow"]["steps"] == 2
    assert len(sample["xyz"]) == 64 and sample["trajectory_token_ids"] == []
    assert proc.stderr.count("ttnn dry run: trace capture is card-only") == 1


@pytest.mark.parametrize("samples, draft", [(3, "none"), (6, "lookup")])
def test_predict_backend_ttnn_returns_k_samples_each_with_its_reasoning_and_waypoints(
    dryrun_device, demo_checkpoint, tmp_path, samples, draft
):
    """K samples from `alpamayo predict --backend ttnn`, with and without a draft (eval's default K = 6): K
    rows of reasoning and 64 expert waypoints each, the device's trace notice once. With `lookup`, each row's
    accepted lengths add up to its reasoning (the start token is fed after the last block). What the mock's
    zero logits draw decides whether a block holds drafts. That the K rows are one program per step (decode
    and verify, B x T <= 32) is pinned in tests/test_tt_dryrun_rows.py, the expert's slots in
    tests/test_tt_expert_dryrun.py; this is the command end to end."""
    write_prediction_inputs(tmp_path, *frames_at(5), straight_history())
    argv = [*predict_argv(demo_checkpoint, tmp_path), "--backend", "ttnn", "--json", "--flow-steps", "2"]
    sampling = ["--samples", str(samples), "--temperature", "0.6", "--seed", "3", "--draft", draft]
    proc = alpamayo(*argv, *sampling)
    out = json.loads(proc.stdout)
    assert out["decoder"] == "expert" and out["draft"] == draft
    assert len(out["samples"]) == samples
    for sample in out["samples"]:
        assert len(sample["xyz"]) == 64 and sample["trajectory_token_ids"] == []
        assert 1 <= len(sample["reasoning_token_ids"]) <= 4
    if draft == "none":
        assert out["accepted_lengths"] == []
    else:
        rows = out["accepted_lengths"]
        assert [sum(r) for r in rows] == [len(s["reasoning_token_ids"]) for s in out["samples"]]
        assert {"draft", "verify"} <= set(out["timings_ms"])  # the blocks ran through the device verify
    assert proc.stderr.count("ttnn dry run: trace capture is card-only") == 1


@pytest.mark.parametrize("samples", [1, 3])
def test_predict_backend_ttnn_runs_a_dflash_draft_on_the_device(
    dryrun_device, demo_checkpoint, tmp_path, samples
):
    """`--draft dflash:DIR --backend ttnn` on the demo checkpoint with a random tiny draft in z-lab's layout:
    the draft's layers run on the device (`alpamayo.tt.draft`) over the prompt's and the verifies' captured
    target layers, K rows ragged as the target's; each row's accepted lengths add up to its reasoning."""
    from alpamayo.config.loader import load_model_config
    from tests.dflash_checkpoints import dflash_config, save_dflash

    draft = tmp_path / "draft"
    save_dflash(draft, dflash_config(load_model_config(demo_checkpoint).text, block_size=8))
    write_prediction_inputs(tmp_path, *frames_at(5), straight_history())
    argv = [*predict_argv(demo_checkpoint, tmp_path), "--backend", "ttnn", "--json", "--decoder", "tokens"]
    sampling = ["--samples", str(samples), "--temperature", "0.6", "--seed", "3"]
    proc = alpamayo(*argv, *sampling, "--draft", f"dflash:{draft}")
    out = json.loads(proc.stdout)
    assert out["draft"] == f"dflash:{draft}" and len(out["samples"]) == samples
    rows = out["accepted_lengths"]
    assert [sum(r) for r in rows] == [len(s["reasoning_token_ids"]) for s in out["samples"]]
    assert {"draft", "verify"} <= set(out["timings_ms"])
    for sample in out["samples"]:
        assert len(sample["xyz"]) == 64
