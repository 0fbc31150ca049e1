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
    """cpu or cuda[:N]; a clear error when CUDA is asked for but absent."""
    device = torch.device(name)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name}: supported devices are cpu and cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name}: CUDA is not available on this machine")
    return device
