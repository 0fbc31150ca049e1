"""`vision.preprocess` against transformers' `Qwen2VLImageProcessorPil` configured with Qwen3-VL's values (the
uint8 path), and against its torchvision `Qwen2VLImageProcessor` fed float images / 255 with `do_rescale=False`
as Alpamayo 2 Super's helper feeds it (the float path)."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from alpamayo.errors import ConfigError
from alpamayo.numerics import max_abs_error
from tests.hf_checkpoints import (
    hf_float_image_processor,
    hf_image_processor,
    nvidia_float_pixels,
    save_preprocessor_config,
)
from tests.images import noise_frame, synthetic_frame
from vision.preprocess import PreprocessConfig, preprocess_images, smart_resize
from vision.resize import uses_fast_path

ALPAMAYO_PIXELS = dict(min_pixels=163840, max_pixels=196608)
SMALL_PIXELS = dict(min_pixels=32 * 32, max_pixels=1 << 20)
ONE_LEVEL = 2 / 255  # one uint8 level after (x / 255 - 0.5) / 0.5


def hf_reference(images: list, min_pixels: int, max_pixels: int) -> tuple[torch.Tensor, torch.Tensor]:
    out = hf_image_processor(min_pixels, max_pixels)(images=images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def rgba(h: int, w: int) -> Image.Image:
    rgb = synthetic_frame(h, w, seed=3)
    alpha = np.linspace(0, 255, h * w).reshape(h, w, 1).astype(np.uint8)
    return Image.fromarray(np.concatenate([rgb, alpha], -1), "RGBA")


# (name, images as given to us, channel order, the same images as given to transformers)
EXACT_INPUTS = {
    "numpy-rgb": lambda: ([synthetic_frame(64, 96)], "RGB", [synthetic_frame(64, 96)]),
    "numpy-bgr": lambda: ([synthetic_frame(64, 96)[..., ::-1]], "BGR", [synthetic_frame(64, 96)]),
    "numpy-readonly-buffer": lambda: (
        [np.frombuffer(synthetic_frame(96, 64).tobytes(), np.uint8).reshape(96, 64, 3)],
        "RGB",
        [synthetic_frame(96, 64)],
    ),
    "pil-rgb": lambda: (
        [Image.fromarray(synthetic_frame(128, 64))],
        "RGB",
        [Image.fromarray(synthetic_frame(128, 64))],
    ),
    "pil-rgba-over-white": lambda: ([rgba(64, 96)], "BGR", [rgba(64, 96)]),
    "pil-grayscale": lambda: (
        [Image.fromarray(synthetic_frame(64, 64)[..., 0], "L")],
        "RGB",
        [Image.fromarray(synthetic_frame(64, 64)[..., 0], "L")],
    ),
    "three-sizes-at-once": lambda: (
        [synthetic_frame(64, 96, 1), synthetic_frame(160, 32, 2), synthetic_frame(32, 32, 3)],
        "RGB",
        [synthetic_frame(64, 96, 1), synthetic_frame(160, 32, 2), synthetic_frame(32, 32, 3)],
    ),
}


@pytest.mark.parametrize("name", sorted(EXACT_INPUTS))
def test_sizes_already_multiples_of_32_match_transformers_exactly(name):
    ours_in, order, hf_in = EXACT_INPUTS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a read-only buffer must not trigger torch's non-writable warning
        pixel_values, grid = preprocess_images(ours_in, PreprocessConfig(**SMALL_PIXELS), order)
    expected, expected_grid = hf_reference(hf_in, **SMALL_PIXELS)
    assert torch.equal(grid, expected_grid)
    assert pixel_values.dtype == torch.float32 and grid.dtype == torch.int64
    assert max_abs_error(expected, pixel_values) == 0.0


# (height, width, pixel bounds): the Alpamayo frame both ways round (torch kernel; the portrait one runs
# Pillow 13's vertical-first order), an upscale of a small image and a mild downscale (both Pillow).
RESIZES = {
    "alpamayo-1080x1920": (1080, 1920, ALPAMAYO_PIXELS),
    "portrait-1920x1080": (1920, 1080, ALPAMAYO_PIXELS),
    "upscale-50x70": (50, 70, {}),
    "mild-downscale-700x1000": (700, 1000, ALPAMAYO_PIXELS),
}


@pytest.mark.parametrize("content", ["camera-like", "noise"])
@pytest.mark.parametrize("name", sorted(RESIZES))
def test_resized_images_are_within_one_level_of_transformers(name, content, record_figure):
    h, w, bounds = RESIZES[name]
    image = (synthetic_frame if content == "camera-like" else noise_frame)(h, w, seed=4)
    cfg = PreprocessConfig(**bounds)
    pixel_values, grid = preprocess_images([image], cfg)
    expected, expected_grid = hf_reference([image], cfg.min_pixels, cfg.max_pixels)
    assert torch.equal(grid, expected_grid)
    err = max_abs_error(expected, pixel_values)
    record_figure("pixel_values max abs vs transformers", err)
    target = (int(grid[0, 1]) * 16, int(grid[0, 2]) * 16)
    if uses_fast_path((h, w), target, cfg.resample):
        assert err <= ONE_LEVEL + 1e-6 <= 1e-2
    else:
        assert err == 0.0


def test_alpamayo_frame_becomes_320x576_with_180_tokens():
    _, grid = preprocess_images([synthetic_frame(1080, 1920)], PreprocessConfig(**ALPAMAYO_PIXELS))
    assert grid.tolist() == [[1, 20, 36]] and int(grid.prod()) // 4 == 180


def test_smart_resize_matches_transformers():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

    sizes = [(48, 80), (80, 48), (16, 16), (1, 199), (33, 1000), (1080, 1920), (720, 1280), (4000, 3000)]
    sizes += [(h, w) for h in range(1, 400, 37) for w in range(3, 900, 71) if max(h, w) <= 200 * min(h, w)]
    for bounds in ({"min_pixels": 65536, "max_pixels": 16777216}, ALPAMAYO_PIXELS, SMALL_PIXELS):
        for h, w in sizes:
            assert smart_resize(h, w, 32, **bounds) == hf_smart_resize(h, w, factor=32, **bounds), (
                h,
                w,
                bounds,
            )
    assert smart_resize(48, 80, 32, 1, 1 << 20) == (64, 64)  # 1.5 and 2.5 round half to even, to 2


REJECTIONS = {
    "float": (
        [np.zeros((32, 32, 3), np.float32)],
        "RGB",
        r"image 0: expected dtype uint8 \(0\.\.255\), got float32",
    ),
    "uint16": ([synthetic_frame(32, 32), np.zeros((32, 32, 3), np.uint16)], "RGB", r"image 1: .* got uint16"),
    "four-channels": (
        [np.zeros((32, 32, 4), np.uint8)],
        "RGB",
        r"image 0: expected shape \[H, W, 3\], got \[32, 32, 4\]",
    ),
    "grayscale-array": ([np.zeros((32, 32), np.uint8)], "RGB", r"expected shape \[H, W, 3\], got \[32, 32\]"),
    "empty-image": ([np.zeros((0, 32, 3), np.uint8)], "RGB", r"image 0: empty image of shape \[0, 32, 3\]"),
    "aspect-ratio": (
        [np.zeros((2, 404, 3), np.uint8)],
        "RGB",
        r"image 2x404 has aspect ratio 202\.0; at most 200",
    ),
    "not-a-list": (synthetic_frame(32, 32), "RGB", r"images must be a list of images, got ndarray"),
    "no-images": ([], "RGB", r"images is empty"),
    "not-an-image": (["frame.png"], "RGB", r"image 0: expected a numpy array or a PIL image, got str"),
    "channel-order": (
        [synthetic_frame(32, 32)],
        "RGBA",
        r"channel_order must be one of \('RGB', 'BGR'\), got 'RGBA'",
    ),
}


@pytest.mark.parametrize("name", sorted(REJECTIONS))
def test_bad_images_are_rejected_with_the_offending_value(name):
    images, order, message = REJECTIONS[name]
    with pytest.raises(ValueError, match=message):
        preprocess_images(images, PreprocessConfig(), order)


def test_config_defaults_are_qwen3vl_when_the_file_is_absent(tmp_path):
    cfg = PreprocessConfig.from_checkpoint(tmp_path)
    assert cfg == PreprocessConfig()
    assert (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size, cfg.resample) == (16, 2, 2, 3)
    assert (cfg.image_mean, cfg.image_std, cfg.min_pixels, cfg.max_pixels) == (
        (0.5, 0.5, 0.5),
        (0.5, 0.5, 0.5),
        65536,
        16777216,
    )


def test_config_reads_the_transformers_size_spelling(tmp_path):
    save_preprocessor_config(tmp_path, **ALPAMAYO_PIXELS)
    assert PreprocessConfig.from_checkpoint(tmp_path) == PreprocessConfig(**ALPAMAYO_PIXELS)


def test_config_reads_min_max_pixels_and_they_override_size(tmp_path):
    raw = {"size": {"shortest_edge": 1, "longest_edge": 2}, **ALPAMAYO_PIXELS, "image_mean": [0.1, 0.2, 0.3]}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(raw))
    cfg = PreprocessConfig.from_checkpoint(tmp_path)
    assert (cfg.min_pixels, cfg.max_pixels, cfg.image_mean) == (163840, 196608, (0.1, 0.2, 0.3))


BAD_CONFIGS = {
    "mean-length": (
        {"image_mean": [0.5, 0.5]},
        r"'image_mean' must be a list of 3 numbers .* got \[0\.5, 0\.5\]",
    ),
    "zero-std": ({"image_std": [0.5, 0, 0.5]}, r"'image_std' must be a list of 3 positive numbers"),
    "bounds": ({"min_pixels": 10, "max_pixels": 5}, r"min_pixels 10 must be <= max_pixels 5"),
    "resample": ({"resample": 7}, r"'resample' = 7 is not a PIL filter id"),
    "no-resize": ({"do_resize": False}, r"'do_resize' = false is not supported"),
    "patch": ({"patch_size": 0}, r"field 'patch_size' must be an integer >= 1, got 0"),
    "size-type": ({"size": 448}, r"'size' must be a JSON object, got int"),
}


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_bad_preprocessor_config_is_named(tmp_path, name):
    raw, message = BAD_CONFIGS[name]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=message):
        PreprocessConfig.from_checkpoint(tmp_path)


def test_other_filters_and_flags_follow_the_config_exactly():
    """Lanczos (no torch kernel) and a config without normalisation still match transformers bit for bit."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image = synthetic_frame(300, 500, seed=5)
    cfg = PreprocessConfig(resample=1, do_normalize=False, **ALPAMAYO_PIXELS)
    hf = Qwen2VLImageProcessorPil(
        patch_size=16, merge_size=2, temporal_patch_size=2, resample=1, do_normalize=False, **ALPAMAYO_PIXELS
    )
    expected = hf(images=[image], return_tensors="pt")["pixel_values"]
    assert max_abs_error(expected, preprocess_images([image], cfg)[0]) == 0.0


