"""The CPU emulation of bfp8 / bfp4 against ttnn's own host packer: values bit for bit, packed bytes byte for byte.

The reference is `ttnn.to_torch(ttnn.from_torch(x, dtype=bfloat8_b|bfloat4_b, layout=TILE))` for values and the
payload of `ttnn.dump_tensor` for the packed tiles (ttnn 0.81.1 under the p150 mock descriptor). The cases cover
the corners of the format: zeros of both signs, float32 denormals inside and beside normal blocks, blocks at the
top and bottom of the exponent range, exact rounding ties, saturation, wide ranges inside one block, infinities
and NaN, arbitrary float32 bit patterns, shapes that are not whole tiles, vectors and batched tensors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from alpamayo.plan.block_float import FORMATS, pack_tiles, quantize, unpack_tiles
from alpamayo.plan.precision import BLOCK_FLOAT_ERROR, TILE_BYTES
from alpamayo.tt.ttnn_configs import ttnn_dtype

FMTS = tuple(FORMATS)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _ties(fmt: str) -> np.ndarray:
    """Every block holds its shared scale 1.0 and 15 values exactly halfway between two codes (both parities)."""
    w = FORMATS[fmt].mantissa_bits
    step = 2.0 ** (1 - w)
    half_steps = (np.arange(32 * 30) % (2 ** (w - 1))) * step + step / 2
    x = np.ones((32, 32), np.float32)
    x[:, [c for c in range(32) if c % 16]] = (1 + half_steps.reshape(32, 30)).astype(np.float32)
    return x * np.where(_rng(3).random((32, 32)) < 0.5, -1, 1).astype(np.float32)


def _random_bits(shape: tuple[int, ...], seed: int, finite: bool = True) -> np.ndarray:
    bits = _rng(seed).integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)
    if finite:
        bits = np.where((bits >> 23) & 0xFF == 0xFF, bits & np.uint32(0xBFFFFFFF), bits)
    return bits.view(np.float32)


def _mixed_exponents(shape: tuple[int, ...], seed: int, low: int, high: int) -> np.ndarray:
    """Signed values 2^e x [1, 2) with e uniform in [low, high]: every exponent field in range, no overflow."""
    r = _rng(seed)
    sign = np.where(r.random(shape) < 0.5, -1.0, 1.0)
    return (sign * r.uniform(1, 2, shape) * np.exp2(r.integers(low, high + 1, shape))).astype(np.float32)


CASES = {
    "gaussian": lambda fmt: _rng(0).standard_normal((64, 96)).astype(np.float32),
    "cauchy": lambda fmt: _rng(1).standard_cauchy((64, 64)).astype(np.float32),
    "wide range in a block": lambda fmt: _mixed_exponents((32, 64), 2, -40, 40),
    "zeros": lambda fmt: np.zeros((32, 32), np.float32),
    "negative zeros": lambda fmt: -np.zeros((32, 32), np.float32),
    "denormals only": lambda fmt: (_rng(4).standard_normal((32, 32)) * 1e-40).astype(np.float32),
    "denormals beside normals": lambda fmt: np.where(
        _rng(5).random((32, 32)) < 0.5,
        _rng(6).standard_normal((32, 32)) * 1e-40,
        _rng(7).standard_normal((32, 32)) * 1e-36,
    ).astype(np.float32),
    "tiny blocks": lambda fmt: _mixed_exponents((32, 32), 8, -126, -118),
    "huge blocks": lambda fmt: _mixed_exponents((32, 32), 9, 118, 127),
    "ties": _ties,
    "saturation": lambda fmt: (np.float32(2) - np.float32(2.0**-20)) * np.ones((32, 32), np.float32),
    "infinities": lambda fmt: (
        np.where(
            _rng(10).random((32, 32)) < 0.1, np.float32(np.inf), _rng(11).standard_normal((32, 32))
        ).astype(np.float32)
        * np.where(_rng(12).random((32, 32)) < 0.5, -1, 1).astype(np.float32)
    ),
    "random bit patterns": lambda fmt: _random_bits((96, 160), 13),
    "partial tiles": lambda fmt: _rng(14).standard_normal((5, 37)).astype(np.float32),
    "vector": lambda fmt: _rng(15).standard_normal(100).astype(np.float32),
    "batched": lambda fmt: _rng(16).standard_normal((2, 3, 40, 72)).astype(np.float32),
}


def _ttnn_round_trip(ttnn, x: np.ndarray, fmt: str) -> tuple[np.ndarray, bytes]:
    host = ttnn.from_torch(torch.from_numpy(x.copy()), dtype=ttnn_dtype(ttnn, fmt), layout=ttnn.TILE_LAYOUT)
    return ttnn.to_torch(host).numpy(), host


def _payload(ttnn, host, size: int, path: Path) -> bytes:
    """The last `size` bytes of the tensor's `.tensorbin` file: its packed tiles."""
    ttnn.dump_tensor(str(path), host)
    return path.read_bytes()[-size:]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("case", list(CASES))
