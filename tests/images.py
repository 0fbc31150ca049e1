"""Synthetic camera-like test images: smooth gradients, hard-edged squares near black and white, sensor noise."""

from __future__ import annotations

import numpy as np


def synthetic_frame(height: int, width: int, seed: int = 0) -> np.ndarray:
    """uint8 [height, width, 3] RGB: colour ramps, a 0/255 checkerboard (edges where bicubic overshoot clips)
    and Gaussian noise (sigma 20 levels)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    checker = ((xx // 16 + yy // 16) % 2) * 255.0
    base = np.stack([xx * 255 / max(width - 1, 1), yy * 255 / max(height - 1, 1), checker], axis=-1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def noise_frame(height: int, width: int, seed: int = 0) -> np.ndarray:
    """uint8 [height, width, 3] uniform noise: the worst case for resize rounding differences."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
