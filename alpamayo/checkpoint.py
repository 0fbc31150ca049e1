"""Lazy safetensors checkpoints: one file or a sharded `model.safetensors.index.json`.

Opening a checkpoint reads only the safetensors headers (safetensors' own `safe_open`, which checks that the
header's data offsets cover the file exactly; a truncated file is reported with its byte counts) and checks
every index entry against its shard. Tensors are read one at a time (memory-mapped) by `Checkpoint.get`, so
peak host memory while building a model is about one copy of it.

Names are normalised to one canonical form, whatever the on-disk spelling:
    language_model.<...>   text decoder     (HF: model.language_model.<...>; Alpamayo: vlm.model.language_model.<...>)
    visual.<...>           vision tower     (HF: model.visual.<...>)
    lm_head.weight         output head      (absent on disk when tied to the embeddings)
Tensors outside the VLM in an Alpamayo checkpoint (action expert, projections) keep their on-disk names.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from alpamayo.config.loader import load_model_config
from alpamayo.config.model import ModelConfig, expert_layouts
from alpamayo.errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
VLM_NAMESPACES = ("language_model.", "visual.", "lm_head.")
# (on-disk prefix, canonical prefix), applied in order after the weight prefix is removed.
_RENAMES = (
    ("model.language_model.model.", "language_model."),
    ("model.language_model.", "language_model."),
    ("language_model.model.", "language_model."),
    ("model.visual.", "visual."),
    ("language_model.lm_head.", "lm_head."),
)

Shape = tuple[int, ...]
# Bytes per element of the safetensors dtypes a checkpoint holds: to name the tensor whose header entry
# safetensors refuses (it says only "invalid shape, data type, or offset for tensor").
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1}
_DTYPE_BYTES |= {f"{kind}{bits}": bits // 8 for kind in "IU" for bits in (8, 16, 32, 64)}
Getter = Callable[[str], torch.Tensor]  # canonical tensor name -> tensor, what module builders read through


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: file, on-disk key, shape and safetensors dtype string."""

    file: Path
    key: str
    shape: Shape
    dtype: str


def canonical_name(key: str, weight_prefix: str = "") -> str | None:
    """Canonical VLM name of an on-disk key, or None if the key is not part of the VLM.

    With `weight_prefix` ("vlm." for Alpamayo) only keys carrying the prefix belong to the VLM.
    """
    if weight_prefix:
        if not key.startswith(weight_prefix):
            return None
        key = key[len(weight_prefix) :]
    for old, new in _RENAMES:
        if key.startswith(old):
            key = new + key[len(old) :]
            break
    return key if key.startswith(VLM_NAMESPACES) else None


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors of one safetensors file, read by safetensors itself (`safe_open`, which memory-maps the file
    and checks that the header's data offsets tile the data exactly, and `get_slice` for shapes and dtypes); a
    file it refuses raises CheckpointError saying what is wrong in the file's own byte counts."""
    try:
        entries = {}
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
                tensor = f.get_slice(key)  # the header's view of it: nothing is read
                entries[key] = TensorEntry(
                    path, key, tuple(int(d) for d in tensor.get_shape()), tensor.get_dtype()
                )
        return entries
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read safetensors file ({e})") from e
    except Exception as e:  # safetensors' SafetensorError: it says what is wrong, not where nor by how much
        raise CheckpointError(f"{path}: {_damage(path, e)}") from e


def _damage(path: Path, error: Exception) -> str:
    """Why safetensors refused `path`, from its size, its 8-byte little-endian header length and the data
    extent its JSON header declares (safetensors reports a truncated file only as "incomplete metadata, file
    not fully covered"); safetensors' own words when none of those is at fault."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"truncated safetensors file ({size} bytes, header length missing)"
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            return f"truncated safetensors file: header claims {n} bytes but the file has {size} bytes"
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError alike
        return f"corrupt safetensors header ({e})"
    if not isinstance(header, dict):
        return "corrupt safetensors header (not a JSON object)"
    data_bytes = size - 8 - n
    try:
        entries = {
            key: (info["dtype"], [int(d) for d in info["shape"]], [int(o) for o in info["data_offsets"]])
            for key, info in header.items()
            if key != "__metadata__"
        }
    except (KeyError, TypeError, ValueError) as e:
        return f"corrupt safetensors header ({error}: {e!r})"
    for key, (dtype, shape, (begin, end)) in entries.items():
        if end > data_bytes:
            return (
                f"truncated safetensors file: tensor '{key}' ends at data byte {end} "
                f"but the file holds only {data_bytes} data bytes"
            )
        if dtype in _DTYPE_BYTES and end - begin != math.prod(shape) * _DTYPE_BYTES[dtype]:
            return (
                f"corrupt header entry for tensor '{key}': dtype {dtype} shape {shape} does not match its "
                f"{end - begin} data bytes"
            )
    last = max((end for _, _, (_, end) in entries.values()), default=0)
    if last < data_bytes:
        return f"corrupt safetensors file: its tensors end at data byte {last} but it holds {data_bytes} data bytes"
    return f"corrupt safetensors file ({error})"


def _shard_files(directory: Path) -> tuple[list[Path], dict[str, str] | None]:
    """Files to read, and the index's key -> shard map when the checkpoint is sharded."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"{index}: malformed index file ({e!r}); it needs a 'weight_map' object"
            ) from e
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: 'weight_map' must map tensor names to shard files")
        files = []
        for key, shard in weight_map.items():
            path = directory / shard
            if not path.is_file():
                raise CheckpointError(
                    f"{index}: tensor '{key}' is mapped to shard '{shard}', which does not exist"
                )
            if path not in files:
                files.append(path)
        return files, weight_map
    single = directory / SINGLE_FILE
    if single.is_file():
        return [single], None
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: checkpoint directory does not exist")
    raise CheckpointError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE} in checkpoint directory")


