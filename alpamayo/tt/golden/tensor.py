"""The golden mode's tensors: host torch values that stand where ttnn device tensors would.

A `GoldenTensor` holds its logical value as a torch tensor and the metadata a ttnn tensor carries (dtype,
layout, memory config, padded shape, the device it is on or None on the host). Values are the ones the device
would store: `stored` rounds them to the tensor's dtype through ttnn's own host packing
(`ttnn.operations.golden_common.golden_to_output_dtype`: bfloat8_b / bfloat4_b through `ttnn.Tensor(...)
.to_torch()`, the path `ttnn.from_torch` packs weights with), and keeps them as float32 (the bf16, bfp8 and
bfp4 value sets are all exact in float32) or int64 for the integer dtypes, so every golden function computes
on exact device values in float32.

Padding: a TILE tensor's padded shape rounds its last two dimensions up to 32 unless an op set it (ttnn's
reshape with a padded shape, `sparse_matmul`'s 6-D output); the values past the logical shape are zero here
(on a card they are whatever the op left there: no product output may read them, and `GoldenTensor` never
does).
"""

from __future__ import annotations

from typing import Any

import torch

from alpamayo.plan.device_spec import TILE, round_up


def is_block_float(ttnn: Any, dtype: Any) -> bool:
    return dtype in (ttnn.bfloat8_b, ttnn.bfloat4_b)


def is_integer(ttnn: Any, dtype: Any) -> bool:
    return dtype in (ttnn.int32, ttnn.uint32, ttnn.uint16, ttnn.uint8)


def stored(ttnn: Any, value: torch.Tensor, dtype: Any) -> torch.Tensor:
    """`value` as a device tensor of `dtype` holds it: integers as int64, floats rounded to the dtype's value
    set (bf16; bfp8 / bfp4 through ttnn's host packer, shared exponents per 16 values of a tile row) and
    kept in float32."""
    from ttnn.operations.golden_common import golden_to_output_dtype

    if is_integer(ttnn, dtype):
        if value.is_floating_point():
            value = torch.trunc(value)
        return value.to(torch.int64)
    if is_block_float(ttnn, dtype):
        if value.numel() == 0:
            return value.float()
        return golden_to_output_dtype(value.float().contiguous(), dtype).float()
    if dtype == ttnn.bfloat16:
        return value.to(torch.bfloat16).float()
    if dtype == ttnn.float32:
        return value.float()
    raise TypeError(f"golden mode: no stored form for ttnn dtype {dtype}")


def host_dtype(ttnn: Any, dtype: Any) -> torch.dtype:
    """The torch dtype `ttnn.to_torch` returns for a ttnn dtype (bf16 -> bfloat16, bfp8/bfp4 -> float32...)."""
    return ttnn.ttnn_dtype_to_torch_dtype(dtype)


class GoldenTensor:
    """A ttnn tensor of the golden mode (see the module docstring). `device` is None on the host."""

    __slots__ = ("_padded", "_ttnn", "device", "dtype", "freed", "layout", "mem", "value")

    def __init__(
        self,
        ttnn: Any,
        value: torch.Tensor,
        dtype: Any,
        layout: Any,
        mem: Any = None,
        device: Any = None,
        padded: tuple[int, ...] | None = None,
        exact: bool = False,
    ):
        """`value` is rounded to `dtype` unless `exact` (already a stored form of it)."""
        self._ttnn = ttnn
        self.value = value if exact else stored(ttnn, value, dtype)
        self.dtype, self.layout, self.mem, self.device = dtype, layout, mem, device
        self.freed = False
        self._padded = padded

    # ------------------------------------------------------------------ what a ttnn tensor answers
    @property
    def shape(self) -> Any:
        return self._ttnn.Shape(list(self.value.shape))

    @property
    def padded_shape(self) -> Any:
        return self._ttnn.Shape(list(self.padded))

    @property
    def padded(self) -> tuple[int, ...]:
        """The padded shape as a tuple: an op's if it set one, else the tile-rounded logical shape."""
        if self._padded is not None:
            return self._padded
        return tile_padded(self._ttnn, tuple(self.value.shape), self.layout)

    def memory_config(self) -> Any:
        if self.mem is None:
            raise RuntimeError("golden mode: a host tensor has no memory config")
        return self.mem

    def is_allocated(self) -> bool:
        return not self.freed

    def storage_type(self) -> Any:
        return self._ttnn.StorageType.DEVICE if self.device is not None else self._ttnn.StorageType.HOST

    def __repr__(self) -> str:
        where = "host" if self.device is None else f"{self.mem.memory_layout}/{self.mem.buffer_type}"
        return (
            f"GoldenTensor(shape={list(self.value.shape)}, padded={list(self.padded)}, {self.dtype}, "
            f"{self.layout}, {where}{', freed' if self.freed else ''})"
        )


def tile_padded(ttnn: Any, shape: tuple[int, ...], layout: Any) -> tuple[int, ...]:
    """`shape` with its last two dimensions rounded up to whole tiles for TILE layout, as ttnn pads it."""
    if layout != ttnn.TILE_LAYOUT or not shape:
        return shape
    if len(shape) == 1:
        return (round_up(shape[0], TILE),)
    return (*shape[:-2], round_up(shape[-2], TILE), round_up(shape[-1], TILE))
