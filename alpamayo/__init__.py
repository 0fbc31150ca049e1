"""alpamayo-tt: an Alpamayo-style driving VLA on a Qwen3-VL backbone.

Torch reference backend (CPU/CUDA, the oracle) and a ttnn backend for one Tenstorrent Blackhole p150.
"""

import os

# MKL's float32 GEMM picks code paths by memory alignment, so the same weights loaded at other addresses gave
# logits differing by up to 3.6e-7 (measured on the golden checkpoints). Conditional numerical reproducibility
# makes runs bit-identical on one machine (lock-step replay relies on it). It must be set before MKL loads.
os.environ.setdefault("MKL_CBWR", "AUTO")

from alpamayo.errors import CheckpointError, ConfigError

__all__ = ["CheckpointError", "ConfigError"]
__version__ = "0.1.0"
