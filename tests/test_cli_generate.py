"""`alpamayo generate` on a checkpoint saved by transformers, against transformers' own generate."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from alpamayo.cli import main
from tests.hf_checkpoints import build_tokenizer, load_hf, save_checkpoint, text_config

PROMPT = "Is the lane ahead clear?"


@pytest.fixture(scope="module", params=["dense", "moe"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"cli-{request.param}")
    hf = save_checkpoint(path, text_config(num_hidden_layers=3), moe=request.param == "moe", seed=21)
    return path, hf


def hf_generate_tokens(hf, prompt_ids: list[int], n: int) -> list[int]:
    """transformers' greedy `generate` after `prompt_ids` (stopping at the checkpoint's EOS, as ours does)."""
    with torch.no_grad():
        hf.model.rope_deltas = None
        ids = torch.tensor([prompt_ids])
        gen = hf.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
        )
    return gen[0, ids.shape[1] :].tolist()


def test_generate_json_matches_transformers(checkpoint, capsys):
    path, hf = checkpoint
    assert (
        main(["generate", "--checkpoint", str(path), "--prompt", PROMPT, "--max-new-tokens", "24", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    tok = build_tokenizer()
    expected_prompt = tok.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert out["prompt_token_ids"] == list(expected_prompt)
    assert out["token_ids"] == hf_generate_tokens(hf, out["prompt_token_ids"], 24)
    assert out["text"] == tok.decode(out["token_ids"], skip_special_tokens=True)


def test_generate_bfloat16_matches_transformers_in_bfloat16(checkpoint, capsys):
    """--dtype bfloat16 runs the model in bfloat16: its tokens are transformers' bfloat16 `generate` tokens
    (these small checkpoints decode bit-identically in bfloat16, while their float32 tokens differ from token
    13 on, dense, and 19, MoE), and without --json the same generation is printed as text."""
    path, _ = checkpoint
    argv = ["generate", "--checkpoint", str(path), "--prompt", PROMPT, "--max-new-tokens", "24"]
    argv += ["--dtype", "bfloat16"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == hf_generate_tokens(load_hf(path, torch.bfloat16), out["prompt_token_ids"], 24)
    assert main(argv) == 0
    assert capsys.readouterr().out == out["text"] + "\n"


def test_max_new_tokens_past_the_position_range_is_refused(checkpoint, capsys):
    path, hf = checkpoint
    limit = hf.config.text_config.max_position_embeddings
    argv = ["generate", "--checkpoint", str(path), "--prompt", PROMPT, "--json", "--max-new-tokens"]
    assert main([*argv, "1"]) == 0
    prompt_len = len(json.loads(capsys.readouterr().out)["prompt_token_ids"])
    assert main([*argv, str(limit - prompt_len + 1)]) == 2
    assert capsys.readouterr().err == (
        f"alpamayo generate: error: --max-new-tokens {limit - prompt_len + 1}: the {prompt_len}-token prompt "
        f"leaves room for at most {limit - prompt_len} new tokens (max_position_embeddings = {limit})\n"
    )


def test_console_script_reports_a_bad_checkpoint_clearly(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "alpamayo.cli", "generate", "--checkpoint", str(tmp_path), "--prompt", "hi"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert f"alpamayo generate: error: {tmp_path / 'config.json'}: no config.json" in proc.stderr
    assert "Traceback" not in proc.stderr


BAD_DEVICES = {
    "tpu": r"supported devices are cpu and cuda\[:N\]",  # not a torch device type
    "cuda:x": r"supported devices are cpu and cuda\[:N\]",  # malformed index
    "meta": r"supported devices are cpu and cuda\[:N\]",  # a torch device type we do not run on
    "cuda:99": r"(CUDA is not available on this machine|CUDA device index must be in \[0, \d+\))",
}


@pytest.mark.parametrize("device", sorted(BAD_DEVICES))
def test_bad_device_is_refused_by_name(checkpoint, capsys, device):
    path, _ = checkpoint
    assert main(["generate", "--checkpoint", str(path), "--prompt", PROMPT, "--device", device]) == 2
    err = capsys.readouterr().err
    assert re.match(rf"alpamayo generate: error: device {device}: {BAD_DEVICES[device]}", err), err