class Checkpoint:
    """Read-only view of a checkpoint's tensors under canonical names (see module docstring)."""

    def __init__(self, directory: str | Path, weight_prefix: str = ""):
        self.directory = Path(directory)
        self.weight_prefix = weight_prefix
        files, weight_map = _shard_files(self.directory)
        self._entries: dict[str, TensorEntry] = {}
        for path in files:
            for key, entry in read_header(path).items():
                if weight_map is not None and weight_map.get(key) != path.name:
                    continue  # a stray tensor the index does not point at; the index is authoritative
                name = canonical_name(key, weight_prefix) or key
                if name in self._entries:
                    other = self._entries[name]
                    raise CheckpointError(
                        f"{self.directory}: tensor '{name}' appears twice: '{other.key}' in {other.file.name} "
                        f"and '{key}' in {path.name}"
                    )
                self._entries[name] = entry
        if weight_map is not None:
            found = {e.key for e in self._entries.values()}
            for key, shard in weight_map.items():
                if key not in found:
                    raise CheckpointError(
                        f"{self.directory / INDEX_FILE}: tensor '{key}' is mapped to shard '{shard}' "
                        f"but that file does not contain it"
                    )
        self._handles: dict[Path, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self, namespace: str = "") -> list[str]:
        """Canonical names, sorted, optionally restricted to a prefix such as 'language_model.'."""
        return sorted(n for n in self._entries if n.startswith(namespace))

    def entry(self, name: str) -> TensorEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise CheckpointError(f"{self.directory}: missing tensor '{name}'") from None

    def shape(self, name: str) -> Shape:
        return self.entry(name).shape

    def get(
        self, name: str, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> torch.Tensor:
        """Load one tensor (memory-mapped read), optionally cast and moved."""
        entry = self.entry(name)
        handle = self._handles.get(entry.file)
        if handle is None:
            try:
                handle = safe_open(str(entry.file), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"{entry.file}: cannot open safetensors file ({e})") from e
            self._handles[entry.file] = handle
        try:
            tensor = handle.get_tensor(entry.key)
        except Exception as e:
            raise CheckpointError(f"{entry.file}: cannot read tensor '{entry.key}' ({e})") from e
        if dtype is not None and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        return tensor.to(device) if torch.device(device).type != "cpu" else tensor

    def getter(self, dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> Getter:
        """`get` with the dtype and device fixed: what module builders take to read their tensors."""
        return lambda name: self.get(name, dtype, device)

    def validate(self, expected: Mapping[str, Sequence[Shape]], namespaces: Iterable[str]) -> None:
        """Check names and shapes against `expected` (name -> allowed shapes).

        Every expected tensor must be present with one of its allowed shapes, and no tensor under
        `namespaces` may be left over. All problems are reported at once, each naming tensor and file.
        """
        problems = []
        for name, shapes in expected.items():
            entry = self._entries.get(name)
            if entry is None:
                problems.append(f"missing tensor '{name}' (expected shape {_fmt_shapes(shapes)})")
            elif entry.shape not in [tuple(s) for s in shapes]:
                problems.append(
                    f"tensor '{entry.key}' in {entry.file.name} has shape {list(entry.shape)}, "
                    f"expected {_fmt_shapes(shapes)}"
                )
        for name in self.names():
            if name.startswith(tuple(namespaces)) and name not in expected:
                entry = self._entries[name]
                problems.append(f"unexpected tensor '{entry.key}' in {entry.file.name}")
        if problems:
            head = (
                f"{self.directory}: checkpoint does not match its config.json ({len(problems)} problem(s)):"
            )
            raise CheckpointError(
                "\n  ".join([head, *problems[:20]] + (["..."] if len(problems) > 20 else []))
            )


def open_checkpoint(
    source: str | Path | Checkpoint, cfg: ModelConfig | None = None
) -> tuple[Checkpoint, ModelConfig]:
    """A checkpoint directory (or an already open `Checkpoint`, shared by the models built from it) and its
    config: `cfg` if given, else the directory's config.json."""
    ckpt = source if isinstance(source, Checkpoint) else None
    directory = ckpt.directory if ckpt is not None else Path(source)
    cfg = cfg or load_model_config(directory)
    return ckpt or Checkpoint(directory, cfg.weight_prefix), cfg


def _fmt_shapes(shapes: Sequence[Shape]) -> str:
    return " or ".join(str(list(s)) for s in shapes)


def expert_layout(name: str, gate_up: Shape, down: Shape, num_experts: int, hidden: int, inter: int) -> str:
    """On-disk layout of fused MoE expert tensors ("hub" or "v5", see `expert_layouts`), detected by shape.

    gate_up_proj alone is ambiguous when hidden == 2 * moe_intermediate; down_proj then decides (the pair can
    only be ambiguous if hidden == moe_intermediate == 0). Raises when a tensor fits neither layout or the two
    tensors disagree.
    """
    layouts = expert_layouts(num_experts, hidden, inter)
    gu_fits = {k for k, (gu, _) in layouts.items() if tuple(gate_up) == gu}
    dn_fits = {k for k, (_, dn) in layouts.items() if tuple(down) == dn}
    both = gu_fits & dn_fits
    if len(both) == 1:
        return both.pop()
    expect = f"hub {[list(s) for s in layouts['hub']]} or v5 {[list(s) for s in layouts['v5']]}"
    dims = f"E={num_experts}, hidden={hidden}, moe_intermediate={inter}"
    if not gu_fits or not dn_fits:
        bad = "gate_up_proj" if not gu_fits else "down_proj"
        raise CheckpointError(
            f"expert tensor '{name}.{bad}' has shape {list(gate_up if bad == 'gate_up_proj' else down)}; "
            f"expected (gate_up_proj, down_proj) in layout {expect} ({dims})"
        )
    raise CheckpointError(
        f"expert tensors of '{name}' disagree on the layout: gate_up_proj {list(gate_up)} is "
        f"{'/'.join(sorted(gu_fits))} layout but down_proj {list(down)} is {'/'.join(sorted(dn_fits))} layout ({dims})"
    )
