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

import torch

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


def check_int4_shape(layer: str, in_features: int, group: int, device: torch.device) -> None:
    """ValueError naming `layer` and its width when int4 with `group` cannot pack an [out, in] weight on
    `device`: the group must divide the input width, and the CUDA packer needs a multiple of 128."""
    if in_features % group:
        raise ValueError(
            f"--quant int4: group size {group} does not divide layer {layer!r} input width {in_features}; "
            f"pick a --quant-group that divides it (32, 64, 128) or --quant int8"
        )
    multiple = INT4_IN_MULTIPLE[device.type]
    if in_features % multiple:
        raise ValueError(
            f"--quant int4 on {device.type}: layer {layer!r} input width {in_features} is not a multiple of "
            f"{multiple}, which the int4 kernel there needs; use --quant int8"
        )
