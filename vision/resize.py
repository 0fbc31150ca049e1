"""Image resize that reproduces Pillow's `Image.resize` (what transformers' PIL image processor calls).

Pillow resamples in two separable passes over uint8 pixels (fixed-point weights with 22 fractional bits,
rounded and clipped to uint8 after each pass). Two paths produce that result here:

* **torch** (`F.interpolate(..., antialias=True)` on uint8): the Pillow-SIMD algorithm (int16 weights),
  run in Pillow's pass order. It is ~9x faster than Pillow on a 1080x1920 -> 320x576 camera frame
  (1.7 vs 15 ms, 2 cores). Its coarser weights move a few pixels by one level (0.3% of the pixels of the
  Alpamayo frame). Measured on 300 random downscales of noise, binary and smooth images: never more than
  one level where both axes shrink by >= 1.5x (250 cases, 160 of them >= 2x); two levels in 4 of the 50
  milder ones, and on upscales.
* **pillow**: Pillow itself, bit-identical to transformers, used everywhere else (upscales of small
  images, mild downscales, filters torch has no antialiased kernel for).

So the fast path is taken only where it measured within one level, with margin: both axes shrink by at least
`FAST_MIN_SHRINK`.

`resize_float` is the other processor's resize, transformers' torchvision one fed float32 images (Alpamayo 2
Super): torchvision's `resize` on a float tensor is `F.interpolate` in float32, antialiased for bilinear and
bicubic, with nothing rounded or clamped.
"""

from __future__ import annotations

import warnings

import numpy as np
import PIL
import torch
import torch.nn.functional as F
from PIL import Image

# PIL resample ids (`PIL.Image.Resampling`) that torch has an antialiased uint8 kernel for.
TORCH_MODES = {2: "bilinear", 3: "bicubic"}
PIL_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
# PIL resample ids -> the `F.interpolate` mode torchvision resizes a float tensor with, as transformers maps
# them (`pil_torch_interpolation_mapping`: NEAREST -> NEAREST_EXACT); lanczos, box and hamming have no tensor
# kernel in the torchvision NVIDIA's Super code pins (0.23).
FLOAT_MODES = {0: "nearest-exact", 2: "bilinear", 3: "bicubic"}
FAST_MIN_SHRINK = 2.0
# Pillow 13 runs the vertical pass first when the height shrinks by more than twice as many pixels as the
# width (Resample.c, ImagingResampleInner); earlier versions always run the horizontal pass first. The
# order matters because the intermediate image is rounded and clipped to uint8.
_PILLOW_VERTICAL_FIRST = int(PIL.__version__.split(".")[0]) >= 13


def uses_fast_path(size: tuple[int, int], target: tuple[int, int], resample: int) -> bool:
    """True when `resize` runs torch's kernel for (height, width) `size` -> `target` (see module docstring)."""
    (h, w), (th, tw) = size, target
    return resample in TORCH_MODES and h >= FAST_MIN_SHRINK * th and w >= FAST_MIN_SHRINK * tw


def _vertical_first(size: tuple[int, int], target: tuple[int, int]) -> bool:
    (h, w), (th, tw) = size, target
    return _PILLOW_VERTICAL_FIRST and h - th > 0 and h - th > 2 * (w - tw)


def _readonly_tensor(array: np.ndarray) -> torch.Tensor:
    """Tensor view of an array we only read: it may be read-only (a received message buffer) and is copied
    only if it has negative strides (`rgb[..., ::-1]`), which torch cannot view."""
    if any(stride < 0 for stride in array.strides):
        array = np.ascontiguousarray(array)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def resize(image: np.ndarray, target: tuple[int, int], resample: int) -> np.ndarray:
    """uint8 [H, W, 3] (channels independent, any order) -> uint8 [3, h, w] for `target` = (h, w).

    Returns a view of `image` when the size already matches (Pillow copies the pixels unchanged).
    """
    if resample not in PIL_FILTERS:
        raise ValueError(f"resample must be a PIL filter id in {sorted(PIL_FILTERS)}, got {resample}")
    size = image.shape[:2]
    if tuple(size) == tuple(target):
        return image.transpose(2, 0, 1)
    if not uses_fast_path(size, target, resample):
        resized = Image.fromarray(np.ascontiguousarray(image)).resize(target[::-1], resample=resample)
        return np.asarray(resized).transpose(2, 0, 1)
    x = _readonly_tensor(image).permute(2, 0, 1).unsqueeze(0)  # [1, 3, H, W], channels-last memory
    mode = TORCH_MODES[resample]
    if _vertical_first(size, target):
        x = F.interpolate(x, size=(target[0], size[1]), mode=mode, antialias=True)
    # torch's 2-D kernel runs the horizontal pass first, as Pillow does in every other case
    return F.interpolate(x, size=target, mode=mode, antialias=True)[0].numpy()


def resize_float(image: np.ndarray, target: tuple[int, int], resample: int) -> torch.Tensor:
    """uint8 [H, W, 3] -> float32 [3, h, w] for `target` = (h, w): x / 255 in float32, then resized in float32
    as torchvision resizes a float tensor (`F.interpolate`, antialiased for bilinear and bicubic; nothing
    rounded or clamped, so bicubic overshoot leaves [0, 1]). A tensor view of the frame's channels-last memory
    goes in; the result is bit-identical to resizing a contiguous copy (measured: max difference 0)."""
    if resample not in FLOAT_MODES:
        raise ValueError(
            f"resample {resample} ({PIL_FILTERS.get(resample, '?')}) has no float resize; torchvision resizes "
            f"float images with {sorted(FLOAT_MODES)} ({', '.join(FLOAT_MODES.values())})"
        )
    # one pass: uint8 -> float32 and the division (the same float32 quotient as `.float() / 255.0`)
    x = torch.div(_readonly_tensor(image).permute(2, 0, 1), 255.0)
    if tuple(image.shape[:2]) == tuple(target):
        return x
    mode = FLOAT_MODES[resample]
    smooth = mode in ("bilinear", "bicubic")  # torchvision antialiases (and aligns no corners) only these
    return F.interpolate(
        x[None], size=target, mode=mode, align_corners=False if smooth else None, antialias=smooth
    )[0]
