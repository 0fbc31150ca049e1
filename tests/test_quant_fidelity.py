"""`alpamayo precision --quant`: the torch backend's weight-only recipes beside the ttnn ones.

The command's int8 figures are checked against an independent path: the same int8 codes dequantised into
the float32 weights of a plain model (F.linear, no weight-only kernel), scored here with numpy. Its eval-style
minADE is checked against what `alpamayo eval` itself writes for the same drive, without and with --quant.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest
import torch

from alpamayo.cli import main
from alpamayo.config.loader import load_model_config
from alpamayo.demo_drive import make_demo_drive
from alpamayo.precision import report as precision_module
from alpamayo.precision.reference import reference, vision_outputs
from alpamayo.precision.report import precision_report
from alpamayo.precision.settings import Settings
from alpamayo.quant import Int8Weight, QuantRecipe
from alpamayo.text import TextModel, linear
from alpamayo.text.linear import Linear
from vision.encoder import VisionEncoder

INT8 = QuantRecipe("int8")
T = TypeVar("T")
SETTINGS = Settings(prompt_tokens=32, tokens=16, max_seq_len=512)


def _plain(load: Callable[[], T]) -> T:
    """`load()` with every linear left on `F.linear` (the product packs float32 linears into oneDNN's layout,
    dropping the plain weight), so the weights can be replaced."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(linear, "can_pack", lambda weight: False)
        return load()


def _dequantised(root: torch.nn.Module) -> None:
    """Every linear int8 quantises, its weight replaced by its int8 codes times their scales (float32)."""
    for module in root.modules():
        if isinstance(module, Linear) and INT8.applies_to(module.role):
            q = Int8Weight.quantise(module.weight)
            module.weight = q.q.float() * q.scales.float()[:, None]


