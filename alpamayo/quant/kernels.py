"""Which of PyTorch's weight-only kernels exist for a device and activation dtype, and their shape rules.

Checked on torch 2.14 (`torch._C._dispatch_has_kernel_for_dispatch_key` and runs on this CPU):
- int8 `aten._weight_int8pack_mm(x [M, K], w int8 [N, K], scales [N])`: CPU and CUDA; x float32, bfloat16 or
  float16 with scales of x's dtype; any N and K.
- int4 on CPU `aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros [K/group, N, 2])` after
  `_convert_weight_to_int4pack_for_cpu(int32 [N, K], 1)`: float32, bfloat16 or float16; N a multiple of 16
  (other N are padded with zero rows to a multiple of 64, the AVX512 packer's block,
  `alpamayo.quant.weights.Int4Weight.from_codes`).
- int4 on CUDA `aten._weight_int4pack_mm` after `_convert_weight_to_int4pack(uint8 [N, K/2], inner_k_tiles)`
  (tinygemm): bfloat16 only, N a multiple of 8, K a multiple of `inner_k_tiles` x 16 (8 x 16 = 128 here).
"""

from __future__ import annotations

import math
import re

import torch

from alpamayo.quant.recipe import GROUP_SIZES, QuantRecipe

_DTYPES: dict[tuple[str, str], tuple[torch.dtype, ...]] = {
    ("int8", "cpu"): (torch.float32, torch.bfloat16, torch.float16),
    ("int8", "cuda"): (torch.float32, torch.bfloat16, torch.float16),
    ("int4", "cpu"): (torch.float32, torch.bfloat16, torch.float16),
    ("int4", "cuda"): (torch.bfloat16,),
}
# Multiples of N and of K the int4 packers require (beyond the group size dividing K); N is padded to its
# (on the CPU to 64, whole blocks of the packed layout that `weights.unpack_cpu_int4` reads).
INT4_OUT_MULTIPLE = {"cpu": 64, "cuda": 8}
INT4_IN_MULTIPLE = {"cpu": 1, "cuda": 128}
CUDA_INNER_K_TILES = 8


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_kernel(mode: str, device: torch.device | str, dtype: torch.dtype) -> None:
    """ValueError naming `device` and `dtype` when PyTorch has no `mode` ("int8"/"int4") weight-only kernel
    for them."""
    kind = torch.device(device).type
    allowed = _DTYPES.get((mode, kind))
    if allowed is None:
        devices = sorted({d for m, d in _DTYPES if m == mode})
        raise ValueError(
            f"--quant {mode}: PyTorch has no {mode} weight-only kernel on device {kind!r} "
            f"(dtype {_name(dtype)}); devices with one: {devices}"
        )
    if dtype not in allowed:
        raise ValueError(
            f"--quant {mode}: PyTorch's {mode} weight-only kernel on {kind} does not take dtype "
            f"{_name(dtype)}; allowed there: {[_name(d) for d in allowed]}"
        )


def int4_in_multiple(group: int, device: torch.device | str) -> int:
    """The multiple of the input width that int4 with `group` packs on `device`: the group's, and on CUDA
    tinygemm's 128 as well."""
    return math.lcm(group, INT4_IN_MULTIPLE[torch.device(device).type])


def layer_mode(recipe: QuantRecipe, in_features: int, device: torch.device | str) -> str:
    """How one linear of `in_features` input columns that `recipe` applies to is packed on `device`:
    `recipe.mode`, except under int4 where the width is not a multiple of `int4_in_multiple` (the group does
    not divide it, or the device's int4 kernel refuses it): "int8" per output channel, the finest recipe that
    loads every width. The single place this is decided: `quantise_weight` packs by it, the packed-weight
    cache checks its files by it and the memory plan counts by it, so plan and load cannot disagree."""
    if recipe.mode == "int4" and in_features % int4_in_multiple(recipe.group_size, device):
        return "int8"
    return recipe.mode


def check_int4_shape(layer: str, in_features: int, group: int, device: torch.device | str) -> None:
    """ValueError naming `layer`, its width and the group sizes that would pack it when int4 with `group`
    cannot pack an [out, in] weight on `device` (see `int4_in_multiple`); `layer_mode` sends such a layer to
    int8 instead, so this guards direct int4 packing only."""
    kind = torch.device(device).type
    multiple = int4_in_multiple(group, kind)
    if in_features % multiple == 0:
        return
    packing = [g for g in GROUP_SIZES if in_features % int4_in_multiple(g, kind) == 0]
    kernel = f" (group {group}, and the {kind} int4 kernel needs a multiple of {INT4_IN_MULTIPLE[kind]})"
    hint = (
        f"group sizes that pack it: {packing}"
        if packing
        else f"no group size of {list(GROUP_SIZES)} packs it"
    )
    raise ValueError(
        f"int4 on {kind}: layer {layer!r} input width {in_features} is not a multiple of {multiple}"
        f"{kernel if multiple != group else ''}; {hint} on {kind} (--quant int4 packs such a layer at int8)"
    )


def _pattern(name: str) -> str:
    """A layer name with its indices starred: "blocks.3.mlp.fc2" -> "blocks.*.mlp.fc2"."""
    return re.sub(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)", "*", name)


def describe_fallbacks(
    recipe: QuantRecipe, device: torch.device | str, part: str, fallen: list[tuple[str, int]], total: int
) -> str:
    """One line for the `fallen` (layer name, input width) of `total` linears of `part` that `layer_mode`
    packed at int8 under `recipe` on `device`, the names grouped by pattern:
    "int4-g128 on cuda, vision tower: 27 of 117 linears at int8 (input widths not a multiple of 128:
    blocks.*.mlp.fc2 4304)"."""
    groups: dict[tuple[str, int], None] = {(_pattern(name), width): None for name, width in fallen}
    kind = torch.device(device).type
    listed = ", ".join(f"{pattern} {width}" for pattern, width in groups)
    return (
        f"{recipe.name} on {kind}, {part}: {len(fallen)} of {total} linears at int8 (input widths not a "
        f"multiple of {int4_in_multiple(recipe.group_size, kind)}: {listed})"
    )
