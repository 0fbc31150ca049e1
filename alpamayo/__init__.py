"""alpamayo-tt: an Alpamayo-style driving VLA on a Qwen3-VL backbone.

Torch reference backend (CPU/CUDA, the oracle) and a ttnn backend for one Tenstorrent Blackhole p150.
"""

from alpamayo.reproducibility import process

# MKL's environment and its first vector-math call, before torch loads MKL (see the module).
process.prepare()

from alpamayo.errors import CheckpointError, ConfigError  # noqa: E402

__all__ = ["CheckpointError", "ConfigError"]
__version__ = "0.1.0"
