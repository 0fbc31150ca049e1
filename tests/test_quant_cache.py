"""The packed int8 / int4 weight cache (alpamayo.quant.cache): a second load reads the files instead of
quantising and gives identical outputs; a changed recipe gets new files; a truncated or corrupted file is
reported and rebuilt, never used."""

from __future__ import annotations

import json

import pytest
import torch

import alpamayo.quant.cache as quant_cache
from alpamayo.cli import main
from alpamayo.quant import QuantRecipe
from alpamayo.quant.cache import PackedWeightCache
from alpamayo.text import TextModel
from alpamayo.text.linear import Linear
from tests.test_runtime import frames_at, predict_argv, straight_history, write_prediction_inputs
from vision.encoder import VisionEncoder

RECIPES = [QuantRecipe("int8"), QuantRecipe("int4", 32, head=True)]
IDS = torch.arange(5, 40, 3)


def _load(checkpoint, recipe: QuantRecipe, cache: PackedWeightCache | None) -> TextModel:
    return TextModel.from_checkpoint(checkpoint, dtype=torch.bfloat16, quant=recipe, quant_cache=cache)


def _logits(model: TextModel) -> torch.Tensor:
    model.setup_cache(IDS.numel() + 2)
    return torch.stack([model.prefill(IDS), model.decode(7)])


def _refuse_to_quantise(*args):
    raise AssertionError("quantise_weight called although the cache holds the weight")


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_the_second_load_reads_the_cache_and_gives_identical_outputs(
    demo_checkpoint, tmp_path, monkeypatch, recipe
):
    first = PackedWeightCache(tmp_path)
    reference = _logits(_load(demo_checkpoint, recipe, first))
    assert first.built > 0 and first.hits == first.rebuilt == 0
    files = sorted(tmp_path.iterdir())
    assert len(files) == first.built and all(f".{recipe.name}." in f.name for f in files)
    monkeypatch.setattr(quant_cache, "quantise_weight", _refuse_to_quantise)
    second = PackedWeightCache(tmp_path)
    logits = _logits(_load(demo_checkpoint, recipe, second))
    assert (second.hits, second.built, second.rebuilt) == (first.built, 0, 0)
    assert torch.equal(logits, reference)
    assert torch.equal(reference, _logits(_load(demo_checkpoint, recipe, None)))  # the cache changes nothing


def test_each_recipe_and_each_weight_gets_its_own_file(demo_checkpoint, tmp_path):
    cache = PackedWeightCache(tmp_path)
    for recipe in (QuantRecipe("int8"), QuantRecipe("int8", head=True), QuantRecipe("int4", 32)):
        _load(demo_checkpoint, recipe, cache)
    assert cache.hits == 0 and len(list(tmp_path.iterdir())) == cache.built
    w = torch.randn(64, 32)
    changed = w.clone()
    changed[3, 4] += 1
    paths = {cache.path(t, QuantRecipe("int4", g), "x") for t in (w, changed) for g in (32, 64)}
    assert len(paths) == 4


@pytest.mark.parametrize(
    "damage,reason",
    [
        pytest.param(lambda data: data[: len(data) // 2], "unreadable", id="truncated"),
        pytest.param(
            lambda data: data[:-1] + bytes([data[-1] ^ 0x10]), "checksum mismatch", id="flipped-bit"
        ),
        pytest.param(lambda data: b"", "unreadable", id="empty"),
    ],
)
def test_a_damaged_entry_is_reported_and_rebuilt(demo_checkpoint, tmp_path, capsys, damage, reason):
    recipe = QuantRecipe("int8")
    reference = _logits(_load(demo_checkpoint, recipe, PackedWeightCache(tmp_path)))
    victim = sorted(tmp_path.glob("layers.0.*"))[0]
    victim.write_bytes(damage(victim.read_bytes()))
    capsys.readouterr()
    cache = PackedWeightCache(tmp_path)
    logits = _logits(_load(demo_checkpoint, recipe, cache))
    err = capsys.readouterr().err
    assert cache.rebuilt == 1 and cache.built == 0
    assert f"packed-weight cache {victim} is corrupt: {reason}" in err and "rebuilding it" in err
    assert torch.equal(logits, reference)
    again = PackedWeightCache(tmp_path)  # the rebuilt file is sound
    _load(demo_checkpoint, recipe, again)
    assert again.rebuilt == 0 and again.hits == cache.hits + 1


def test_predict_with_quant_cache_fills_it_once_and_predicts_the_same(demo_checkpoint, tmp_path, capsys):
    write_prediction_inputs(tmp_path, *frames_at(5), straight_history())
    cache = tmp_path / "packed"
    args = [
        *predict_argv(demo_checkpoint, tmp_path),
        "--json",
        "--quant",
        "int8",
        "--quant-cache",
        str(cache),
    ]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)["samples"]
    stored = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert stored
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == first
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == stored  # read, not rewritten


def test_an_int4_recipes_int8_layer_is_cached_and_read_back_as_int8(demo_checkpoint, tmp_path, monkeypatch):
    """The demo vision tower at int4-g128: its 64-wide layers are packed at int8 (`layer_mode`), stored so,
    and the second load reads them back as int8 (not reported corrupt for holding another mode than int4)."""
    recipe = QuantRecipe("int4", 128)
    first = PackedWeightCache(tmp_path)
    built = VisionEncoder.from_checkpoint(demo_checkpoint, quant=recipe, quant_cache=first)
    modes = {json.loads(_header(p))["__metadata__"]["mode"] for p in tmp_path.iterdir()}
    assert modes == {"int4", "int8"}
    monkeypatch.setattr(quant_cache, "quantise_weight", _refuse_to_quantise)
    second = PackedWeightCache(tmp_path)
    read = VisionEncoder.from_checkpoint(demo_checkpoint, quant=recipe, quant_cache=second)
    assert (second.hits, second.built, second.rebuilt) == (first.built, 0, 0)
    for (name, a), (_, b) in zip(_quantised(built), _quantised(read), strict=True):
        assert type(a) is type(b), name
        assert all(torch.equal(t, b.tensors()[k]) for k, t in a.tensors().items()), name


def _header(path) -> bytes:
    data = path.read_bytes()
    return data[8 : 8 + int.from_bytes(data[:8], "little")]


def _quantised(root: torch.nn.Module) -> list:
    return [
        (n, m.quantised) for n, m in root.named_modules() if isinstance(m, Linear) and m.quantised is not None
    ]
