"""How far the action expert's sampled trajectory drifts per unit of velocity error: the calibration behind
the card test's ADE bound (tests/test_tt_expert_device.py, `test_sampled_waypoints_match_the_torch_expert`).

On the host, for the card test's own tiny VLM and expert (same seeds, prompt, ragged rows and noise), per
recipe and K: the recipe-rounded torch expert is the reference; the rounding's drift is the float32 expert's
ADE to it (max over the K samples). A stand-in "device" is the reference with a velocity error added at every
Euler step, of `scale` x the rounding's RMS relative error, either white or along the rounding's own error;
the figure is its drift / (rounding drift x error ratio), which the card test bounds by ADE_MARGIN.
`--out-scale` multiplies the out-projection (the card test's 0.02; 1 is the raw random expert, whose flow is
chaotic: the drift then no longer grows with the error).

    python -m benchmarks.expert_ade_sensitivity [--out-scale 0.02] [--recipes accuracy performance] [--samples 1 3 6]    (from the checkout root: it imports `tests`)

Measured (2-core host, --out-scale 0.02): ratio 0.09-0.47 (white), 1.00-1.42 (the rounding's direction);
rounding drift 4.7 mm (accuracy), 3.7 mm (performance). --out-scale 1: 0.97-25 (a tenth of the error drifts
as far as all of it: 0.55-2.8 m).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from alpamayo.checkpoint import Checkpoint
from alpamayo.expert.sampler import euler_sample
from alpamayo.expert.weights import load_expert
from alpamayo.numerics import relative_error
from alpamayo.plan.precision import load_precision
from alpamayo.precision.recipes import kv_store
from alpamayo.text import TextModel
from alpamayo.tt.quantized import QuantizedCheckpoint, rounded_expert
from planner.metrics import ade
from tests.test_tt_expert_device import MAX_SEQ_LEN, PROMPT_LEN, reference_run, waypoints
from tests.tt_checkpoints import save_tt_checkpoint
from tests.tt_expert_cases import TINY_VLM, save_expert_weights, tiny_expert

SCALES = (0.1, 0.3, 1.0)


def worst_ade(a: torch.Tensor, b: torch.Tensor) -> float:
    return max(ade(x, y) for x, y in zip(waypoints(a), waypoints(b), strict=True))


def perturbed(ref, ctx, fp32, ctx32, white_rms: float, kind: str, scale: float, added: list[float]):
    """The reference's velocity plus an error: white, of RMS `white_rms` x |v|'s, or `scale` x the rounding's
    own (float32 expert - reference); each step's relative error is appended to `added`."""
    gen = torch.Generator().manual_seed(7)

    def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        v = ref.velocity(x, t, ctx).float()
        if kind == "white":
            e = torch.randn(v.shape, generator=gen) * v.norm() / math.sqrt(v.numel()) * white_rms
        else:
            e = (fp32.velocity(x, t, ctx32).float() - v) * scale
        added.append(relative_error(v, v + e))
        return v + e

    return velocity


def run(tmp: Path, out_scale: float, recipes: list[str], sample_counts: list[int]) -> None:
    vlm, cfg = tmp / "vlm", tiny_expert()
    save_tt_checkpoint(vlm, TINY_VLM, seed=23)
    expert_dir = save_expert_weights(tmp / "expert", cfg, seed=5)
    tensors = load_file(expert_dir / "model.safetensors")
    out = tensors["action_out_proj.weight"]
    tensors["action_out_proj.weight"] = (out.float() * out_scale).to(out.dtype)
    save_file(tensors, expert_dir / "model.safetensors")
    for recipe in recipes:
        precision = load_precision(recipe)
        rounded = QuantizedCheckpoint(vlm, precision)
        rounded_dir = tmp / f"rounded-{recipe}"
        rounded_dir.mkdir()
        weights = rounded_expert(Checkpoint(expert_dir).get, cfg, precision)
        save_file({k: v.contiguous() for k, v in weights.items()}, rounded_dir / "model.safetensors")
        for samples in sample_counts:
            text = TextModel.from_checkpoint(rounded, rounded.config)
            text.kv_store = kv_store(precision)
            text.setup_cache(MAX_SEQ_LEN, max_batch=samples)
            ref = load_expert(rounded_dir, cfg, text.text_cfg)
            fp32 = load_expert(expert_dir, cfg, text.text_cfg)
            prompt = torch.randint(0, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(3))
            steps = torch.randint(0, 256, (3, samples), generator=torch.Generator().manual_seed(4))
            text.prefill(prompt)
            text.fork(samples)
            for ids in steps:
                text.decode(ids)
            text.rollback([PROMPT_LEN + 1 + b % 3 for b in range(samples)])
            offsets, filled = list(text.lengths), max(text.lengths)
            ctx = ref.context(text.cache, offsets, text.rope_delta, filled)
            ctx32 = fp32.context(text.cache, offsets, text.rope_delta, filled)
            noise = torch.randn(samples, 64, 2, generator=torch.Generator().manual_seed(11))
            n = cfg.num_inference_steps
            reference, seen = reference_run(ref, ctx, noise, n)
            rounding = worst_ade(reference, reference_run(fp32, ctx32, noise, n)[0])
            errors = [
                relative_error(fp32.velocity(x, torch.full((x.shape[0],), t), ctx32).float(), v)
                for x, t, v in seen
            ]
            rounding_rms = math.sqrt(sum(e * e for e in errors) / len(errors))
            for scale in SCALES:
                for kind in ("white", "rounding"):
                    added: list[float] = []
                    velocity = perturbed(ref, ctx, fp32, ctx32, rounding_rms * scale, kind, scale, added)
                    drift = worst_ade(euler_sample(noise, n, velocity), reference)
                    ratio = math.sqrt(sum(e * e for e in added) / len(added)) / rounding_rms
                    print(
                        f"{recipe:11s} K={samples} {kind:8s} x{scale:<4g} drift {drift * 1e3:8.3f} mm, rounding "
                        f"{rounding * 1e3:8.3f} mm, error ratio {ratio:.3f}: drift / (rounding x ratio) "
                        f"{drift / (rounding * ratio):.3f}",
                        flush=True,
                    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-scale", type=float, default=0.02)
    p.add_argument("--recipes", nargs="+", default=["accuracy", "performance"])
    p.add_argument("--samples", nargs="+", type=int, default=[1, 3, 6])
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(Path(tmp), args.out_scale, args.recipes, args.samples)


if __name__ == "__main__":
    main()