# ---------------------------------------------------------------- the float path (Alpamayo 2 Super)

FLOAT32_ROUNDING = 1e-6  # a few ulps of values up to ~1.2 (ulp 1.2e-7); measured: exactly 0
# (frames [height, width] given at once as Super stacks a camera's frames, pixel bounds, resample): the
# Alpamayo frame both ways round, an upscale, a mild downscale, a size that needs no resize, bilinear, nearest.
FLOAT_CASES = {
    "alpamayo-1080x1920": ((1080, 1920), ALPAMAYO_PIXELS, 3),
    "portrait-1920x1080": ((1920, 1080), ALPAMAYO_PIXELS, 3),
    "upscale-50x70": ((50, 70), {}, 3),
    "mild-downscale-700x1000": ((700, 1000), ALPAMAYO_PIXELS, 3),
    "no-resize-64x96": ((64, 96), SMALL_PIXELS, 3),
    "bilinear-1080x1920": ((1080, 1920), ALPAMAYO_PIXELS, 2),
    "nearest-300x500": ((300, 500), ALPAMAYO_PIXELS, 0),
}


@pytest.mark.parametrize("name", sorted(FLOAT_CASES))
def test_float_input_equals_transformers_fed_float_images(name, record_figure):
    (h, w), bounds, resample = FLOAT_CASES[name]
    frames = [synthetic_frame(h, w, seed=s) for s in range(2)] + [noise_frame(h, w, seed=2)]
    cfg = replace(PreprocessConfig(resample=resample, **bounds), float_input=True)
    pixel_values, grid = preprocess_images(frames, cfg)
    hf = hf_float_image_processor(cfg.min_pixels, cfg.max_pixels, resample=resample)
    expected, expected_grid = nvidia_float_pixels(hf, frames)
    assert torch.equal(grid, expected_grid)
    err = max_abs_error(expected, pixel_values)
    record_figure(f"{name} float pixel_values max abs vs transformers", err)
    assert err <= FLOAT32_ROUNDING
    if (h, w) == (1080, 1920) and resample == 3:
        # bicubic overshoot at the checkerboard's edges survives: no uint8 rounding, no clamp
        assert float(expected.min()) < -1.05 and float(expected.max()) > 1.05
        # and the uint8 path, which does round and clamp, is far from it (the test tells the two apart)
        uint8_values, _ = preprocess_images(frames, replace(cfg, float_input=False))
        assert max_abs_error(expected, uint8_values) > 0.05


