"""The `.tensorbin` weight cache: file names, reuse, and that a changed tensor or recipe never reuses a file."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from alpamayo.plan.precision import TILE_BYTES
from alpamayo.plan.weights import WeightSpec
from alpamayo.tt.ttnn_configs import ttnn_dtype
from alpamayo.tt.weight_cache import WeightCache, fingerprint

SPEC = WeightSpec("layers.0.wo", ("o_proj.weight",), "o", "linear", (64, 200), (64, 256), "dram_sharded")


def _source(seed: int = 0) -> dict[str, torch.Tensor]:
    return {"o_proj.weight": torch.randn(200, 64, generator=torch.Generator().manual_seed(seed))}


def test_file_name_carries_name_dtype_padded_shape_and_fingerprint(ttnn_host, tmp_path):
    cache = WeightCache(ttnn_host, tmp_path)
    cache.host_tensor(SPEC, "bfp8", _source().__getitem__)
    (path,) = tmp_path.iterdir()
    name, dtype, shape, digest, ext = path.name.rsplit(".", 4)
    assert (name, dtype, shape, ext) == ("layers.0.wo", "bfp8", "64x256", "tensorbin")
    assert digest == fingerprint(SPEC, "bfp8", [_source()["o_proj.weight"]])


def test_second_load_reuses_the_file_and_returns_the_same_tensor(ttnn_host, tmp_path):
    first = WeightCache(ttnn_host, tmp_path)
    built = ttnn_host.to_torch(first.host_tensor(SPEC, "bfp4", _source().__getitem__))
    again = WeightCache(ttnn_host, tmp_path)
    loaded = ttnn_host.to_torch(again.host_tensor(SPEC, "bfp4", _source().__getitem__))
    assert (first.built, first.hits, again.built, again.hits) == (1, 0, 0, 1)
    assert torch.equal(built, loaded)
    assert len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda spec, dtype, seed: (spec, dtype, 1), id="changed-tensor"),
        pytest.param(lambda spec, dtype, seed: (spec, "bfp4", seed), id="changed-dtype"),
        pytest.param(
            lambda spec, dtype, seed: (replace(spec, padded=(64, 512)), dtype, seed), id="changed-padding"
        ),
        pytest.param(
            lambda spec, dtype, seed: (replace(spec, layout="row_major"), "bf16", seed), id="changed-layout"
        ),
    ],
)
def test_a_changed_tensor_or_recipe_gets_a_new_file(ttnn_host, tmp_path, change):
    cache = WeightCache(ttnn_host, tmp_path)
    cache.host_tensor(SPEC, "bfp8", _source().__getitem__)
    spec, dtype, seed = change(SPEC, "bfp8", 0)
    cache.host_tensor(spec, dtype, _source(seed).__getitem__)
    assert (cache.built, cache.hits) == (2, 0)
    assert len(list(tmp_path.iterdir())) == 2


def test_without_a_directory_nothing_is_written(ttnn_host, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cache = WeightCache(ttnn_host, None)
    cache.host_tensor(SPEC, "bf16", _source().__getitem__)
    cache.host_tensor(SPEC, "bf16", _source().__getitem__)
    assert cache.built == 2 and not list(tmp_path.iterdir())


@pytest.mark.parametrize("dtype", ["bf16", "bfp8", "bfp4"])
def test_tile_bytes_match_the_ttnn_packer(ttnn_host, tmp_path, dtype):
    """Memory planning counts TILE_BYTES per tile: one more tile costs exactly that much in a .tensorbin."""
    sizes = []
    for cols in (32, 64):
        host = ttnn_host.from_torch(
            torch.randn(32, cols), dtype=ttnn_dtype(ttnn_host, dtype), layout=ttnn_host.TILE_LAYOUT
        )
        path = tmp_path / f"{dtype}-{cols}.tensorbin"
        ttnn_host.dump_tensor(str(path), host)
        sizes.append(path.stat().st_size)
    assert sizes[1] - sizes[0] == TILE_BYTES[dtype]
