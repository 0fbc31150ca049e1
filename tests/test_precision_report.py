"""`alpamayo precision` on the demo checkpoint and a recorded demo drive: the recipe comparison on the CPU.

The rounded weights themselves are checked bit-exact against ttnn's packer in tests/test_tt_quantized.py; here
the report: its figures, their order across recipes (all-bf16 weights drift less than bfp8, bfp8 less than
bfp4), the drive comparison, the DRAM plan it quotes, that it runs without ttnn, and the errors for bad
arguments.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from alpamayo.cli import main
from alpamayo.config.loader import load_model_config
from alpamayo.demo_drive import make_demo_drive
from alpamayo.plan.dram import plan_memory
from alpamayo.plan.precision import OP_GROUPS, PRESETS, TENSOR_GROUPS
from alpamayo.precision.drives import DriveRun, drive_figures

# 8.2 s of one camera: ticks at t0 = 1.5 and 1.6 s, each with its recorded 6.4 s future
DRIVE = {"seconds": 8.2, "cameras": 1, "seed": 5, "size": (72, 128)}
# The demo checkpoint's seed whose trajectory tokens vary on this drive. Distinct tokens of the 128 on the two
# ticks, float32 reference: seed 0 (the shared demo checkpoint) 1 and 1 (token 3409 everywhere, under every
# recipe, so its drive figures cannot tell a right comparison from a constant one), seed 1 1 and 1, seed 2 4
# and 2, seed 3 11 and 10.
VARYING_SEED = 3
FAST = ["--prompt-tokens", "32", "--tokens", "16", "--max-reasoning-tokens", "4", "--max-seq-len", "2048"]


@pytest.fixture(scope="module")
def drive(tmp_path_factory):
    return make_demo_drive(tmp_path_factory.mktemp("drive") / "drive.mcap", **DRIVE).path


@pytest.fixture(scope="module")
def varying_checkpoint(tmp_path_factory):
    from alpamayo.demo_release import make_demo_checkpoint

    return make_demo_checkpoint(tmp_path_factory.mktemp("varying") / "ckpt", seed=VARYING_SEED)


@pytest.fixture(scope="module")
def bf16_recipe(tmp_path_factory):
    path = tmp_path_factory.mktemp("recipe") / "bf16.yaml"
    path.write_text(
        f"name: bf16\ndtypes: {dict.fromkeys(TENSOR_GROUPS, 'bf16')}\nfidelity: {dict.fromkeys(OP_GROUPS, 'hifi4')}\n"
    )
    return path


def test_presets_on_a_varying_checkpoint_whose_tokens_vary_and_a_drive(
    varying_checkpoint, drive, tmp_path, capsys, record_figure
):
    out = tmp_path / "report.json"
    args = ["precision", "--checkpoint", str(varying_checkpoint), "--drive", str(drive), "--ticks", "2"]
    assert main([*args, *FAST, "--json", str(out)]) == 0
    printed = capsys.readouterr()
    table = printed.out
    assert "recipe" in table and "traj tokens" in table and "ADE drift m" in table
    # Progress on stderr: each model's stage and each drive tick as it is answered.
    progress = [line for line in printed.err.splitlines() if line.startswith("alpamayo precision: ")]
    ticks = [line.split(": drive tick ")[0] for line in progress if ": drive tick " in line]
    assert ticks == [
        "alpamayo precision: " + m
        for m in ["float32 reference"] * 2 + ["recipe accuracy"] * 2 + ["recipe performance"] * 2
    ]
    assert any("drive tick 2/2 in " in line for line in progress)
    # the per-layer table starts with layer 0; the demo checkpoint's action expert adds its per-step table
    assert table.count("\n  0 ") == 2 and "expert v PCC min" in table
    report = json.loads(out.read_text())
    recipes = {r["recipe"]["name"]: r for r in report["recipes"]}
    assert list(recipes) == ["accuracy", "performance"]
    layers = load_model_config(varying_checkpoint).text.num_hidden_layers
    for name, r in recipes.items():
        assert len(r["layer_pcc"]) == layers and all(0.9 < p <= 1 for p in r["layer_pcc"])
        assert 0 <= r["top1_agreement"] <= 1 and 0.9 < r["vision_pcc"] <= 1
        d = r["drive"]
        assert d["ticks"] == 2 and 0 <= d["token_agreement"] < 1 and d["ade_drift_m"] > 0
        # both ticks have a recorded future, and ADE obeys the triangle inequality per waypoint: the two models'
        # ADEs to it cannot differ by more than their drift from each other
        assert abs(d["ade_recipe_m"] - d["ade_reference_m"]) <= d["ade_drift_m"] + 1e-9
        expert = r["expert"]
        assert len(expert["velocity_pcc"]) == 10 and expert["velocity_pcc_min"] == min(expert["velocity_pcc"])
        assert 0.9 < expert["velocity_pcc_min"] <= 1 and expert["ade_drift_m"] >= 0
        record_figure(f"{name} expert velocity PCC min", expert["velocity_pcc_min"])
        plan = plan_memory(load_model_config(varying_checkpoint), PRESETS[name], 2048)
        assert r["dram"]["total_gb"] == plan.total / 1e9 and r["dram"]["fits"]
        for key in ("logits_pcc", "top1_agreement", "vision_pcc"):
            record_figure(f"{name} {key}", r[key])
        record_figure(f"{name} worst layer PCC", min(r["layer_pcc"]))
        record_figure(
            f"{name} drive token agreement / ADE drift m",
            f"{r['drive']['token_agreement']} / {r['drive']['ade_drift_m']:.3f}",
        )
    # bfp4 MLPs (performance) cost more than bfp8 ones (accuracy) on every layer and at the logits
    assert recipes["accuracy"]["logits_pcc"] > recipes["performance"]["logits_pcc"]
    assert all(
        a > p
        for a, p in zip(recipes["accuracy"]["layer_pcc"], recipes["performance"]["layer_pcc"], strict=True)
    )
    assert recipes["performance"]["recipe"]["dtypes"]["mlp_gate_up"] == "bfp4"
    # and the drive: bfp4 MLPs part from the reference's trajectory tokens more than bfp8 ones (measured: token
    # agreement 0.53 and 0.11, ADE drift 12.5 and 15.7 m), on the same reference
    drives = [recipes[n]["drive"] for n in ("accuracy", "performance")]
    assert drives[0]["token_agreement"] > drives[1]["token_agreement"]
    assert drives[0]["ade_reference_m"] == drives[1]["ade_reference_m"]


def test_a_yaml_recipe_with_bf16_weights_barely_moves_the_model(
    demo_checkpoint, bf16_recipe, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "ttnn", None)  # the planner needs no ttnn: `import ttnn` now fails
    args = [
        "precision",
        "--checkpoint",
        str(demo_checkpoint),
        "--recipe",
        str(bf16_recipe),
        "--recipe",
        "accuracy",
    ]
    assert main([*args, *FAST]) == 0
    table = capsys.readouterr().out
    assert "traj tokens" not in table  # no drive, no drive columns
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:4]}
    bf16, acc = (float(rows[n][3]) for n in ("bf16", "accuracy"))  # logits PCC column (after backend)
    assert bf16 > acc and bf16 > 0.9999


def test_an_alpamayo_1_5_checkpoint_takes_its_base_model_from_base_model(bf16_recipe, tmp_path, capsys):
    """Issue 13: `--base-model DIR` on every command that loads a model; here the checkpoint was moved away
    from the base model its `vlm_name_or_path` names, so only `--base-model` finds it (reference model, the
    rounded recipe's checkpoint and the tokenizer all read it)."""
    import shutil

    from alpamayo.demo_release import make_demo_checkpoint

    release = make_demo_checkpoint(tmp_path / "release", seed=0, layout="alpamayo1.5")
    moved = tmp_path / "elsewhere" / "release"
    shutil.copytree(release, moved)  # its ../release-base is not beside it there
    args = ["precision", "--checkpoint", str(moved), "--recipe", str(bf16_recipe), *FAST]
    assert main(args) == 2
    assert "base model 'vlm_name_or_path' = '../release-base' not found" in capsys.readouterr().err
    assert main([*args, "--base-model", str(tmp_path / "release-base")]) == 0
    table = capsys.readouterr().out
    row = next(line.split() for line in table.splitlines() if line.startswith("bf16 "))
    assert float(row[3]) > 0.9999  # logits PCC of the all-bf16 recipe, as on the demo layout


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--recipe", "fastest"], r"--recipe 'fastest': not a preset \(accuracy, performance\)"),
        (["--tokens", "0"], r"tokens must be >= 1, got 0"),
        (["--max-seq-len", "0"], r"max-seq-len must be >= 1, got 0"),
        (["--drive", "missing.mcap"], r"missing.mcap"),
    ],
)
def test_bad_arguments_are_named(demo_checkpoint, capsys, extra, message):
    import re

    assert main(["precision", "--checkpoint", str(demo_checkpoint), *extra]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("where", ["under-a-file", "a-directory"])
def test_a_json_path_that_cannot_be_written_is_refused_before_any_model_runs(
    demo_checkpoint, tmp_path, monkeypatch, capsys, where
):
    from alpamayo.precision import report as precision_module

    def no_model(*args, **kwargs):
        raise AssertionError("the reference model ran before --json was checked")

    monkeypatch.setattr(precision_module, "reference", no_model)
    blocker = tmp_path / "file"
    blocker.write_text("")
    target = blocker / "report.json" if where == "under-a-file" else tmp_path
    assert main(["precision", "--checkpoint", str(demo_checkpoint), "--json", str(target)]) == 2
    err = capsys.readouterr().err
    expected = "cannot create its directory" if where == "under-a-file" else "is a directory"
    assert f"alpamayo precision: error: --json '{target}'" in err and expected in err


def test_the_expert_group_reaches_the_action_experts_velocity_and_waypoints(
    tmp_path, bf16_recipe, record_figure
):
    """On an Alpamayo checkpoint with an action expert: per-step velocity PCC against the float32 expert and
    the waypoint drift, ordered by the `expert` group's dtype (bf16 above bfp4)."""
    from alpamayo.precision.report import precision_report
    from alpamayo.precision.settings import Settings
    from tests.tt_expert_cases import save_alpamayo_checkpoint

    checkpoint = save_alpamayo_checkpoint(tmp_path / "alpamayo", seed=3)
    bfp4 = tmp_path / "bfp4-expert.yaml"
    bfp4.write_text("name: bfp4-expert\nbase: performance\ndtypes: {expert: bfp4}\n")
    settings = Settings(prompt_tokens=16, tokens=4, max_seq_len=512)
    report = precision_report(checkpoint, [str(bf16_recipe), str(bfp4)], settings)
    figures = {r.recipe["name"]: r.expert for r in report.recipes}
    for name, f in figures.items():
        assert len(f["velocity_pcc"]) == 10 and f["velocity_pcc_min"] == min(f["velocity_pcc"])
        record_figure(f"{name}: expert velocity PCC min", f["velocity_pcc_min"])
        record_figure(f"{name}: expert waypoint ADE drift m", f["ade_drift_m"])
    assert figures["bf16"]["velocity_pcc_min"] > 0.9999 > 0.99 > figures["bfp4-expert"]["velocity_pcc_min"]
    assert figures["bf16"]["ade_drift_m"] < figures["bfp4-expert"]["ade_drift_m"]
    table = report.table()
    assert "expert v PCC min" in table and "action expert velocity PCC per Euler step" in table


def test_drive_figures_compare_runs_whose_tokens_and_trajectories_vary():
    """The drive comparison on two lock-step runs that part (the demo checkpoint emits one token for all 128
    positions under every recipe, so its drive figures cannot tell a right comparison from a constant one):
    token agreement is the mean over ticks of the positions that agree, the drift the mean over ticks of the
    XY ADE between the two trajectories, each model's ADE to the recorded future over the ticks that have
    one. Expected values from numpy on the definitions (the module docstring)."""
    rng = np.random.default_rng(0)
    ref_tokens = [rng.integers(3000, 4000, 128).tolist() for _ in range(3)]
    run_tokens = [list(t) for t in ref_tokens]
    run_tokens[0][:32] = [t + 1 for t in run_tokens[0][:32]]  # 96 / 128 agree
    run_tokens[2] = [t + 1 for t in run_tokens[2]]  # none agree
    ref_xyz = [np.cumsum(rng.normal(1.0, 0.2, (64, 3)), 0) for _ in range(3)]
    run_xyz = [xyz.copy() for xyz in ref_xyz]
    run_xyz[0][:, :2] += [3.0, 4.0]  # 5 m everywhere in XY
    run_xyz[2][32:, 2] += 7.0  # Z only: no XY drift
    future = [ref_xyz[0] + [0.0, 1.0, 0.0], None, ref_xyz[2] - [2.0, 0.0, 0.0]]
    ref, run = DriveRun(ref_tokens, ref_xyz, future), DriveRun(run_tokens, run_xyz, future)
    got = drive_figures(ref, run)

    def xy_ade(a, b):
        return float(np.mean(np.linalg.norm(a[:, :2] - b[:, :2], axis=1)))

    assert got["ticks"] == 3
    assert got["token_agreement"] == pytest.approx(np.mean([96 / 128, 1.0, 0.0]))
    assert got["ade_drift_m"] == pytest.approx(
        np.mean([xy_ade(a, b) for a, b in zip(ref_xyz, run_xyz, strict=True)])
    )
    assert got["ade_drift_m"] == pytest.approx(5.0 / 3)
    assert got["ade_reference_m"] == pytest.approx(np.mean([1.0, 2.0]))
    assert got["ade_recipe_m"] == pytest.approx(np.mean([xy_ade(run_xyz[0], future[0]), 2.0]))
    # a run against itself agrees on every token and does not drift
    same = drive_figures(ref, ref)
    assert (same["token_agreement"], same["ade_drift_m"]) == (1.0, 0.0)
    # without any recorded future there is nothing to compare each model with
    blind = DriveRun(ref_tokens, ref_xyz, [None] * 3)
    assert set(drive_figures(blind, blind)) == {"ticks", "token_agreement", "ade_drift_m"}


@pytest.mark.golden
def test_the_golden_column_runs_each_recipes_device_programs(
    demo_checkpoint, drive, tmp_path, capsys, record_figure
):
    """`--golden`: the accuracy recipe's device programs in the ttnn golden mode, beside its emulation: final
    logits at the card tests' bar (PCC >= 0.97 against the unrounded model, as tests/test_tt_text_device.py
    against the rounded one), the vision tower, the action expert's drift and the drive run through
    `--tt-mode golden`."""
    out = tmp_path / "report.json"
    args = ["precision", "--checkpoint", str(demo_checkpoint), "--recipe", "accuracy", "--golden"]
    drive_args = ["--drive", str(drive), "--ticks", "1", "--eval-samples", "1"]
    assert main([*args, *drive_args, *FAST, "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "ttnn golden" in table and "ttnn golden: the recipe's device programs" in table
    (recipe,) = json.loads(out.read_text())["recipes"]
    golden = recipe["golden"]
    for key in ("logits_pcc", "top1_agreement", "vision_pcc"):
        record_figure(f"golden {key} (emulated {recipe[key]:.6f})", golden[key])
    record_figure(
        "golden drive token agreement / ADE drift m",
        f"{golden['drive']['token_agreement']} / {golden['drive']['ade_drift_m']}",
    )
    record_figure(
        f"golden expert ADE drift m (emulated {recipe['expert']['ade_drift_m']:.3f})",
        golden["expert_ade_drift_m"],
    )
    assert golden["logits_pcc"] >= 0.97 and golden["vision_pcc"] >= 0.95 and golden["expert_ade_drift_m"] >= 0
    assert golden["drive"]["ticks"] == 1 and 0 <= golden["drive"]["token_agreement"] <= 1
