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


def lying_jpeg(width: int, height: int, seed: int = 0) -> bytes:
    """A JPEG of 1.8 KB (a 48x40 noise image at quality 75) whose SOF header claims `width` x `height`: a
    decompression bomb. Pillow decodes it without complaint (libjpeg pads the missing blocks, warning only),
    to width * height * 3 bytes (24.9 MB at 3840x2160)."""
    from io import BytesIO

    from PIL import Image

    buf = BytesIO()
    Image.fromarray(noise_frame(40, 48, seed)).save(buf, format="JPEG", quality=75)
    data = bytearray(buf.getvalue())
    i = 2  # after SOI: walk the marker segments to the frame header (SOF0..SOF2)
    while data[i + 1] not in (0xC0, 0xC1, 0xC2):
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    data[i + 5 : i + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


def broken_table_jpeg(jpeg: bytes) -> bytes:
    """`jpeg` with its first Huffman table's count of 1-bit codes set to 255 (at most 2 can exist): every
    marker and length still checks out, and Pillow fails with "broken data stream" when decoding."""
    data = bytearray(jpeg)
    data[data.index(b"\xff\xc4") + 5] = 0xFF  # FF C4, length (2 bytes), class/id, then the 16 counts
    return bytes(data)
