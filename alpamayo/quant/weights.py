"""Quantised linear weights in the layouts PyTorch's weight-only kernels read (see `alpamayo.quant.kernels`).

int8: per output channel, symmetric: scale[n] = max|W[n, :]| / 127, q = round(W / scale) in [-127, 127],
W ~= q * scale.
int4: per group of `group` input columns, asymmetric (tinygemm's convention): codes c in [0, 15],
W ~= (c - 8) * scale + zero with scale = (max - min) / 15 and zero = min + 8 * scale of each group, so the
group's min and max are represented exactly (up to the scale's rounding to the activation dtype).

Each weight keeps only what its kernel reads; a device or dtype without a kernel is refused (`check_kernel`),
never served by a dequantising fallback. On the CPU a call with many rows (prefill, the expert's K samples x
64 tokens) instead dequantises the weight to the activation dtype once per call and runs the dense oneDNN
matmul, which is compute-bound there and several times faster per row than the weight-only kernels
(`DEQUANTISE_FROM_ROWS`); both read the same codes, scales and zeros.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from alpamayo.quant.kernels import CUDA_INNER_K_TILES, INT4_OUT_MULTIPLE, check_int4_shape, check_kernel
from alpamayo.quant.recipe import QuantRecipe

# Rows (x flattened to [M, K]) from which a CPU call dequantises the weight and runs the dense matmul instead
# of the weight-only kernel. Measured with `benchmarks/quantised_decode.py --kernels` at the 8B MLP shape
# (12288 x 4096, bf16, 2 cores): SEE_DOCS.
DEQUANTISE_FROM_ROWS = {"int8": 16, "int4": 16}


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
        if flat.shape[0] >= DEQUANTISE_FROM_ROWS["int8"] and self.q.device.type == "cpu":
            # per-output-channel scales commute with the matmul: x @ (q * s)^T = (x @ q^T) * s, and the codes
            # (|q| <= 127) are exact in every activation dtype, so only the output is rounded (twice in bf16)
            y = F.linear(flat, self.q.to(flat.dtype)) * self.scales
        else:
            y = torch._weight_int8pack_mm(flat, self.q, self.scales)
        return y.view(*x.shape[:-1], self.out_features)

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
        take N in multiples of 16 (CPU; padded to whole blocks of 64, the layout `unpack_cpu_int4` reads) or 8
        (CUDA): other N (a vocabulary of 155697) get zero rows (code 8, scale and zero 0), and `matmul` drops
        their outputs."""
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
        elif flat.shape[0] >= DEQUANTISE_FROM_ROWS["int4"] and cpu_int4_layout_known():
            y = flat @ self.dequantised_t(flat.dtype)
        else:
            y = torch._weight_int4pack_mm_for_cpu(flat, self.packed, self.group, self.scales_and_zeros)
        if y.shape[-1] != self.out_features:
            y = y[:, : self.out_features]
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantised_t(self, dtype: torch.dtype) -> torch.Tensor:
        """The CPU-packed weight dequantised, transposed: [K, N'] in `dtype`, (c - 8) * scale + zero as the
        kernel computes it (in float32, then rounded once to `dtype`). Needs `cpu_int4_layout_known()`."""
        codes = unpack_cpu_int4(self.packed, self.in_features)  # uint8 [K, N']
        sz = self.scales_and_zeros.float()  # [K/group, N', 2]
        k, n = codes.shape
        w = codes.view(k // self.group, self.group, n).to(torch.float32).sub_(8).mul_(sz[:, None, :, 0])
        return w.add_(sz[:, None, :, 1]).view(k, n).to(dtype)

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


# The CPU packer's layout on AVX512 builds (aten/src/ATen/native/cpu/int4mm_kernel.cpp, `weight_to_int4pack`):
# rows in blocks of 64, uint8 [N/64, K, 32], byte j of (block, k) holding row j in its low nibble and row
# j + 32 in its high one. It differs on other CPU capabilities (blocks of 32 on AVX2) and for a partial last
# block, so `cpu_int4_layout_known` checks it once on a probe and Int4Weight pads N to whole blocks.
CPU_INT4_BLOCK = 64


def unpack_cpu_int4(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """`_convert_weight_to_int4pack_for_cpu`'s output (N' rows, a multiple of 64) -> codes uint8 [K, N']."""
    blocks = packed.view(-1, in_features, CPU_INT4_BLOCK // 2)
    codes = torch.cat([blocks & 15, blocks >> 4], dim=-1)  # [N'/64, K, 64]: rows j, then j + 32
    return codes.transpose(0, 1).reshape(in_features, -1)


@functools.cache
def cpu_int4_layout_known() -> bool:
    """True when this build's CPU int4 packer lays codes out as `unpack_cpu_int4` reads them (checked on a
    two-block probe of random codes); else the int4 kernel serves every call."""
    g = torch.Generator().manual_seed(0)
    probe = torch.randint(0, 16, (2 * CPU_INT4_BLOCK, 32), generator=g, dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(probe, 1)
    if packed.numel() != probe.numel() // 2:
        return False
    return torch.equal(unpack_cpu_int4(packed, 32).t().to(torch.int32), probe)


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
