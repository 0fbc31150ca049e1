"""Quantised linear weights in the layouts PyTorch's weight-only kernels read (see `alpamayo.quant.kernels`).

int8: per output channel, symmetric: scale[n] = max|W[n, :]| / 127, q = round(W / scale) in [-127, 127],
W ~= q * scale.
int4: per group of `group` input columns, asymmetric (tinygemm's convention): codes c in [0, 15],
W ~= (c - 8) * scale + zero with scale = (max - min) / 15 and zero = min + 8 * scale of each group, so the
group's min and max are represented exactly (up to the scale's rounding to the activation dtype).

Each weight keeps only what its kernel reads; a device or dtype without a kernel is refused (`check_kernel`),
never served by a dequantising fallback. Under int4 a layer whose input width the group (or the CUDA kernel's
multiple of 128) does not divide is packed at int8 instead (`alpamayo.quant.kernels.layer_mode`). On the CPU a call with many rows (prefill, the expert's K samples x
64 tokens) instead dequantises the weight to the activation dtype, slice by slice, once per call, and runs the
dense oneDNN matmul, which is compute-bound there while the weight-only kernels cost about a decode call per
row (int8 from 16 rows, int4 from 256: `DEQUANTISE_FROM_ROWS`); both paths read the same codes, scales and
zeros.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from alpamayo.quant.kernels import (
    CUDA_INNER_K_TILES,
    INT4_OUT_MULTIPLE,
    check_int4_shape,
    check_kernel,
    layer_mode,
)
from alpamayo.quant.recipe import QuantRecipe

# Rows (x flattened to [M, K]) from which a CPU call dequantises the weight and runs the dense matmul instead
# of the weight-only kernel. Measured by `benchmarks/quantised_decode.py` (section 1) at the 8B MLP shape
# (12288 x 4096, bf16, 1 thread, shared 2-core machine, docs/quantisation.md): int8 kernel / dense 82 / 87 ms
# at 16 rows, 166 / 92 at 32, 340 / 161 at 64 (bf16 100); int4 kernel / dense 251 / 562 ms at 64 rows: the
# kernel costs ~3.9 ms a row, the dequantising ~0.5 s a call, so int4 switches only at 256 rows.
DEQUANTISE_FROM_ROWS = {"int8": 16, "int4": 256}
# Output channels dequantised at a time on that path: the temporary slice (512 x 4096 float32, 8 MB) stays in
# the cache and in the allocator's reused heap, where a whole weight's temporary (the 8B head's would be
# 2.5 GB) is a fresh mapping each call whose page faults cost more than the matmul; oneDNN stays efficient
# at N = 512.
DENSE_CHUNK = 512


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
            y = self.dense_matmul(flat)
        else:
            y = self.kernel_matmul(flat)
        return y.view(*x.shape[:-1], self.out_features)

    def kernel_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        """[M, K] -> [M, N] by `aten._weight_int8pack_mm` (reads the int8 codes: the decode path)."""
        return torch._weight_int8pack_mm(flat, self.q, self.scales)

    def dense_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        """[M, K] -> [M, N] by the dense matmul of `flat`'s dtype on the codes converted, `DENSE_CHUNK` output
        channels at a time. The per-channel scales commute with the matmul, x @ (q * s)^T = (x @ q^T) * s, and
        the codes (|q| <= 127) are exact in every activation dtype: only the output is rounded (twice in
        bf16)."""
        n = self.out_features
        buf = torch.empty(min(n, DENSE_CHUNK), self.in_features, dtype=flat.dtype)  # reused by every slice
        parts = []
        for i in range(0, n, DENSE_CHUNK):
            codes = self.q[i : i + DENSE_CHUNK]
            parts.append(F.linear(flat, buf[: codes.shape[0]].copy_(codes)))
        return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)).mul_(self.scales)

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
        cpu = self.packed.device.type == "cpu"
        if cpu and flat.shape[0] >= DEQUANTISE_FROM_ROWS["int4"] and cpu_int4_layout_known():
            y = self.dense_matmul(flat)
        else:
            y = self.kernel_matmul(flat)
        if y.shape[-1] != self.out_features:
            y = y[:, : self.out_features]
        return y.reshape(*x.shape[:-1], self.out_features)

    def kernel_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        """[M, K] -> [M, N'] by the int4 weight-only kernel of the device (reads the packed codes)."""
        if self.packed.device.type == "cuda":
            return torch._weight_int4pack_mm(flat, self.packed, self.group, self.scales_and_zeros)
        return torch._weight_int4pack_mm_for_cpu(flat, self.packed, self.group, self.scales_and_zeros)

    def dense_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        """[M, K] -> [M, N'] by the dense matmul of `flat`'s dtype on the CPU-packed weight dequantised
        `DENSE_CHUNK` output channels at a time, (c - 8) * scale + zero as the kernel computes it (in float32,
        then rounded once to the dtype). Needs `cpu_int4_layout_known()`."""
        k, g, half = self.in_features, self.group, CPU_INT4_BLOCK // 2
        blocks = self.packed.view(-1, k, half)
        sz = self.scales_and_zeros.float()  # [K/group, N', 2]
        step = min(DENSE_CHUNK // CPU_INT4_BLOCK, blocks.shape[0])
        # reused by every slice: the codes unpacked and dequantised in float32, and rounded to the dtype
        wide = torch.empty(k, step * CPU_INT4_BLOCK)
        narrow = torch.empty(k, step * CPU_INT4_BLOCK, dtype=flat.dtype)
        parts = []
        for b in range(0, blocks.shape[0], step):
            src = blocks[b : b + step].transpose(0, 1)  # [K, nb, 32]: byte j holds rows j and j + 32
            nb = src.shape[1]
            n0, n = b * CPU_INT4_BLOCK, nb * CPU_INT4_BLOCK
            w = wide[:, :n]
            lo_hi = w.view(k, nb, 2, half)
            lo_hi[:, :, 0].copy_(src & 15)
            lo_hi[:, :, 1].copy_(src >> 4)
            grouped = w.view(k // g, g, n)
            grouped.sub_(8).mul_(sz[:, None, n0 : n0 + n, 0]).add_(sz[:, None, n0 : n0 + n, 1])
            parts.append(flat @ narrow[:, :n].copy_(w))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

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
    """`_convert_weight_to_int4pack_for_cpu`'s output for N' rows (a multiple of 64; or a slice of its
    [N'/64, K, 32] blocks) -> codes uint8 [K, N']."""
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
    """`weight` [out, in] (on its device, in the model dtype) quantised by `recipe` (mode int8 or int4), packed
    as `layer_mode` decides for its width: an int4 recipe packs a width its group or the device's int4 kernel
    cannot take at int8 per output channel (the returned weight's `mode` says which). ValueError naming the
    device and dtype where the recipe's kernel does not exist."""
    check_kernel(recipe.mode, weight.device, weight.dtype)
    if layer_mode(recipe, weight.shape[1], weight.device) == "int8":
        return Int8Weight.quantise(weight)
    check_int4_shape(layer, weight.shape[1], recipe.group_size, weight.device)
    return Int4Weight.from_codes(*int4_codes(weight, recipe.group_size), recipe.group_size)
