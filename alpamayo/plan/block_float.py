"""Blackhole's block-float weight formats, bfp8 and bfp4, emulated on the CPU (numpy only; no ttnn).

The device stores a matrix in 32x32 tiles, each split into four 16x16 faces. Every row of a face (16
consecutive values of one matrix row, starting at a column multiple of 16) shares one 8-bit exponent; each
value keeps a sign bit and a W-bit magnitude (W = 7 for bfp8, 3 for bfp4) that includes the leading one.

Packing one 16-value block (ttnn's host packer, `convert_u32_to_bfp`, reproduced bit for bit):
  * shared exponent = the largest float32 exponent field in the block;
  * an element with exponent field 0 (zero or float32 denormal) packs as 0;
  * otherwise its 24-bit significand (implicit one restored) is shifted right by (shared - own exponent),
    the bits shifted out are dropped, and the result is rounded to W bits: to nearest, ties to even, on
    the bits below the W kept ones; a round-up past 2^W - 1 saturates there (the exponent is not bumped);
  * a magnitude of 0 loses its sign.
Unpacking normalises the magnitude (shift left until bit W-1 is set, exponent lowered by the shift) and
flushes a value whose exponent would fall to 0 or below to +0.

So a block's largest element keeps W significant bits and an element 2^d times smaller keeps W - d: every
element is within half a step of the shared scale, 2^-W of the block's largest magnitude
(`alpamayo.plan.precision.BLOCK_FLOAT_ERROR`). Zero padding to whole tiles never changes a block's exponent.

Tile bytes (what `.tensorbin` payloads hold): the 64 shared exponents of a tile (face 0 rows 0..15, then
faces 1, 2, 3; faces in row-major order within the tile), then the four faces' sign+magnitude codes,
row-major within a face; bfp8 is one byte per value, bfp4 two values per byte (first in the low nibble).
Tiles follow each other in row-major tile order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from alpamayo.plan.device_spec import TILE, round_up

FACE = 16
BLOCK = 16  # values sharing an exponent: one face row
_CHUNK = 1 << 22  # values quantised per vectorised step (bounds the uint32 temporaries to ~16 MB each)


@dataclass(frozen=True)
class BlockFormat:
    """A block-float format: `mantissa_bits` (leading one included) plus a sign bit per value."""

    name: str
    mantissa_bits: int

    @property
    def code_bits(self) -> int:
        return self.mantissa_bits + 1

    @property
    def tile_bytes(self) -> int:
        """Bytes of one packed 32x32 tile: 64 exponent bytes plus 1024 codes."""
        return TILE * TILE // BLOCK + TILE * TILE * self.code_bits // 8


FORMATS = {"bfp8": BlockFormat("bfp8", 7), "bfp4": BlockFormat("bfp4", 3)}


def block_format(name: str) -> BlockFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown block-float format {name!r}; allowed: {', '.join(FORMATS)}")
    return FORMATS[name]


def _as_matrix(x: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
    """float32 `x` ([..., R, C]; a vector is one row) zero-padded to whole tiles, as [rows, C_p]; (R, C)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise ValueError("block-float packing needs at least one dimension, got a scalar")
    if x.ndim == 1:
        x = x[None]
    r, c = x.shape[-2:]
    rp, cp = round_up(r, TILE), round_up(c, TILE)
    padded = np.zeros((*x.shape[:-2], rp, cp), np.float32)
    padded[..., :r, :c] = x
    return padded.reshape(-1, cp), (r, c)


def _encode(blocks: np.ndarray, fmt: BlockFormat) -> tuple[np.ndarray, np.ndarray]:
    """uint32 bit patterns [n, 16] -> (shared exponents [n, 1], sign/magnitude codes [n, 16]) as uint32."""
    w = fmt.mantissa_bits
    exp = (blocks >> 23) & 0xFF
    shared = exp.max(axis=1, keepdims=True)
    significand = (blocks & 0x7FFFFF) | (1 << 23)
    diff = shared - exp  # >= 0; a shift of 24 or more leaves nothing of a 24-bit significand
    significand = np.where(diff >= 24, 0, significand >> np.minimum(diff, 23))
    drop = 24 - w
    rest = significand & ((1 << drop) - 1)
    magnitude = significand >> drop
    half = 1 << (drop - 1)
    up = (rest > half) | ((rest == half) & ((magnitude & 1) == 1))
    magnitude = np.minimum(magnitude + up, (1 << w) - 1)
    magnitude = np.where(exp == 0, 0, magnitude)
    sign = np.where(magnitude == 0, 0, blocks >> 31)
    return shared, (sign << w) | magnitude


