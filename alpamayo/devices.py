"""Names of the torch dtypes and devices the CLI, runtime and benchmarks accept."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype, or its name ("float32", "bfloat16")."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def resolve_device(name: str | torch.device) -> torch.device:
    """cpu or cuda[:N]; a clear error for any other name, or when the CUDA device asked for is absent."""
    unsupported = ValueError(f"device {name}: supported devices are cpu and cuda[:N]")
    try:
        device = torch.device(name)
    except RuntimeError:  # torch's message lists every device type it knows, not the two we run on
        raise unsupported from None
    if device.type not in ("cpu", "cuda"):
        raise unsupported
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name}: CUDA is not available on this machine")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"device {name}: CUDA device index must be in [0, {count})")
    return device
