"""Safetensors loading: single file, sharded index, Alpamayo prefix, and every promised failure message."""

from __future__ import annotations

import json
import re
import shutil
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from alpamayo.checkpoint import Checkpoint, expert_layout
from alpamayo.errors import CheckpointError
from alpamayo.text import TextModel
from tests.hf_checkpoints import save_checkpoint, text_config

IDS = torch.arange(3, 40)
LAYER0_UP = "model.language_model.layers.0.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(path, text_config(), seed=5)
    model = TextModel.from_checkpoint(path)
    model.setup_cache(64)
    return path, model.prefill(IDS)


@pytest.fixture
def copy(saved, tmp_path):
    path = tmp_path / "copy"
    shutil.copytree(saved[0], path)
    return path


def logits(path) -> torch.Tensor:
    model = TextModel.from_checkpoint(path)
    model.setup_cache(64)
    return model.prefill(IDS)


def rewrite(path, edit) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_sharded_checkpoint_loads_identically(saved, tmp_path):
    path = tmp_path / "sharded"
    shutil.copytree(saved[0], path)
    tensors = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, path / shard, metadata={"format": "pt"})
        weight_map.update({k: shard for k in keys})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert torch.equal(logits(path), saved[1])


def test_alpamayo_layout_with_vlm_prefix_loads_identically(copy, saved):
    cfg = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({"model_type": "alpamayo_vla", "vlm_config": cfg}))
    rewrite(
        copy,
        lambda t: t.update({"vlm." + k: t.pop(k) for k in list(t)} | {"expert.proj.weight": torch.ones(2)}),
    )
    ckpt = Checkpoint(copy, "vlm.")
    assert "expert.proj.weight" in ckpt and "language_model.norm.weight" in ckpt
    assert torch.equal(logits(copy), saved[1])


def test_missing_tensor_is_named(copy):
    rewrite(copy, lambda t: t.pop(LAYER0_UP))
    with pytest.raises(
        CheckpointError,
        match=r"missing tensor 'language_model.layers.0.mlp.up_proj.weight' "
        r"\(expected shape \[96, 64\]\)",
    ):
        logits(copy)


def test_unexpected_tensor_is_named_with_its_file(copy):
    rewrite(copy, lambda t: t.update({"model.language_model.layers.0.mlp.extra.weight": torch.zeros(3)}))
    with pytest.raises(
        CheckpointError,
        match=r"unexpected tensor 'model.language_model.layers.0.mlp.extra.weight' "
        r"in model.safetensors",
    ):
        logits(copy)


def test_misshaped_tensor_is_named_with_file_and_shapes(copy):
    rewrite(copy, lambda t: t.update({LAYER0_UP: torch.zeros(95, 64)}))
    with pytest.raises(
        CheckpointError,
        match=rf"tensor '{LAYER0_UP}' in model.safetensors has shape \[95, 64\], "
        r"expected \[96, 64\]",
    ):
        logits(copy)


def test_truncated_file_is_detected_at_open(copy):
    data = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(
        CheckpointError,
        match=r"model.safetensors: truncated safetensors file: tensor '.*' ends at "
        r"data byte \d+ but the file holds only \d+ data bytes",
    ):
        Checkpoint(copy)


@pytest.mark.parametrize("keep", [0, 5, 100])
def test_file_truncated_inside_header(copy, keep):
    data = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(data[:keep])
    with pytest.raises(CheckpointError, match=r"model.safetensors: truncated safetensors file"):
        Checkpoint(copy)


def test_corrupt_header_is_reported(copy):
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[9:13] = b"\xff\xfe{{"
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model.safetensors: corrupt safetensors header"):
        Checkpoint(copy)


def test_a_truncated_file_names_the_cut_tensor_and_the_byte_counts(copy):
    """The tensor whose data runs past the end is the last one in data order (the header's offsets); the
    counts are the tensors' own sizes (safetensors' reading of the intact file)."""
    path = copy / "model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = {k: v for k, v in json.loads(data[8 : 8 + n]).items() if k != "__metadata__"}
    last = max(header, key=lambda k: header[k]["data_offsets"][1])
    with safe_open(str(path), framework="pt") as f:
        total = sum(f.get_tensor(k).nbytes for k in f.keys())  # noqa: SIM118 (a safe_open handle is not iterable)
    path.write_bytes(data[:-1])
    with pytest.raises(
        CheckpointError,
        match=rf"^{re.escape(str(path))}: truncated safetensors file: tensor '{re.escape(last)}' ends at data "
        rf"byte {total} but the file holds only {total - 1} data bytes$",
    ):
        Checkpoint(copy)