def _decode(shared: np.ndarray, codes: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """(shared exponents [n, 1], codes [n, 16]) -> float32 bit patterns [n, 16] as uint32."""
    w = fmt.mantissa_bits
    sign = codes >> w
    magnitude = codes & ((1 << w) - 1)
    top = np.zeros_like(magnitude)  # index of the highest set bit
    for bit in range(1, w):
        top = np.where((magnitude >> bit) & 1, bit, top)
    shift = (w - 1) - top
    fraction = (magnitude << (shift + 1)) & ((1 << w) - 1)
    exp = shared.astype(np.int64) - shift.astype(np.int64)
    bits = (sign << 31) | (np.clip(exp, 0, 255).astype(np.uint32) << 23) | (fraction << (23 - w))
    return np.where((magnitude == 0) | (exp <= 0), 0, bits).astype(np.uint32)


def quantize(x: np.ndarray, fmt: str) -> np.ndarray:
    """`x` as the device holds it in `fmt` (float32, same shape): what ttnn's host packer then `to_torch`
    give for a TILE tensor. The last dimension is the one blocks run along (for a `[K, N]` weight: N)."""
    f = block_format(fmt)
    src = np.asarray(x, dtype=np.float32)
    matrix, (r, c) = _as_matrix(src)
    flat = matrix.view(np.uint32).reshape(-1, BLOCK)
    out = np.empty_like(flat)
    step = _CHUNK // BLOCK
    for start in range(0, flat.shape[0], step):
        shared, codes = _encode(flat[start : start + step], f)
        out[start : start + step] = _decode(shared, codes, f)
    rows = matrix.shape[0] // round_up(r, TILE)
    result = out.view(np.float32).reshape(rows, -1, matrix.shape[1])[:, :r, :c]
    return result.reshape(src.shape)


def pack_tiles(x: np.ndarray, fmt: str) -> bytes:
    """The device bytes of `x` ([..., R, C], zero-padded to whole tiles) in `fmt` (see module docstring)."""
    f = block_format(fmt)
    matrix, _ = _as_matrix(x)
    shared, codes = _encode(matrix.view(np.uint32).reshape(-1, BLOCK), f)
    tr, tc = matrix.shape[0] // TILE, matrix.shape[1] // TILE
    # (tile row, face row, row in face, tile col, face col[, col in face]) -> tile-major, face-major order
    exps = shared.reshape(tr, 2, FACE, tc, 2).transpose(0, 3, 1, 4, 2).reshape(tr * tc, -1)
    data = codes.reshape(tr, 2, FACE, tc, 2, FACE).transpose(0, 3, 1, 4, 2, 5).reshape(tr * tc, -1)
    if f.code_bits == 4:
        data = data[:, 0::2] | (data[:, 1::2] << 4)
    return np.concatenate([exps, data], axis=1).astype(np.uint8).tobytes()


def unpack_tiles(data: bytes, shape: tuple[int, ...], fmt: str) -> np.ndarray:
    """Inverse of `pack_tiles`: float32 values of `shape` from the packed tiles of its padded matrix."""
    f = block_format(fmt)
    dims = (1, *shape) if len(shape) == 1 else tuple(shape)
    r, c = dims[-2:]
    rp, cp = round_up(r, TILE), round_up(c, TILE)
    outer = int(np.prod(dims[:-2], dtype=np.int64))
    tr, tc = outer * rp // TILE, cp // TILE
    raw = np.frombuffer(data, np.uint8)
    if raw.size != tr * tc * f.tile_bytes:
        raise ValueError(
            f"{raw.size} bytes do not hold shape {list(shape)} in {fmt}: expected {tr * tc} tiles of "
            f"{f.tile_bytes} bytes"
        )
    tiles = raw.reshape(tr * tc, f.tile_bytes).astype(np.uint32)
    exps, codes = tiles[:, : TILE * TILE // BLOCK], tiles[:, TILE * TILE // BLOCK :]
    if f.code_bits == 4:
        codes = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(tr * tc, -1)
    shared = exps.reshape(tr, tc, 2, 2, FACE).transpose(0, 2, 4, 1, 3).reshape(-1, 1)
    grid = codes.reshape(tr, tc, 2, 2, FACE, FACE).transpose(0, 2, 4, 1, 3, 5).reshape(-1, BLOCK)
    values = _decode(shared, grid, f).view(np.float32).reshape(outer, rp, cp)[:, :r, :c]
    return values.reshape(shape)