def test_float_input_channel_orders_and_pil_images_agree():
    frame = synthetic_frame(700, 1000, seed=6)
    cfg = PreprocessConfig(**ALPAMAYO_PIXELS).with_float_input("test")
    rgb, _ = preprocess_images([frame], cfg)
    assert torch.equal(preprocess_images([frame[..., ::-1]], cfg, "BGR")[0], rgb)
    assert torch.equal(preprocess_images([Image.fromarray(frame)], cfg)[0], rgb)


def test_float_input_refuses_filters_torchvision_cannot_run_on_floats():
    with pytest.raises(ConfigError, match=r"config.json: 'resample' = 1 \(lanczos\) cannot resize the float"):
        PreprocessConfig(resample=1).with_float_input("config.json")


def test_the_uint8_path_is_unchanged_by_the_float_flag():
    """The default (R1, 1.5, the project's layouts) keeps resizing uint8 images: float_input is off and the
    pixels are the uint8 resize's, whatever the float path would give."""
    frame = synthetic_frame(1080, 1920, seed=7)
    cfg = PreprocessConfig(**ALPAMAYO_PIXELS)
    assert not cfg.float_input
    pixel_values, _ = preprocess_images([frame], cfg)
    table = (np.arange(256, dtype=np.float64) / 255).astype(np.float32)
    levels = np.round((pixel_values.numpy() * 0.5 + 0.5) * 255).astype(np.int64)
    assert np.array_equal((table[levels] - np.float32(0.5)) / np.float32(0.5), pixel_values.numpy())
