"""The ttnn device seam: lazy import, the shipped mock descriptor, and `--backend ttnn` without ttnn or a card."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from alpamayo.cli import main
from alpamayo.tt import device as tt_device
from tests.hf_checkpoints import save_checkpoint, text_config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tt-cli")
    save_checkpoint(path, text_config(), seed=5)
    return path


def generate_ttnn(checkpoint) -> int:
    return main(["generate", "--checkpoint", str(checkpoint), "--prompt", "hi", "--backend", "ttnn"])


def test_importing_the_package_never_imports_ttnn():
    modules = "alpamayo.cli, alpamayo.tt.text, alpamayo.tt.vision, alpamayo.tt.moe, alpamayo.precision.report"
    code = f"import sys, {modules}; print('ttnn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_shipped_descriptor_is_a_one_chip_p150():
    desc = yaml.safe_load(tt_device.MOCK_DESCRIPTOR.read_text())
    assert desc["arch"] == {0: "blackhole"} and desc["chips_with_mmio"] == [{0: 0}]
    board = {k: v for item in desc["boards"][0] for k, v in item.items()}
    assert board["board_type"] == "p150" and board["chips"] == [0]


def test_host_mode_points_ttnn_at_the_shipped_descriptor(ttnn_host):
    if tt_device.card_present():
        pytest.skip("a card is present: host mode leaves TT_METAL_MOCK_CLUSTER_DESC_PATH alone")
    assert os.environ[tt_device.MOCK_ENV]  # set by import_ttnn() unless the user chose one
    import torch

    host = ttnn_host.from_torch(torch.ones(32, 32), dtype=ttnn_host.bfloat8_b, layout=ttnn_host.TILE_LAYOUT)
    assert torch.equal(ttnn_host.to_torch(host).float(), torch.ones(32, 32))


def test_backend_ttnn_without_ttnn_says_ttnn_is_missing(checkpoint, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ttnn", None)  # `import ttnn` now raises ImportError
    assert generate_ttnn(checkpoint) == 2
    err = capsys.readouterr().err
    assert "alpamayo generate: error: ttnn is not installed" in err
    assert "pip install -e '.[tt]'" in err


def test_backend_ttnn_without_a_card_says_the_device_is_missing(
    ttnn_host, checkpoint, monkeypatch, tmp_path, capsys
):
    monkeypatch.setattr(tt_device, "DEVICE_DIR", tmp_path / "no-tenstorrent")
    monkeypatch.delenv(tt_device.SIMULATOR_ENV, raising=False)
    monkeypatch.delenv(
        tt_device.RUNTIME_ROOT_ENV, raising=False
    )  # a session with dryrun tests runs under a dry run
    assert generate_ttnn(checkpoint) == 2
    err = capsys.readouterr().err
    assert "alpamayo generate: error: ttnn is installed but no Blackhole device is present" in err
    assert "Traceback" not in err


def test_serve_with_backend_ttnn_without_a_card_fails_before_binding(
    ttnn_host, demo_checkpoint, monkeypatch, tmp_path, capsys
):
    monkeypatch.setattr(tt_device, "DEVICE_DIR", tmp_path / "no-tenstorrent")
    monkeypatch.delenv(tt_device.SIMULATOR_ENV, raising=False)
    monkeypatch.delenv(
        tt_device.RUNTIME_ROOT_ENV, raising=False
    )  # a session with dryrun tests runs under a dry run
    argv = ["serve", "--checkpoint", str(demo_checkpoint), "--backend", "ttnn", "--recipe", "accuracy"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "recipe: accuracy" in out  # the effective config, printed before loading
    assert "alpamayo serve: error: ttnn is installed but no Blackhole device is present" in err
    assert "serving:" not in out and "Traceback" not in err


def test_a_mock_descriptor_is_refused_when_a_card_is_present(ttnn_host, monkeypatch, tmp_path):
    cards = tmp_path / "tenstorrent"
    cards.mkdir()
    (cards / "0").touch()
    monkeypatch.setattr(tt_device, "DEVICE_DIR", cards)
    monkeypatch.setenv(tt_device.MOCK_ENV, str(tt_device.MOCK_DESCRIPTOR))
    monkeypatch.delenv(tt_device.SIMULATOR_ENV, raising=False)
    monkeypatch.delenv(tt_device.RUNTIME_ROOT_ENV, raising=False)
    assert "makes ttnn open a mock device; unset it to use the card" in tt_device.device_unavailable_reason()


@pytest.mark.parametrize("command", ["predict", "replay"])
def test_samples_the_ttnn_backend_cannot_draw_are_refused_before_anything_is_read(
    command, demo_checkpoint, tmp_path, capsys
):
    """The ttnn backend draws K samples as rows of one decode program and one expert step, at most 16 (the
    device expert's bound). Refused first, so the frames, ego poses and drive named here (which do not
    exist) are never opened and no model is loaded (serve: model.num_samples in its config,
    tests/test_bridge_config.py). Without --temperature the family's default decides (the demo layout's is
    greedy), read from config.json alone."""
    missing = str(tmp_path / "missing")
    inputs = ["--frames", missing, "--ego", missing] if command == "predict" else [missing, "--out", missing]
    sampling = ["--samples", "17", "--temperature", "0.6"]
    argv = [command, *inputs, "--checkpoint", missing, "--backend", "ttnn", *sampling]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        f"alpamayo {command}: error: --samples 17 with --backend ttnn: the device action expert runs" in err
    )
    assert "allowed: 1..16" in err and "Traceback" not in err
    greedy = [*argv[:-3], "2", "--backend", "torch", "--checkpoint", str(demo_checkpoint)]
    assert main(greedy) == 2  # greedy (no --temperature: the demo family's default): also refused first
    err = capsys.readouterr().err
    assert (
        f"alpamayo {command}: error: --samples 2 with greedy decoding (--temperature 0) would repeat" in err
    )


@pytest.mark.parametrize("command", ["predict", "replay"])
def test_samples_on_moe_layers_are_refused_with_the_decode_message_before_anything_is_read(
    command, tmp_path, capsys
):
    """K > 1 samples are K rows of one decode program, and the device MoE decode routes one token: refused
    from the checkpoint's config with the decode program's own message (`TTTextModel.decode` refuses it so,
    tests/test_tt_dryrun_rows.py), before the frames, ego poses or drive (which do not exist) are opened and
    before any weight is read (the safetensors file is removed: a load would fail on it first)."""
    from alpamayo.plan.programs.text import check_decode_rows

    moe = tmp_path / "moe"
    save_checkpoint(moe, text_config(), moe=True, seed=3)
    (moe / "model.safetensors").unlink()
    missing = str(tmp_path / "missing")
    inputs = ["--frames", missing, "--ego", missing] if command == "predict" else [missing, "--out", missing]
    argv = [command, *inputs, "--checkpoint", str(moe), "--backend", "ttnn", "--temperature", "0.6"]
    assert main([*argv, "--samples", "2"]) == 2
    err = capsys.readouterr().err
    with pytest.raises(ValueError) as decode:
        check_decode_rows(2, moe=True)
    assert f"alpamayo {command}: error: --samples 2 with --backend ttnn: {decode.value}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("draft", ["lookup", "previous"])
def test_a_draft_on_moe_layers_is_refused_on_ttnn_before_any_weight_is_read(draft, tmp_path):
    """A draft's verify blocks are rows of one decode program, which the device MoE decode cannot route: the
    load refuses it with the decode program's own message, from the config alone (the safetensors file is
    removed: a load would fail on it first), not at the first verify after the upload. The torch backend
    takes the same draft on the same config."""
    from alpamayo.drafts import MODEL_FREE_BLOCK
    from alpamayo.errors import CheckpointError
    from alpamayo.model_spec import ModelSpec
    from alpamayo.plan.programs.text import check_decode_rows
    from alpamayo.runtime import AlpamayoVLA

    moe = tmp_path / "moe"
    save_checkpoint(moe, text_config(), moe=True, seed=3)
    (moe / "model.safetensors").unlink()
    with pytest.raises(ValueError) as decode:
        check_decode_rows(MODEL_FREE_BLOCK, moe=True)
    with pytest.raises(ValueError) as refused:
        AlpamayoVLA.from_spec(ModelSpec(checkpoint=moe, backend="ttnn", draft=draft))
    assert str(refused.value) == f"--draft {draft} with --backend ttnn: its verify blocks are {decode.value}"
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):  # torch: past it, to the weights
        AlpamayoVLA.from_spec(ModelSpec(checkpoint=moe, draft=draft))


def test_the_simulator_path_names_what_ttsim_still_needs(ttnn_host, monkeypatch, tmp_path):
    """`TT_METAL_SIMULATOR` (ttsim, docs/ttnn.md) counts as a device once everything ttsim reads is in place;
    until then the reason names the next missing piece."""
    if tt_device.SYSTEM_SFPI.exists():
        pytest.skip(f"{tt_device.SYSTEM_SFPI} exists: the missing-compiler case cannot be shown here")
    monkeypatch.setattr(tt_device, "DEVICE_DIR", tmp_path / "no-tenstorrent")
    for name in (tt_device.RUNTIME_ROOT_ENV, tt_device.MOCK_ENV, tt_device.SLOW_DISPATCH_ENV):
        monkeypatch.delenv(name, raising=False)
    sim = tmp_path / "sim" / "libttsim.so"
    monkeypatch.setenv(tt_device.SIMULATOR_ENV, str(sim))
    assert f"TT_METAL_SIMULATOR={sim} is not a file" in tt_device.device_unavailable_reason()
    sim.parent.mkdir()
    sim.write_bytes(b"\x7fELF")
    reason = tt_device.device_unavailable_reason()
    soc = tt_device.ttnn_runtime_root() / "tt_metal/soc_descriptors/blackhole_140_arch.yaml"
    assert f"soc_descriptor.yaml beside {sim}: copy {soc} there" in reason and soc.is_file()
    (sim.parent / "soc_descriptor.yaml").write_bytes(soc.read_bytes())
    assert "set TT_METAL_SLOW_DISPATCH_MODE=1" in tt_device.device_unavailable_reason()
    monkeypatch.setenv(tt_device.SLOW_DISPATCH_ENV, "1")
    monkeypatch.setenv(tt_device.MOCK_ENV, str(tt_device.MOCK_DESCRIPTOR))
    assert "unset it to open the simulated Blackhole" in tt_device.device_unavailable_reason()
    monkeypatch.delenv(tt_device.MOCK_ENV)
    assert "runs real kernels, compiled by the SFPI RISC-V compiler" in tt_device.device_unavailable_reason()
    root = tmp_path / "root"  # a runtime root with SFPI (tt-metal also reads its tt_metal/ there)
    (root / tt_device.SFPI_COMPILER).parent.mkdir(parents=True)
    (root / tt_device.SFPI_COMPILER).touch()
    monkeypatch.setenv(tt_device.RUNTIME_ROOT_ENV, str(root))
    assert tt_device.device_unavailable_reason() is None
    (root / tt_device.DRY_RUN_MARKER).touch()
    assert "dry-run root whose stand-in compiler builds no kernels" in tt_device.device_unavailable_reason()


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(hidden_size=64), r"draft hidden_size 64 != the target's 128 \(a draft for another target\)"),
        (
            dict(num_key_value_heads=1),
            r"on --backend ttnn a DFlash draft needs the target's K/V heads and head_dim",
        ),
    ],
)
def test_a_dflash_draft_the_device_cannot_serve_is_refused_before_the_device(
    demo_checkpoint, tmp_path, over, match
):
    """A DFlash draft's layers run on the device (`alpamayo.tt.draft`); one for another target, or whose
    attention the device draft cannot write with the target's K/V plan, is refused with ttnn before any
    weight is read or a device is opened."""
    from alpamayo.config.loader import load_model_config
    from alpamayo.model_spec import ModelSpec
    from alpamayo.runtime import AlpamayoVLA
    from tests.dflash_checkpoints import dflash_config

    draft = tmp_path / "dflash"
    draft.mkdir()
    cfg = dflash_config(load_model_config(demo_checkpoint).text, **over)
    (draft / "config.json").write_text(json.dumps(cfg))  # no weights: reading one would fail otherwise
    with pytest.raises(ValueError, match=match):
        AlpamayoVLA.from_spec(ModelSpec(checkpoint=demo_checkpoint, backend="ttnn", draft=f"dflash:{draft}"))
