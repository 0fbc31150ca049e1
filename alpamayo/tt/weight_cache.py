"""Prepared device weights cached on disk as ttnn `.tensorbin` files (host tensors: tilized and packed).

A file's name carries the tensor name, dtype, padded shape and a fingerprint:

    layers.3.wqkv.bfp8.5120x10240.3f9a0c1d2e4b5a69.tensorbin

The fingerprint is a BLAKE2b digest of every source tensor's bytes, dtype and shape plus the recipe that
turns them into the device tensor (transform, shapes, layout, dtype, the ttnn version that packed it and the
preparation format version). A changed checkpoint or recipe therefore gets a new file and never reuses a stale
one; the price is reading and hashing each source tensor on every load (the expensive step saved is the
block-float packing). Files are written to a temporary name and renamed, so a crash leaves no torn file
(both shared with the torch backend's packed-weight cache: `alpamayo.cache_files`).
Memory placement (DRAM-sharded or interleaved) is applied when the host tensor is moved to the device, so it
is not part of the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from alpamayo.cache_files import atomic_write, content_digest
from alpamayo.checkpoint import Getter
from alpamayo.plan.precision import Precision
from alpamayo.plan.weights import WeightSpec, prepare, weight_dtype
from alpamayo.tt.device import ttnn_for
from alpamayo.tt.device_io import DeviceTensor
from alpamayo.tt.ttnn_configs import dram_sharded_weight, ttnn_dtype, ttnn_layout

# Bump when `alpamayo.plan.weights.prepare` changes what it produces for the same spec.
PREPARE_VERSION = 2

NamedTensors = Mapping[str, DeviceTensor]  # `WeightSpec.name` -> device tensor, as `upload_weights` returns


def _ttnn_version() -> str:
    try:
        return metadata.version("ttnn")
    except metadata.PackageNotFoundError:
        return "unknown"


def fingerprint(spec: WeightSpec, dtype: str, sources: list[torch.Tensor]) -> str:
    """16 hex digits identifying the prepared tensor: source contents plus recipe."""
    recipe = (
        PREPARE_VERSION,
        _ttnn_version(),
        spec.transform,
        spec.shape,
        spec.padded,
        spec.layout,
        spec.scale,
        spec.splits,
        spec.heads,
        dtype,
    )
    return content_digest(recipe, sources)


def file_name(spec: WeightSpec, dtype: str, digest: str) -> str:
    return f"{spec.name}.{dtype}.{'x'.join(str(d) for d in spec.padded)}.{digest}.tensorbin"


def to_host_tensor(ttnn: Any, t: torch.Tensor, dtype: str, layout: str) -> Any:
    """Tilize (or keep row-major) and pack a prepared torch tensor on the host in the recipe dtype."""
    if dtype == "bf16":
        t = t.to(torch.bfloat16)
    return ttnn.from_torch(t, dtype=ttnn_dtype(ttnn, dtype), layout=ttnn_layout(ttnn, layout))


class WeightCache:
    """Host tensors for `WeightSpec`s, from `directory` when a matching file exists (None: never cache)."""

    def __init__(self, ttnn: Any, directory: str | Path | None):
        self.ttnn = ttnn
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.hits = 0
        self.built = 0

    def path(self, spec: WeightSpec, dtype: str, sources: list[torch.Tensor]) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / file_name(spec, dtype, fingerprint(spec, dtype, sources))

    def host_tensor(self, spec: WeightSpec, dtype: str, get: Getter) -> Any:
        """The packed host tensor of `spec` in `dtype`: loaded from the cache or prepared (and stored)."""
        sources = {name: get(name) for name in spec.sources}
        path = self.path(spec, dtype, list(sources.values()))
        if path is not None and path.is_file():
            self.hits += 1
            return self.ttnn.load_tensor(str(path))
        host = to_host_tensor(self.ttnn, prepare(spec, sources.__getitem__), dtype, spec.layout)
        self.built += 1
        if path is not None:
            atomic_write(path, lambda tmp: self.ttnn.dump_tensor(str(tmp), host))  # ttnn wants .tensorbin
        return host


def upload_weights(
    specs: list[WeightSpec],
    precision: Precision,
    device: Any,
    get: Getter,
    cache_dir: str | Path | None,
    dram_banks: int,
) -> dict[str, DeviceTensor]:
    """Every spec prepared (or loaded from the cache in `cache_dir`) and moved to its device placement:
    DRAM width-sharded over the `dram_banks` banks or interleaved DRAM. Returns name -> device tensor."""
    ttnn = ttnn_for(device)
    cache = WeightCache(ttnn, cache_dir)
    out = {}
    for s in specs:
        host = cache.host_tensor(s, weight_dtype(s, precision), get)
        out[s.name] = ttnn.to_device(host, device, memory_config=placement(ttnn, s, dram_banks))
    return out


def placement(ttnn: Any, spec: WeightSpec, dram_banks: int) -> Any:
    """The device memory config of `spec`: DRAM width-sharded over the banks, or interleaved DRAM."""
    if spec.placement == "dram_sharded":
        return dram_sharded_weight(ttnn, spec.padded[0], spec.padded[1], dram_banks)
    return ttnn.DRAM_MEMORY_CONFIG


def allocate_weights(
    specs: list[WeightSpec], precision: Precision, device: Any, dram_banks: int
) -> dict[str, DeviceTensor]:
    """Every spec allocated, uninitialised, where `upload_weights` puts it (same shape, dtype, layout and
    placement), with no host preparation: for the dry run at real dimensions (`alpamayo.tt.dryrun`), whose
    device ignores values and where packing a real model's weights on the host would take minutes."""
    ttnn = ttnn_for(device)
    out = {}
    for s in specs:
        dtype = ttnn_dtype(ttnn, weight_dtype(s, precision))
        out[s.name] = ttnn.allocate_tensor_on_device(
            ttnn.Shape(list(s.padded)),
            dtype,
            ttnn_layout(ttnn, s.layout),
            device,
            placement(ttnn, s, dram_banks),
        )
    return out
