"""Vision speed: `vision.preprocess` vs transformers' PIL image processor, and the vision tower vs transformers'.

Preprocessing: one camera-like 1080x1920 RGB frame with Alpamayo's pixel bounds (min_pixels 163840,
max_pixels 196608) becomes a 320x576 image, pixel_values [720, 1536] (180 tokens); also a 4-camera tick
(4 frames in one call). transformers runs `Qwen2VLImageProcessorPil` (the backend Qwen3-VL uses without
torchvision) configured with Qwen3-VL's values. Medians over `--rounds`; the ratio is theirs / ours.
Alpamayo 2 Super's float path (`PreprocessConfig.float_input`) against transformers' torchvision processor fed
as Super's helper feeds it (`images.float() / 255`, `do_rescale=False`; needs torchvision, a dev dependency).

Encoder (skip with --encoder-depth 0): the Qwen3-VL-2B vision tower shape (hidden 1024, 16 heads, MLP 4096,
out 2048) cut to `--encoder-depth` blocks, random weights saved with `save_pretrained`, on that one frame.

    python benchmarks/vision_preprocess.py [--rounds 20] [--encoder-depth 2] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from alpamayo.config.builtin import CONFIG_DIR
from alpamayo.devices import DTYPES
from alpamayo.numerics import max_abs_error, pcc
from vision.encoder import VisionEncoder
from vision.preprocess import PreprocessConfig, preprocess_images

ALPAMAYO_PIXELS = dict(min_pixels=163840, max_pixels=196608)
# transformers' processors configured with Qwen3-VL's values and Alpamayo's pixel bounds
QWEN3VL_PROCESSOR = dict(
    patch_size=16,
    merge_size=2,
    temporal_patch_size=2,
    image_mean=[0.5] * 3,
    image_std=[0.5] * 3,
    resample=3,
    **ALPAMAYO_PIXELS,
)


def camera_frame(seed: int) -> np.ndarray:
    """uint8 [1080, 1920, 3]: colour ramps, hard-edged squares and sensor noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:1080, 0:1920]
    base = np.stack([xx / 1919 * 255, yy / 1079 * 255, ((xx // 64 + yy // 64) % 2) * 255.0], axis=-1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def median_ms(fn, rounds: int) -> tuple[float, object]:
    out = fn()  # warm-up
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, out


def bench_preprocess(rounds: int) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    hf = Qwen2VLImageProcessorPil(**QWEN3VL_PROCESSOR)
    cfg = PreprocessConfig(**ALPAMAYO_PIXELS)
    print(f"preprocessing, {torch.get_num_threads()} torch threads, median of {rounds} rounds")
    print(f"{'':28s} {'transformers':>13s} {'alpamayo':>9s} {'speed-up':>9s} {'max abs diff':>13s}")
    for n in (1, 4):
        frames = [camera_frame(seed) for seed in range(n)]
        theirs, expected = median_ms(lambda f=frames: hf(images=f, return_tensors="pt"), rounds)
        ours, (pixel_values, grid) = median_ms(lambda f=frames: preprocess_images(f, cfg), rounds)
        assert torch.equal(grid, expected["image_grid_thw"])
        err = max_abs_error(expected["pixel_values"], pixel_values)
        label = f"{n} x 1080x1920 -> 320x576"
        print(f"{label:28s} {theirs:10.2f} ms {ours:6.2f} ms {theirs / ours:8.1f}x {err:13.6f}")
    bench_float_preprocess(rounds)


def bench_float_preprocess(rounds: int) -> None:
    """Super's float path against transformers' torchvision processor, fed one stacked [N, 3, H, W] tensor."""
    try:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    except ImportError as e:  # torchvision missing
        print(f"float path (Alpamayo 2 Super): skipped, {e}")
        return
    hf = Qwen2VLImageProcessor(**QWEN3VL_PROCESSOR)
    cfg = PreprocessConfig(**ALPAMAYO_PIXELS).with_float_input("benchmark")
    print("float path (Alpamayo 2 Super): transformers' torchvision processor fed images / 255")
    for n in (1, 4):
        frames = [camera_frame(seed) for seed in range(n)]
        stacked = torch.stack([torch.from_numpy(f).permute(2, 0, 1) for f in frames])

        def theirs_fn(images=stacked):
            return hf(images=images.float() / 255.0, do_rescale=False, return_tensors="pt")

        theirs, expected = median_ms(theirs_fn, rounds)
        ours, (pixel_values, grid) = median_ms(lambda f=frames: preprocess_images(f, cfg), rounds)
        assert torch.equal(grid, expected["image_grid_thw"])
        err = max_abs_error(expected["pixel_values"], pixel_values)
        label = f"{n} x 1080x1920 -> 320x576"
        print(f"{label:28s} {theirs:10.2f} ms {ours:6.2f} ms {theirs / ours:8.1f}x {err:13.6f}")


def save_vision_checkpoint(out: Path, depth: int) -> None:
    from transformers import AutoConfig, AutoModelForImageTextToText

    cfg = AutoConfig.from_pretrained(CONFIG_DIR / "qwen3-vl-2b.json")
    cfg.vision_config.depth = depth
    cfg.vision_config.deepstack_visual_indexes = list(range(depth))[-3:]
    # the text model is not timed: one small layer (its width must stay the vision output width)
    text = cfg.text_config
    text.num_hidden_layers, text.vocab_size, text.intermediate_size = 1, 512, 256
    text.bos_token_id = text.eos_token_id = None  # the real ids lie outside the small vocabulary
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(cfg).save_pretrained(out)


def bench_encoder(depth: int, dtype: torch.dtype, rounds: int) -> None:
    from transformers import AutoModelForImageTextToText

    pixel_values, grid = preprocess_images([camera_frame(0)], PreprocessConfig(**ALPAMAYO_PIXELS))
    with tempfile.TemporaryDirectory() as tmp:
        save_vision_checkpoint(Path(tmp), depth)
        hf = AutoModelForImageTextToText.from_pretrained(tmp, dtype=dtype).eval().model.visual
        ours = VisionEncoder.from_checkpoint(tmp, dtype=dtype)
    with torch.inference_mode():
        theirs_ms, expected = median_ms(lambda: hf(pixel_values.to(dtype), grid_thw=grid), rounds)
    ours_ms, (embeds, _) = median_ms(lambda: ours.encode(pixel_values, grid), rounds)
    print(
        f"\nvision tower, Qwen3-VL-2B shape cut to {depth} blocks, {str(dtype).split('.')[-1]}, one 320x576 frame"
        f" (720 patches): transformers {theirs_ms:.1f} ms, alpamayo {ours_ms:.1f} ms, "
        f"speed-up {theirs_ms / ours_ms:.2f}x, image embeds PCC {pcc(expected.pooler_output, embeds):.6f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20, help="timed repeats per measurement (median reported)")
    ap.add_argument("--encoder-depth", type=int, default=2, help="vision blocks to time; 0 skips the encoder")
    ap.add_argument(
        "--dtype", choices=sorted(DTYPES), default="bfloat16", help="encoder weights and activations"
    )
    args = ap.parse_args()
    bench_preprocess(args.rounds)
    if args.encoder_depth > 0:
        bench_encoder(args.encoder_depth, DTYPES[args.dtype], max(3, args.rounds // 5))


if __name__ == "__main__":
    main()