def test_bytes_after_the_last_tensor_are_reported_with_their_counts(copy):
    path = copy / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data + b"\0" * 3)
    (n,) = struct.unpack("<Q", data[:8])
    with pytest.raises(
        CheckpointError,
        match=rf"model.safetensors: corrupt safetensors file: its tensors end at data byte {len(data) - 8 - n} "
        rf"but it holds {len(data) - 5 - n} data bytes$",
    ):
        Checkpoint(copy)


def test_a_header_entry_safetensors_refuses_is_reported_with_the_file(copy):
    """A shape that does not match its data extent: the file, the tensor and the byte count (safetensors'
    own message names none of them)."""
    path = copy / "model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    entry = header[LAYER0_UP]
    entry["shape"][0] += 1
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(raw) == n  # the edit fits in the header's padding, so only the entry is wrong
    path.write_bytes(data[:8] + raw + data[8 + n :])
    begin, end = entry["data_offsets"]
    with pytest.raises(
        CheckpointError,
        match=rf"model.safetensors: corrupt header entry for tensor '{LAYER0_UP}': dtype {entry['dtype']} "
        rf"shape \[{entry['shape'][0]}, {entry['shape'][1]}\] does not match its {end - begin} data bytes$",
    ):
        Checkpoint(copy)


def test_index_pointing_to_absent_shard(copy):
    tensors = load_file(copy / "model.safetensors")
    weight_map = {k: "model.safetensors" for k in tensors}
    weight_map[LAYER0_UP] = "model-00002-of-00002.safetensors"
    (copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(
        CheckpointError,
        match=rf"tensor '{LAYER0_UP}' is mapped to shard "
        r"'model-00002-of-00002.safetensors', which does not exist",
    ):
        Checkpoint(copy)


def test_index_entry_missing_from_its_shard(copy):
    tensors = load_file(copy / "model.safetensors")
    weight_map = {k: "model.safetensors" for k in tensors} | {
        "model.language_model.ghost": "model.safetensors"
    }
    (copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'model.language_model.ghost' is mapped to shard "
        "'model.safetensors' but that file does not contain it",
    ):
        Checkpoint(copy)


def test_no_weights_in_directory(tmp_path):
    with pytest.raises(CheckpointError, match=r"no model.safetensors or model.safetensors.index.json"):
        Checkpoint(tmp_path)


def test_tensors_are_read_lazily(saved):
    ckpt = Checkpoint(saved[0])
    assert ckpt._handles == {}
    assert ckpt.shape("language_model.norm.weight") == (64,)
    assert ckpt.get("language_model.norm.weight", torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("gate_up", "down", "layout"),
    [
        ((8, 128, 96), (8, 48, 128), "hub"),
        ((8, 96, 128), (8, 128, 48), "v5"),
        # gate_up alone is ambiguous when hidden == 2 * moe_intermediate; down_proj decides
        ((8, 96, 96), (8, 48, 96), "hub"),
        ((8, 96, 96), (8, 96, 48), "v5"),
    ],
)
def test_expert_layout_is_detected_by_shape(gate_up, down, layout):
    hidden = gate_up[1] if layout == "hub" else gate_up[2]
    assert expert_layout("layers.0.mlp.experts", gate_up, down, 8, hidden, 48) == layout


def test_expert_layouts_that_disagree_or_fit_neither_are_refused():
    with pytest.raises(
        CheckpointError,
        match="disagree on the layout: gate_up_proj .* is hub layout but down_proj "
        r".* is v5 layout",
    ):
        expert_layout("l0", (8, 128, 96), (8, 128, 48), 8, 128, 48)
    with pytest.raises(CheckpointError, match=r"expert tensor 'l0.gate_up_proj' has shape \[8, 128, 95\]"):
        expert_layout("l0", (8, 128, 95), (8, 48, 128), 8, 128, 48)
