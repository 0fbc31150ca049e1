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
row (from `DEQUANTISE_FROM_ROWS` rows); both paths read the same codes, scales and zeros.
"""

from __future__ import annotations

import functools

import torch

from alpamayo.quant.kernels import (
    CUDA_INNER_K_TILES,
    INT4_OUT_MULTIPLE,
    check_int4_shape,
    check_kernel,
    layer_mode,
)
from alpamayo.quant.recipe import QuantRecipe

# Rows (x flattened to [M, K]) from which a CPU call dequantises the weight and runs the dense matmul instead
# of the weight-only kernel: where the dense path overtakes the kernel, whose cost grows by about a decode
# call per row while the dense path's is nearly flat below ~128 rows. Measured side by side in one process
# (bf16, 2 threads, 2026-12-02 15:03 UTC, load ~1.8; docs/quantisation.md "Prefill: the dense path against
# bf16"), kernel / dense ms: int8 at 12288 x 2048 7.9 / 10.2 at 8 rows, 5.4 / 5.7 at 16, 8.0 / 6.4 at 24;
# at 24576 x 4096 11.8 / 23.8, 23.4 / 25.2, 35.6 / 26.5 (within 10 % at 16 on every shape, the dense path
# 1.2-1.35x ahead at 24); int4 at 12288 x 2048 14.8 / 18.7 at 48 rows, 20.3 / 19.0 at 64, 29.9 / 20.1 at
# 96; at 24576 x 4096 60.3 / 71.0, 79.4 / 71.3, 120.8 / 75.1.
DEQUANTISE_FROM_ROWS = {"int8": 16, "int4": 64}
# Output channels that path dequantises at a time: the largest power of two whose slice of the activation
# dtype together with its columns of the output ([M, n]) fits in DENSE_CHUNK_BYTES (16 MiB: 2048 channels
# at K = 2048 up to ~2000 rows, 1024 at K = 4096), and at least DENSE_MIN_ROWS. Measured side by side (bf16,
# 2 threads, idle machine, 2026-12-02 15:36-15:55 UTC), int8: oneDNN's matmul loses efficiency at small N
# and re-reads the activation for every slice (12288 x 2048, M = 128, one thread: 256 / 512 / 1024 / 2048
# rows at 0.38 / 0.46 / 0.54 / 0.60x bf16), but at M = 3000 2048 rows ran at 0.95x and 1024 at 1.14x
# (131.8 / 112.6 ms, bf16 128.1); some slice shapes are slow outright: 2048 x 6144 at M = 512 15.7 ms at
# 512 or 640 rows against 8.5 at 1024 (bf16 8.5), 4096 x 12288 65-71 ms at 512 rows against 38 at 256 or
# 1024 (bf16 35), hence powers of two and the floor of 1024. A slice past glibc's largest mmap threshold
# (32 MiB) would be a fresh mapping each call whose page faults cost more than the matmul (0.27x at
# 32 MiB), as a whole weight's temporary would (the 8B head's is 2.5 GB); the floor of 1024 reaches it only
# from K = 16384, wider than any linear here.
DENSE_CHUNK_BYTES = 16 << 20
DENSE_MIN_ROWS = 1024


def dense_chunk_rows(in_features: int, rows: int, dtype: torch.dtype) -> int:
    """Output channels per dequantised slice for an [rows, in_features] activation (a power of two, so whole
    blocks of the CPU int4 layout)."""
    n = DENSE_CHUNK_BYTES // ((in_features + rows) * dtype.itemsize)
    return max(DENSE_MIN_ROWS, 1 << (max(n, 1).bit_length() - 1))


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
        """[M, K] -> [M, N] by the dense matmul of `flat`'s dtype on the codes converted (one pass per slice
        of `dense_chunk_rows` output channels, into a reused buffer; each slice's product written straight
        into the output's columns). The per-channel scales commute with the matmul,
        x @ (q * s)^T = (x @ q^T) * s, and the codes (|q| <= 127) are exact in every activation dtype: only
        the output is rounded (twice in bf16)."""
        n = self.out_features
        step = min(n, dense_chunk_rows(self.in_features, flat.shape[0], flat.dtype))
        buf = torch.empty(step, self.in_features, dtype=flat.dtype)
        y = flat.new_empty(flat.shape[0], n)
        for i in range(0, n, step):
            codes = self.q[i : i + step]
            torch.mm(flat, buf[: codes.shape[0]].copy_(codes).t(), out=y[:, i : i + step])
        return y.mul_(self.scales)

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
        """[M, K] -> [M, N'] by the dense matmul of `flat`'s dtype on the CPU-packed weight dequantised one
        slice of `dense_chunk_rows` output channels (whole blocks of 64) at a time into reused buffers. Per
        slice: the packed bytes are transposed to [K, nb, 32], the nibbles unpacked into [K, n] in int8 as
        c - 8 (xor 8, then arithmetic shifts), converted to the dtype (exact: |c - 8| <= 8), and one
        `addcmul` forms zero + (c - 8) * scale in float32 (a fused multiply-add: one rounding) and rounds it
        to the dtype. That is the kernel's rule (c - 8) * scale + zero in float32, rounded once more to a
        bf16 / fp16 activation's dtype: with scales in those dtypes the product is exact in float32 (4 by 8
        or 11 bits), so the weights equal the rule's evaluated op by op, bit for bit; with float32 scales the
        fused form is correctly rounded where op by op rounds twice (within an ulp of float32). Needs
        `cpu_int4_layout_known()`."""
        k, g, half = self.in_features, self.group, CPU_INT4_BLOCK // 2
        blocks = self.packed.view(-1, k, half)  # [N'/64, K, 32]: byte j holds rows j and j + 32
        step = min(blocks.shape[0], dense_chunk_rows(k, flat.shape[0], flat.dtype) // CPU_INT4_BLOCK)
        flipped = torch.empty(k, step, half, dtype=torch.uint8)
        nibbles = torch.empty(k, step, 2, half, dtype=torch.int8)  # [K, n]: rows j, then j + 32 of each block
        w = torch.empty(k, step * CPU_INT4_BLOCK, dtype=flat.dtype)
        y = flat.new_empty(flat.shape[0], blocks.shape[0] * CPU_INT4_BLOCK)
        for b in range(0, blocks.shape[0], step):
            src = blocks[b : b + step]
            nb = src.shape[0]
            n0, n = b * CPU_INT4_BLOCK, nb * CPU_INT4_BLOCK
            flip = flipped[:, :nb]
            flip.copy_(src.transpose(0, 1))  # the bytes in [K, nb, 32]
            flip.bitwise_xor_(0x88)  # c ^ 8 read as a signed nibble is c - 8
            codes = nibbles[:, :nb]
            # each nibble into the high half of its own byte (x 16 rather than << 4: torch's shift does not
            # vectorise into a strided output, 3.5x slower)
            torch.mul(flip, 16, out=codes[:, :, 0].view(torch.uint8))
            torch.bitwise_and(flip, 0xF0, out=codes[:, :, 1].view(torch.uint8))
            codes.bitwise_right_shift_(4)  # arithmetic: c - 8, sign-extended
            dense = w[:, :n]
            dense.copy_(codes.view(k, n))
            # contiguous per slice: addcmul's vectorised loop needs unit-stride operands (2048 x 2048 at one
            # thread: 1.5 ms, against 6.1 on the interleaved scale / zero views)
            sz = self.scales_and_zeros[:, n0 : n0 + n].to(flat.dtype)
            scale, zero = sz[..., 0].contiguous(), sz[..., 1].contiguous()
            grouped = dense.view(k // g, g, n)
            torch.addcmul(zero[:, None], grouped, scale[:, None], out=grouped)
            torch.mm(flat, dense, out=y[:, n0 : n0 + n])
        return y

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