def test_values_and_packed_tiles_match_ttnns_host_packer_bit_for_bit(ttnn_host, tmp_path, fmt, case):
    x = CASES[case](fmt)
    expected, host = _ttnn_round_trip(ttnn_host, x, fmt)
    assert _same_bits(quantize(x, fmt), expected)
    packed = pack_tiles(x, fmt)
    assert packed == _payload(ttnn_host, host, len(packed), tmp_path / "t.tensorbin")


@pytest.mark.parametrize("fmt", FMTS)
def test_bfloat16_sources_pack_as_ttnn_packs_them(ttnn_host, fmt):
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    dtype = ttnn_dtype(ttnn_host, fmt)
    expected = ttnn_host.to_torch(ttnn_host.from_torch(w, dtype=dtype, layout=ttnn_host.TILE_LAYOUT))
    assert _same_bits(quantize(w.float().numpy(), fmt), expected.numpy())


@pytest.mark.parametrize("fmt", FMTS)
def test_nan_stays_nan_where_ttnn_keeps_it(ttnn_host, fmt):
    x = _random_bits((32, 64), 17, finite=False)
    expected, _ = _ttnn_round_trip(ttnn_host, x, fmt)
    ours = quantize(x, fmt)
    assert np.array_equal(np.isnan(ours), np.isnan(expected))
    assert _same_bits(np.where(np.isnan(ours), 0, ours), np.where(np.isnan(expected), 0, expected))


@pytest.mark.parametrize("fmt", FMTS)
def test_unpacking_the_packed_tiles_gives_the_quantised_values(fmt):
    x = _mixed_exponents((3, 45, 70), 18, -8, 8)
    packed = pack_tiles(x, fmt)
    assert len(packed) == 3 * 2 * 3 * TILE_BYTES[fmt]  # 3 x (2 x 3 tiles) after padding to 64 x 96
    assert _same_bits(unpack_tiles(packed, x.shape, fmt), quantize(x, fmt))
    with pytest.raises(ValueError, match=r"do not hold shape \[3, 45, 70\]"):
        unpack_tiles(packed[:-1], x.shape, fmt)


@pytest.mark.parametrize("fmt", FMTS)
def test_quantising_twice_changes_nothing_and_the_error_stays_within_the_block_bound(fmt):
    x = _rng(19).standard_cauchy((64, 256)).astype(np.float32)
    q = quantize(x, fmt)
    assert _same_bits(quantize(q, fmt), q)
    block_max = np.abs(x).reshape(-1, 16).max(axis=1, keepdims=True)
    ratio = np.abs(q - x).reshape(-1, 16) / block_max
    assert ratio.max() <= BLOCK_FLOAT_ERROR[fmt]


def test_unknown_format_is_named():
    with pytest.raises(ValueError, match=r"unknown block-float format 'bfp2'; allowed: bfp8, bfp4"):
        quantize(np.zeros(4, np.float32), "bfp2")
