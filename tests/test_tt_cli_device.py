"""`alpamayo generate --backend ttnn` end to end on a Blackhole p150 (marked `blackhole`), and with
`--tt-mode golden` (marked `golden`: the device programs through ttnn's golden functions on the host).

Runs the console script in a subprocess, which opens and closes the device itself; run it while no other
process holds the card.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.tt_checkpoints import TT_TINY, save_tt_checkpoint
from tests.tt_modes import device_cases


def generate(path, *extra: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "alpamayo.cli",
        "generate",
        "--checkpoint",
        str(path),
        "--prompt",
        "Lane ahead?",
    ]
    proc = subprocess.run([*cmd, "--max-new-tokens", "16", "--json", *extra], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("case", device_cases(["accuracy"]))
def test_generate_backend_ttnn_decodes_the_torch_prompt(tmp_path, case):
    mode, recipe = case
    save_tt_checkpoint(tmp_path, "gqa2", seed=29)
    torch_out = generate(tmp_path)
    tt_out = generate(
        tmp_path,
        "--backend",
        "ttnn",
        "--recipe",
        recipe,
        "--tt-cache",
        str(tmp_path / "cache"),
        "--tt-mode",
        "device" if mode == "card" else "golden",
    )
    assert tt_out["prompt_token_ids"] == torch_out["prompt_token_ids"]
    assert 1 <= len(tt_out["token_ids"]) <= 16
    assert all(0 <= t < TT_TINY["gqa2"]["text"]["vocab_size"] for t in tt_out["token_ids"])
    assert any((tmp_path / "cache").glob("layers.0.wqkv.bfp8.256x1024.*.tensorbin"))
