"""`alpamayo make-demo-checkpoint`: deterministic bytes, loadable by the package and by transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import torch

from alpamayo.cli import main
from alpamayo.config.loader import load_model_config
from alpamayo.demo_checkpoint import token_layout
from alpamayo.numerics import max_abs_error, pcc
from alpamayo.runtime import planner_config
from alpamayo.text import TextModel
from alpamayo.tokenizer import load_tokenizer
from planner.settings import PlannerSettings
from tests.hf_checkpoints import load_alpamayo_hf

FILES = [
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
]


def test_same_seed_gives_the_same_bytes_in_another_process(demo_checkpoint, tmp_path):
    out = tmp_path / "again"
    env = dict(os.environ, PYTHONHASHSEED="4321")  # set and dict orders differ from this process
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "alpamayo.cli",
            "make-demo-checkpoint",
            str(out),
            "--seed",
            "0",
            "--layout",
            "demo",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ids   538..3537  future bins <i0>..<i2999>" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == FILES
    for name in FILES:
        assert (out / name).read_bytes() == (demo_checkpoint / name).read_bytes(), name


def test_other_seeds_change_only_the_weights(demo_checkpoint, tmp_path, capsys):
    assert main(["make-demo-checkpoint", str(tmp_path / "s1"), "--seed", "1", "--layout", "demo"]) == 0
    for name in FILES:
        same = (tmp_path / "s1" / name).read_bytes() == (demo_checkpoint / name).read_bytes()
        assert same == (name != "model.safetensors"), name


def test_an_existing_non_empty_directory_is_refused(demo_checkpoint, capsys):
    before = (demo_checkpoint / "model.safetensors").stat().st_mtime_ns
    assert main(["make-demo-checkpoint", str(demo_checkpoint)]) == 2
    assert "needs a new or empty directory; this one is not empty" in capsys.readouterr().err
    assert (demo_checkpoint / "model.safetensors").stat().st_mtime_ns == before


def test_vocabulary_layout_mirrors_alpamayo(demo_checkpoint):
    tokenizer = load_tokenizer(demo_checkpoint)
    layout = {what.split()[0]: (first, last) for what, first, last in token_layout(tokenizer)}
    assert layout == {
        "byte-level": (0, 511),
        "Qwen": (512, 537),
        "future": (538, 3537),
        "history": (3538, 4537),
        "Alpamayo": (4538, 4565),
    }
    assert len(tokenizer) == 4566 == load_model_config(demo_checkpoint).text.vocab_size
    ids = tokenizer.convert_tokens_to_ids
    # Alpamayo's marker order with <|image_pad|> skipped (it is Qwen's): same offsets as the real vocabulary,
    # where <|traj_history_start|> = 155674 = <i3999> + 6 and <|traj_future_start|> = 155681 = <i3999> + 13
    assert ids("<|traj_history_start|>") - ids("<i3999>") == 155674 - 155668
    assert ids("<|traj_future_start|>") - ids("<i3999>") == 155681 - 155668
    assert ids("<|traj_history|>") - ids("<i3999>") == 155684 - 155668
    assert tokenizer("<|cot_start|>Keep lane<|cot_end|>", add_special_tokens=False)["input_ids"][0] == ids(
        "<|cot_start|>"
    )
    assert (
        tokenizer.decode(tokenizer("Slow down for the red light.")["input_ids"])
        == "Slow down for the red light."
    )


def test_config_carries_the_trajectory_settings(demo_checkpoint):
    cfg = load_model_config(demo_checkpoint)
    assert cfg.is_alpamayo and cfg.vision is not None and cfg.text.gqa_groups == 2
    assert len(cfg.vision.deepstack_visual_indexes) == 3
    assert PlannerSettings.from_config(planner_config(cfg)) == PlannerSettings()
    assert cfg.eos_token_ids == tuple(
        load_tokenizer(demo_checkpoint).convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    )


def test_preprocessor_resizes_a_1080p_frame_to_180_tokens(demo_checkpoint):
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(str(demo_checkpoint), local_files_only=True)
    frame = np.random.default_rng(0).integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    grid = processor(images=[frame], return_tensors="pt")["image_grid_thw"]
    assert grid.tolist() == [[1, 20, 36]]  # 320 x 576 pixels
    merge = json.loads((demo_checkpoint / "preprocessor_config.json").read_text())["merge_size"]
    assert int(grid.prod()) // merge**2 == 180


def test_text_model_matches_transformers_on_the_demo_weights(demo_checkpoint, record_figure):
    tokenizer = load_tokenizer(demo_checkpoint)
    ids = torch.tensor(tokenizer("<|im_start|>user\nKeep lane.<|im_end|>\n<i3001><i12>")["input_ids"])
    model = TextModel.from_checkpoint(demo_checkpoint)
    model.setup_cache(len(ids))
    hidden = model.prefill_hidden(ids)
    with torch.inference_mode():
        logits = model.logits(hidden)
    hf = load_alpamayo_hf(demo_checkpoint)
    with torch.no_grad():
        expected = hf(input_ids=ids.view(1, -1)).logits[0]
    record_figure("logits PCC", pcc(expected, logits))
    record_figure("logits max abs", max_abs_error(expected, logits))
    assert pcc(expected, logits) > 0.99999 and max_abs_error(expected, logits) < 1e-4


def test_a_negative_seed_is_rejected(tmp_path, capsys):
    assert main(["make-demo-checkpoint", str(tmp_path / "d"), "--seed", "-1"]) == 2
    assert "seed must be in [0, 2**63), got -1" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
