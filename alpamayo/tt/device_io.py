"""Host <-> device copies shared by the ttnn models (text backbone, vision tower, MoE block).

`DeviceIO` is a mixin for a class holding `ttnn` (the module), `device` and `tracer`: uploads and downloads are
timed as the profiling stages `tt.host_to_device` and `tt.device_to_host`. `TensorGroup` is the base of the
dataclasses that hold a model's device tensors (weights, persistent inputs), `opened` guards them after close.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

import torch

from alpamayo.profiling import Tracer

# A ttnn.Tensor on the device (ttnn is imported lazily and ships no type stubs).
DeviceTensor = Any

V = TypeVar("V")


class TensorGroup:
    """A dataclass whose fields hold tensors: `tensors()` lists them in field order, through lists, tuples and
    nested groups (anything with its own `tensors()`), skipping None (an absent optional tensor)."""

    def tensors(self) -> list[Any]:
        out: list[Any] = []
        for f in fields(self):  # type: ignore[arg-type]  # subclasses are dataclasses
            _collect(getattr(self, f.name), out)
        return out


def _collect(value: Any, out: list[Any]) -> None:
    if value is None:
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, out)
    elif callable(getattr(value, "tensors", None)):
        out += value.tensors()
    else:
        out.append(value)


def opened(held: V | None, owner: str) -> V:
    """`held` (a model's device tensors), refused once its `owner` has closed and freed them (None)."""
    if held is None:
        raise RuntimeError(f"{owner} is closed: its device tensors are freed")
    return held


class DeviceIO:
    ttnn: Any
    device: Any
    tracer: Tracer

    def upload(self, t: torch.Tensor, dtype: Any = None, layout: Any = None, memory: Any = None) -> Any:
        """Host tensor -> device tensor: bf16 TILE in interleaved DRAM unless told otherwise."""
        ttnn = self.ttnn
        with self.tracer.span("tt.host_to_device"):
            return ttnn.from_torch(
                t.to(torch.bfloat16) if dtype is None else t,
                dtype=dtype or ttnn.bfloat16,
                layout=layout or ttnn.TILE_LAYOUT,
                device=self.device,
                memory_config=memory or ttnn.DRAM_MEMORY_CONFIG,
            )

    def upload_rows(self, rows: torch.Tensor, padded_rows: int, width: int, memory: Any = None) -> Any:
        """Host rows [N, W] zero-padded to [1, 1, padded_rows, width] bf16 on the device."""
        x = torch.zeros(1, 1, padded_rows, width, dtype=torch.bfloat16)
        x[0, 0, : rows.shape[0], : rows.shape[1]] = rows.to(torch.bfloat16)
        return self.upload(x, memory=memory)

    def download(self, t: Any) -> torch.Tensor:
        with self.tracer.span("tt.device_to_host"):
            return self.ttnn.to_torch(t)

    def free(self, *tensors: Any) -> None:
        for t in tensors:
            self.ttnn.deallocate(t)
