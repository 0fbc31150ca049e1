"""Qwen3-VL image preprocessing: camera frames -> `pixel_values` patches and `image_grid_thw`.

Same result as transformers' `Qwen2VLImageProcessorPil` (which Qwen3-VL uses) configured from the
checkpoint's `preprocessor_config.json`:
  1. `smart_resize`: the nearest size that is a multiple of `patch_size * merge_size` (32) with
     min_pixels <= h * w <= max_pixels (Alpamayo: 163840..196608, so 1080x1920 -> 320x576, 180 tokens);
  2. resize (Pillow-compatible, see `vision.resize`);
  3. rescale (x / 255, computed in float64 then rounded to float32) and normalise ((x - mean) / std in
     float32), the exact operations transformers runs (tabulated per uint8 level), so images that need no
     resize match bit for bit;
  4. the image is repeated `temporal_patch_size` (2) times and cut into 16x16 patches in merge-block-major
     order: row = (block_row, block_col, row_in_block, col_in_block), each row laid out (C, T, P, P).

Everything after the uint8 resize is one reorder and one table lookup over the small resized image.

Float input (`PreprocessConfig.float_input`, Alpamayo 2 Super): NVIDIA's Super helper hands the processor
float32 images already divided by 255, with `do_rescale=False`, and its processor is transformers' torchvision
one. Steps 2 and 3 then become: x = uint8 / 255 in float32; antialiased `F.interpolate` in float32 (what
torchvision's resize runs on a float tensor: no rounding to uint8, no clamp, so bicubic overshoot survives and
normalised values reach about +-1.11); (x - mean) / std. The result is bit for bit the torchvision processor's.
A 1080x1920 frame takes about 60 ms (the float resize over the full frame) where the uint8 path takes 2 ms.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from alpamayo.errors import ConfigError
from alpamayo.json_fields import Fields, read_json
from vision.resize import FLOAT_MODES, PIL_FILTERS, resize, resize_float

PREPROCESSOR_FILE = "preprocessor_config.json"
MAX_ASPECT_RATIO = 200
CHANNEL_ORDERS = ("RGB", "BGR")
ImageInput = np.ndarray | Image.Image


@dataclass(frozen=True)
class PreprocessConfig:
    """Image preprocessing settings; the defaults are Qwen3-VL's published `preprocessor_config.json`."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    min_pixels: int = 65536  # `size.shortest_edge`: 64 merged tokens
    max_pixels: int = 16777216  # `size.longest_edge`: 16384 merged tokens
    resample: int = 3  # PIL filter id: bicubic
    rescale_factor: float = 1 / 255
    do_rescale: bool = True
    do_normalize: bool = True
    # Images reach the processor as float32 x / 255 with do_rescale off (Alpamayo 2 Super; module docstring).
    float_input: bool = False

    @property
    def factor(self) -> int:
        """Image sides are multiples of this many pixels (one merged token covers factor x factor)."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size**2

    @classmethod
    def from_checkpoint(cls, directory: str | Path) -> PreprocessConfig:
        """Read `preprocessor_config.json` from a checkpoint directory (Qwen3-VL defaults if it is absent).

        Pixel bounds may be spelled `size: {shortest_edge, longest_edge}` or `min_pixels` / `max_pixels`;
        the latter win when both are present, as in transformers.
        """
        path = Path(directory) / PREPROCESSOR_FILE
        if not path.is_file():
            return cls()
        return cls.from_dict(read_json(path), str(path))

    @classmethod
    def from_dict(cls, raw: dict, source: str = PREPROCESSOR_FILE) -> PreprocessConfig:
        """Parse the JSON object of a `preprocessor_config.json`; errors name `source` and the field."""
        f = Fields(raw, "", source)
        d = cls()
        if not f.bool("do_resize", True):
            raise ConfigError(f"{source}: 'do_resize' = false is not supported (images must be resized)")
        size = f.optional_sub("size")
        cfg = cls(
            patch_size=f.int("patch_size", d.patch_size),
            merge_size=f.int("merge_size", d.merge_size),
            temporal_patch_size=f.int("temporal_patch_size", d.temporal_patch_size),
            image_mean=f.numbers("image_mean", d.image_mean),
            image_std=f.numbers("image_std", d.image_std, positive=True),
            min_pixels=f.int("min_pixels", size.int("shortest_edge", d.min_pixels)),
            max_pixels=f.int("max_pixels", size.int("longest_edge", d.max_pixels)),
            resample=f.int("resample", d.resample, minimum=0),
            rescale_factor=f.number("rescale_factor", d.rescale_factor, positive=True),
            do_rescale=f.bool("do_rescale", True),
            do_normalize=f.bool("do_normalize", True),
        )
        if cfg.resample not in PIL_FILTERS:
            raise ConfigError(
                f"{source}: 'resample' = {cfg.resample} is not a PIL filter id; allowed: {PIL_FILTERS}"
            )
        return cfg._checked_bounds(source)

    def with_pixel_bounds(self, raw: dict, source: str) -> PreprocessConfig:
        """These settings with `min_pixels` / `max_pixels` replaced where the JSON object `raw` sets them.

        An Alpamayo `config.json` carries both at top level (`ReasoningVLAConfig`) and Alpamayo passes them to
        its image processor as keyword overrides, so they win over `preprocessor_config.json` and over
        Qwen3-VL's defaults: without them a 1080x1920 frame becomes 1088x1920 (2040 tokens), not 320x576 (180).
        """
        f = Fields(raw, "", source)
        bounds = dict(
            min_pixels=f.int("min_pixels", self.min_pixels), max_pixels=f.int("max_pixels", self.max_pixels)
        )
        return replace(self, **bounds)._checked_bounds(source)

    def with_float_input(self, source: str) -> PreprocessConfig:
        """These settings for images given as float32 x / 255 (`float_input`, Alpamayo 2 Super); ConfigError
        naming `source` when the resample filter has no float resize (torchvision's, `vision.resize`)."""
        if self.resample not in FLOAT_MODES:
            raise ConfigError(
                f"{source}: 'resample' = {self.resample} ({PIL_FILTERS[self.resample]}) cannot resize the float "
                f"images this model's processor is given; allowed: {sorted(FLOAT_MODES)}"
            )
        return replace(self, float_input=True)

    def _checked_bounds(self, source: str) -> PreprocessConfig:
        if self.min_pixels > self.max_pixels:
            raise ConfigError(
                f"{source}: min_pixels {self.min_pixels} must be <= max_pixels {self.max_pixels}"
            )
        return self


def check_image_size(height: int, width: int) -> None:
    """Raise ValueError unless a height x width image can be preprocessed: at least 1x1 pixels, aspect ratio
    (long side / short side) at most `MAX_ASPECT_RATIO`, as transformers requires."""
    if min(height, width) < 1:
        raise ValueError(f"image size must be at least 1x1 pixels, got {height}x{width}")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise ValueError(
            f"image {height}x{width} has aspect ratio {ratio:.1f}; at most {MAX_ASPECT_RATIO} is supported"
        )


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) -> the size transformers resizes to: multiples of `factor`, area in [min, max] pixels.

    Sides round to the nearest multiple with Python's round (half to even: 48 -> 64, 80 -> 64); an area above
    `max_pixels` scales both sides down (floor), one below `min_pixels` scales them up (ceil), keeping the
    aspect ratio as closely as the factor allows.
    """
    check_image_size(height, width)
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def rgb_array(image: ImageInput, index: int = 0) -> np.ndarray:
    """uint8 [H, W, 3] in the caller's channel order (PIL images become RGB, transparency over white, as
    transformers converts them); errors name the image as `image {index}`."""
    if isinstance(image, Image.Image):
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            image = Image.alpha_composite(white, rgba)
        array = np.array(image.convert("RGB"))
    elif isinstance(image, np.ndarray):
        array = image
    else:
        raise ValueError(f"image {index}: expected a numpy array or a PIL image, got {type(image).__name__}")
    if array.dtype != np.uint8:
        raise ValueError(f"image {index}: expected dtype uint8 (0..255), got {array.dtype}")
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"image {index}: expected shape [H, W, 3], got {list(array.shape)}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"image {index}: empty image of shape {list(array.shape)}")
    return array


@functools.lru_cache(maxsize=8)
def _level_table(cfg: PreprocessConfig) -> np.ndarray:
    """[3, 256] float32: the value each uint8 level of each channel becomes, computed with exactly
    transformers' operations (x * rescale_factor in float64 rounded to float32, then (x - mean) / std in
    float32), so a lookup reproduces them bit for bit."""
    levels = np.arange(256, dtype=np.float64)
    x = (levels * cfg.rescale_factor).astype(np.float32) if cfg.do_rescale else levels.astype(np.float32)
    x = np.broadcast_to(x, (3, 256))
    if cfg.do_normalize:
        mean, std = np.array(cfg.image_mean, np.float32), np.array(cfg.image_std, np.float32)
        x = (x - mean[:, None]) / std[:, None]
    return np.ascontiguousarray(x)


def _patchify_into(out: np.ndarray, image: np.ndarray, cfg: PreprocessConfig) -> None:
    """uint8 [3, H, W] -> `out` [gh * gw, 3 * T * P * P] in merge-block-major patch order, image repeated T times.

    Runs single-threaded in numpy: the same steps as torch elementwise ops took up to 60 ms instead of 0.5 ms
    when other processes loaded the 2 cores (OpenMP threads waiting on each other); numpy takes 0.9 ms.
    """
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    _, height, width = image.shape
    gh, gw = height // p, width // p
    levels = (
        image.reshape(3, gh // m, m, p, gw // m, m, p)
        .transpose(1, 4, 2, 5, 0, 3, 6)
        .reshape(gh * gw, 3, p * p)
    )
    rows = out.reshape(gh * gw, 3, t, p * p)
    table = _level_table(cfg)
    for c in range(3):
        # levels are 0..255 so "clip" never clips; it skips the buffered copy numpy makes for mode="raise"
        np.take(table[c], levels[:, c], out=rows[:, c, 0], mode="clip")
    rows[:, :, 1:] = rows[:, :, :1]


def _patchify_float_into(out: np.ndarray, image: torch.Tensor, cfg: PreprocessConfig) -> None:
    """float32 [3, H, W] (x / 255, resized) -> `out` as `_patchify_into` lays it out, after (x - mean) / std in
    float32 (torchvision's `normalize`, the same operations on the same operands)."""
    if cfg.do_normalize:
        mean = torch.tensor(cfg.image_mean, dtype=torch.float32).view(3, 1, 1)
        std = torch.tensor(cfg.image_std, dtype=torch.float32).view(3, 1, 1)
        image = (image - mean) / std
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    _, height, width = image.shape
    gh, gw = height // p, width // p
    values = (
        image.numpy()
        .reshape(3, gh // m, m, p, gw // m, m, p)
        .transpose(1, 4, 2, 5, 0, 3, 6)
        .reshape(gh * gw, 3, p * p)
    )
    rows = out.reshape(gh * gw, 3, t, p * p)
    rows[:, :, 0] = values
    rows[:, :, 1:] = rows[:, :, :1]


def preprocess_images(
    images: Sequence[ImageInput], cfg: PreprocessConfig, channel_order: str = "RGB"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images -> (pixel_values [N, 3 * T * P * P] float32, image_grid_thw [n_images, 3] int64).

    images: numpy uint8 [H, W, 3] arrays in `channel_order` ("RGB", or "BGR" as OpenCV and most camera
    drivers deliver), or PIL images (any mode; converted to RGB, `channel_order` does not apply to them).
    Image i contributes grid_thw[i] = (1, h / P, w / P) patch rows, concatenated in input order;
    it becomes h * w / (P * merge)^2 tokens in the language model. With `cfg.float_input` each image is
    resized as float32 x / 255 (module docstring), else as uint8.
    """
    if channel_order not in CHANNEL_ORDERS:
        raise ValueError(f"channel_order must be one of {CHANNEL_ORDERS}, got {channel_order!r}")
    if isinstance(images, (np.ndarray, Image.Image)) or not isinstance(images, Sequence):
        raise ValueError(f"images must be a list of images, got {type(images).__name__}")
    if len(images) == 0:
        raise ValueError("images is empty; pass at least one image")
    arrays = [rgb_array(image, i) for i, image in enumerate(images)]
    targets = [smart_resize(*a.shape[:2], cfg.factor, cfg.min_pixels, cfg.max_pixels) for a in arrays]
    counts = [h * w // cfg.patch_size**2 for h, w in targets]
    pixel_values = torch.empty(sum(counts), cfg.patch_dim)
    out = pixel_values.numpy()
    start = 0
    for image, array, target, count in zip(images, arrays, targets, counts, strict=True):
        bgr = channel_order == "BGR" and not isinstance(image, Image.Image)
        # channels are independent: resize before reordering them
        if cfg.float_input:
            scaled = resize_float(array, target, cfg.resample)
            _patchify_float_into(out[start : start + count], scaled.flip(0) if bgr else scaled, cfg)
        else:
            resized = resize(array, target, cfg.resample)
            _patchify_into(out[start : start + count], resized[::-1] if bgr else resized, cfg)
        start += count
    p = cfg.patch_size
    grid = torch.tensor([[1, h // p, w // p] for h, w in targets], dtype=torch.int64)
    return pixel_values, grid
