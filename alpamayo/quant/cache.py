"""Packed int8 / int4 weights cached on disk, so a second load at the same recipe skips the quantising.

One safetensors file per linear, named by the layer, the recipe and a fingerprint:

    layers.3.mlp.down.int4-g128.3f9a0c1d2e4b5a69.safetensors

The fingerprint (`alpamayo.cache_files.content_digest`, shared with the ttnn cache) covers the source weight's
bytes, dtype and shape (the checkpoint's identity), the recipe (mode, group size, whether the head is
quantised), the torch version and the CPU capability (the CPU int4 packer's layout differs between AVX512 and
AVX2 builds), the device type and this file format's version. A file's own tensors carry a BLAKE2b checksum
in its metadata: a truncated or corrupted file (unreadable header, missing tensor, wrong shape or checksum) is
reported on stderr, rebuilt and rewritten, never used. Files are written atomically (temporary name, rename).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from alpamayo.cache_files import atomic_write, content_digest
from alpamayo.quant.kernels import layer_mode
from alpamayo.quant.recipe import QuantRecipe
from alpamayo.quant.weights import Int4Weight, Int8Weight, QuantWeight, quantise_weight

# Bump when `alpamayo.quant.weights` changes what it stores for the same weight and recipe.
FORMAT_VERSION = 1


class CorruptEntry(Exception):
    """A cache file that cannot be used as stored; the message says why."""


def fingerprint(weight: torch.Tensor, recipe: QuantRecipe) -> str:
    """16 hex digits identifying the packed form of `weight` under `recipe` on its device."""
    key = (
        FORMAT_VERSION,
        torch.__version__,
        torch.backends.cpu.get_cpu_capability(),
        weight.device.type,
        recipe.mode,
        recipe.group_size,
        recipe.head,
    )
    return content_digest(key, [weight])


def _checksum(tensors: dict[str, torch.Tensor]) -> str:
    return content_digest("packed", [tensors[k] for k in sorted(tensors)])


def _metadata(q: QuantWeight) -> dict[str, str]:
    meta = {"mode": q.mode, "shape": f"{q.out_features}x{q.in_features}", "checksum": _checksum(q.tensors())}
    if isinstance(q, Int4Weight):
        meta["group"] = str(q.group)
    return meta


def _from_file(path: Path, weight: torch.Tensor, recipe: QuantRecipe) -> QuantWeight:
    """The stored weight of `path`; CorruptEntry when the file is not exactly what `_metadata` wrote."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        # cloned: safetensors hands out views at the file's byte offsets (8-byte aligned), and
        # `_weight_int8pack_mm` segfaults on an int8 weight that is not 64-byte aligned (seen on this CPU)
        tensors = {k: t.clone() for k, t in load_file(str(path), device=str(weight.device)).items()}
    except (SafetensorError, OSError, ValueError) as e:
        raise CorruptEntry(f"unreadable ({e})") from e
    shape = f"{weight.shape[0]}x{weight.shape[1]}"
    mode = layer_mode(recipe, weight.shape[1], weight.device)  # an int4 recipe's int8 layers too
    if meta.get("mode") != mode or meta.get("shape") != shape:
        raise CorruptEntry(f"holds {meta.get('mode')} {meta.get('shape')}, expected {mode} {shape}")
    names = {"q", "scales"} if mode == "int8" else {"packed", "scales_and_zeros"}
    if set(tensors) != names:
        raise CorruptEntry(f"holds tensors {sorted(tensors)}, expected {sorted(names)}")
    if _checksum(tensors) != meta.get("checksum"):
        raise CorruptEntry("checksum mismatch")
    if mode == "int8":
        return Int8Weight(tensors["q"], tensors["scales"])
    return Int4Weight(tensors["packed"], tensors["scales_and_zeros"], recipe.group_size, tuple(weight.shape))


class PackedWeightCache:
    """Quantised weights from `directory` when a matching file exists, else quantised and stored there.

    Counts: `hits` (loaded), `built` (quantised: no file yet), `rebuilt` (a corrupt file replaced)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.hits = self.built = self.rebuilt = 0

    def path(self, weight: torch.Tensor, recipe: QuantRecipe, layer: str) -> Path:
        return self.directory / f"{layer}.{recipe.name}.{fingerprint(weight, recipe)}.safetensors"

    def quantised(self, weight: torch.Tensor, recipe: QuantRecipe, layer: str) -> QuantWeight:
        """`quantise_weight(weight, recipe, layer)`, from the cache where it holds a sound copy."""
        path = self.path(weight, recipe, layer)
        if path.is_file():
            try:
                q = _from_file(path, weight, recipe)
            except CorruptEntry as e:
                print(f"alpamayo: packed-weight cache {path} is corrupt: {e}; rebuilding it", file=sys.stderr)
                self.rebuilt += 1
            else:
                self.hits += 1
                return q
        else:
            self.built += 1
        q = quantise_weight(weight, recipe, layer)
        host = {k: t.detach().cpu().contiguous() for k, t in q.tensors().items()}
        atomic_write(path, lambda tmp: save_file(host, str(tmp), metadata=_metadata(q)))
        return q
