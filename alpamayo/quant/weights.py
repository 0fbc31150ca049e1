"""Quantised linear weights in the layouts PyTorch's weight-only kernels read (see `alpamayo.quant.kernels`).

int8: per output channel, symmetric: scale[n] = max|W[n, :]| / 127, q = round(W / scale) in [-127, 127],
W ~= q * scale.
int4: per group of `group` input columns, asymmetric (tinygemm's convention): codes c in [0, 15],
W ~= (c - 8) * scale + zero with scale = (max - min) / 15 and zero = min + 8 * scale of each group, so the
group's min and max are represented exactly (up to the scale's rounding to the activation dtype).

Each weight keeps only what its kernel reads; a device or dtype without a kernel is refused (`check_kernel`),
never served by a dequantising fallback.
"""

from __future__ import annotations

import torch

from alpamayo.quant.kernels import CUDA_INNER_K_TILES, INT4_OUT_MULTIPLE, check_int4_shape, check_kernel
from alpamayo.quant.recipe import QuantRecipe


class Int8Weight:
    """q int8 [N, K], scales [N] in the activation dtype; `matmul(x [..., K]) -> [..., N]`."""

    mode = "int8"

    def __init__(self, q: torch.Tensor, scales: torch.Tensor):
        self.q, self.scales = q, scales
        self.out_features, self.in_features = q.shape

    @classmethod
    def quantise(cls, weight: torch.Tensor) -> Int8Weight:
        """From a float [N, K] weight; the scales are computed in float32 and stored in `weight`'s dtype."""
        w = weight.float()
        scales = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        scales = scales.to(weight.dtype)
        q = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q, scales)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        return torch._weight_int8pack_mm(flat, self.q, self.scales).view(*x.shape[:-1], self.out_features)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"q": self.q, "scales": self.scales}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


class Int4Weight:
    """Group-wise int4: the kernel's packed codes and scales_and_zeros [K/group, N', 2] (scale, zero; N' is N
    padded to the packer's multiple) in the
    activation dtype; `matmul(x [..., K]) -> [..., N]`."""

    mode = "int4"

    def __init__(
        self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int, shape: tuple[int, int]
    ):
        self.packed, self.scales_and_zeros, self.group = packed, scales_and_zeros, group
        self.out_features, self.in_features = shape

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> Int4Weight:
        """From `int4_codes`' output (codes uint8 [N, K] in 0..15), packed for the codes' device. The packers
        take N in multiples of 16 (CPU) or 8 (CUDA): other N (a vocabulary of 155697) get zero rows (code 8,
        scale and zero 0), and `matmul` drops their outputs."""
        n = codes.shape[0]
        pad = -n % INT4_OUT_MULTIPLE[codes.device.type]
        if pad:
            codes = torch.cat([codes, codes.new_full((pad, codes.shape[1]), 8)])
            scales_and_zeros = torch.cat(
                [scales_and_zeros, scales_and_zeros.new_zeros(scales_and_zeros.shape[0], pad, 2)], 1
            )
        return cls(pack_int4(codes), scales_and_zeros, group, (n, codes.shape[1]))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if self.packed.device.type == "cuda":
            y = torch._weight_int4pack_mm(flat, self.packed, self.group, self.scales_and_zeros)
        else:
            y = torch._weight_int4pack_mm_for_cpu(flat, self.packed, self.group, self.scales_and_zeros)
        if y.shape[-1] != self.out_features:
            y = y[:, : self.out_features]
        return y.reshape(*x.shape[:-1], self.out_features)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"packed": self.packed, "scales_and_zeros": self.scales_and_zeros}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


def int4_codes(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float [N, K] (K a multiple of `group`) -> (codes uint8 [N, K] in 0..15, scales_and_zeros
    [K/group, N, 2] in `weight`'s dtype). Codes are rounded against the scale and zero as stored (already
    rounded to the dtype), so the kernel reconstructs the nearest representable value."""
    n, k = weight.shape
    w = weight.float().view(n, k // group, group)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scale = ((hi - lo) / 15).clamp(min=torch.finfo(torch.float32).tiny).to(weight.dtype).float()
    zero = (lo + 8 * scale).to(weight.dtype).float()
    codes = torch.round((w - zero[..., None]) / scale[..., None] + 8).clamp(0, 15).view(n, k).to(torch.uint8)
    scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(weight.dtype)
    return codes, scales_and_zeros


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] (0..15) -> the int4 kernel's packed weight on the codes' device."""
    if codes.device.type == "cuda":
        pairs = (codes[:, ::2] << 4 | codes[:, 1::2]).contiguous()  # uint8 [N, K/2], high nibble first
        return torch._convert_weight_to_int4pack(pairs, CUDA_INNER_K_TILES)
    return torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)


QuantWeight = Int8Weight | Int4Weight


def quantise_weight(weight: torch.Tensor, recipe: QuantRecipe, layer: str) -> QuantWeight:
    """`weight` [out, in] (on its device, in the model dtype) quantised by `recipe` (mode int8 or int4).
    ValueError naming the device and dtype without a kernel, or `layer` and its width where int4 cannot pack."""
    check_kernel(recipe.mode, weight.device, weight.dtype)
    if recipe.mode == "int8":
        return Int8Weight.quantise(weight)
    check_int4_shape(layer, weight.shape[1], recipe.group_size, weight.device)
    return Int4Weight.from_codes(*int4_codes(weight, recipe.group_size), recipe.group_size)