def _pcc(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(np.corrcoef(a.double().flatten().numpy(), b.double().flatten().numpy())[0, 1])


def test_int8_figures_equal_a_dequantised_float32_model(demo_checkpoint, record_figure):
    report = precision_report(demo_checkpoint, [], SETTINGS, quants=["int8"])
    (row,) = report.recipes
    assert row.recipe["backend"] == "torch" and row.recipe["name"] == "int8"

    cfg = load_model_config(demo_checkpoint)
    ref = reference(demo_checkpoint, cfg, SETTINGS, [], lambda message: None)
    model = _plain(lambda: TextModel.from_checkpoint(demo_checkpoint, cfg))
    _dequantised(model)
    n = SETTINGS.tokens
    model.setup_cache(ref.ids.numel())
    with torch.inference_mode():
        logits = model.logits(model.prefill_hidden(ref.ids)[-n:])
    top1 = float(np.mean(logits.argmax(-1).numpy() == np.array(ref.continuation)))
    assert row.top1_agreement == top1
    assert abs(row.logits_pcc - _pcc(ref.logits, logits)) < 1e-6
    vision = _plain(lambda: VisionEncoder.from_checkpoint(demo_checkpoint, cfg))
    _dequantised(vision)
    got = vision_outputs(vision)
    assert abs(row.vision_pcc - min(_pcc(a, b) for a, b in zip(ref.vision, got, strict=True))) < 1e-6
    # the demo checkpoint's action expert is scored too, per Euler step
    assert len(row.expert["velocity_pcc"]) == 10 and 0.99 < row.expert["velocity_pcc_min"] <= 1
    assert row.dram["fits_on"] == "16 GB GPU"
    record_figure("demo int8 top-1 / logits PCC", f"{top1:.3f} / {row.logits_pcc:.6f}")


def test_an_int4_recipes_int8_layers_are_named_in_the_dtypes_and_it_fits(demo_checkpoint):
    """The demo expert's MLP is 96 wide: int4-g64 packs its 4 down projections at int8, and the report says
    so in the dtypes (the vision tower and the text backbone are all int4 there); on a GPU it loads too."""
    report = precision_report(demo_checkpoint, [], SETTINGS, quants=["int4-g64"])
    (row,) = report.recipes
    dtypes = row.recipe["dtypes"]
    assert dtypes["expert"] == "int4-g64 (4/16 int8)"
    assert dtypes["vision"] == dtypes["qkv"] == dtypes["mlp_down"] == "int4-g64"
    assert row.dram["fits_on"] == "16 GB GPU"
    assert 0 < row.expert["velocity_pcc_min"] <= 1


def test_eval_min_ade_equals_alpamayo_eval_for_the_reference_and_int8(demo_checkpoint, tmp_path):
    drive = make_demo_drive(tmp_path / "drive.mcap", seconds=1.7, cameras=1, seed=5, size=(72, 128)).path
    fast = ["--max-reasoning-tokens", "4"]
    out = tmp_path / "report.json"
    args = ["precision", "--checkpoint", str(demo_checkpoint), "--drive", str(drive), "--ticks", "1"]
    assert main([*args, *fast, "--quant", "int8", "--eval-samples", "2", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["recipes"]

    def eval_min_ade(*quant: str) -> float:
        run = tmp_path / f"eval{'-'.join(quant)}"
        common = ["--checkpoint", str(demo_checkpoint), *fast, "--samples", "2", "--no-progress"]
        assert main(["eval", str(drive), *common, "--out", str(run), *quant]) == 0
        (record,) = [json.loads(p.read_text()) for p in (run / "clips").glob("*.json")]
        return record["errors_m"]["min_ade@6.4s"]

    m = row["min_ade"]
    assert m["reference_m"] == pytest.approx(eval_min_ade(), abs=1e-9)
    assert m["min_ade_m"] == pytest.approx(eval_min_ade("--quant", "int8"), abs=1e-9)
    assert m["difference_m"] == pytest.approx(m["min_ade_m"] - m["reference_m"])


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--quant", "int3"],
            r"quant recipe 'int3' unknown; allowed: int8, int4, int4-g32, int4-g64, int4-g128",
        ),
        (["--quant", "int4-g48"], r"quant recipe 'int4-g48': group size '48' not one of \[32, 64, 128\]"),
        (["--quant", "int8+tail"], r"quant recipe 'int8\+tail' unknown"),
        (["--quant", "none"], r"quant recipe 'none' unknown"),
        (["--quant-head"], r"--quant-head applies to the --quant recipes"),
        (["--quant", "int8", "--eval-samples", "0"], r"eval-samples must be >= 1, got 0"),
    ],
)
def test_bad_quant_arguments_are_named_before_any_model_runs(
    demo_checkpoint, monkeypatch, capsys, extra, message
):
    def no_model(*args, **kwargs):
        raise AssertionError("the reference model ran before the arguments were checked")

    monkeypatch.setattr(precision_module, "reference", no_model)
    assert main(["precision", "--checkpoint", str(demo_checkpoint), *extra]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("command", ["predict", "replay", "eval", "generate", "ask", "profile", "plan"])
def test_quant_with_ttnn_is_refused_the_same_way_on_every_command(command, demo_checkpoint, tmp_path, capsys):
    """Every command that loads a model on the torch backend takes --quant; with --backend ttnn it is refused
    before anything loads, pointing at --recipe."""
    ckpt = str(demo_checkpoint)
    drive = str(tmp_path / "none.mcap")
    argv = {
        "predict": ["predict", "--checkpoint", ckpt, "--frames", str(tmp_path), "--ego", str(tmp_path / "e")],
        "replay": ["replay", drive, "--checkpoint", ckpt, "--out", str(tmp_path / "r")],
        "eval": ["eval", drive, "--checkpoint", ckpt, "--out", str(tmp_path / "e")],
        "generate": ["generate", "--checkpoint", ckpt, "--prompt", "hi"],
        "ask": ["ask", "--checkpoint", ckpt, "--frames", str(tmp_path), "--question", "why"],
        "profile": ["profile", "--synthetic", "--checkpoint", ckpt],
        "plan": ["plan", "--checkpoint", ckpt],
    }[command]
    assert main([*argv, "--backend", "ttnn", "--quant", "int8"]) == 2
    assert "--quant int8 is the torch backend's; with --backend ttnn choose the precision with --recipe" in (
        capsys.readouterr().err
    )


def test_every_command_that_loads_a_torch_model_takes_quant():
    """`serve` takes it from the node YAML (`model.quant`, tests/test_quant.py)."""
    from alpamayo.cli import build_parser
    from tests.test_families import MODEL_COMMANDS

    commands = build_parser()._subparsers._group_actions[0].choices
    takes = [*MODEL_COMMANDS, "closed-loop", "alpasim-driver"]
    missing = [c for c in takes if c != "serve" and "--quant" not in commands[c]._option_string_actions]
    assert missing == []
