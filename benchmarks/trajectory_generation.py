"""Planner and trajectory-generation speed on the demo checkpoint's text model (CPU or CUDA).

The prompt is the real 4-camera x 4-frame driving prompt with each `<|image_pad|>` expanded to the 180 merged
tokens of a 320x576 frame (the VLM's expansion), so the prefill has the product's length (~3.1k tokens); the
image positions hold the pad token's embedding, since the vision tower is not part of this measurement.
Measured, median of --rounds:
  * host stages: ego history -> t0 frame -> 48 history tokens -> rendered prompt; 128 tokens -> actions ->
    rollout; ground-truth trajectory -> actions (the regularised inverse);
  * K samples sharing one prefill (fork the KV cache) vs K separate prefills, side by side, with the reasoning
    capped at --reasoning tokens (the random demo model never ends it itself) and 128 trajectory tokens.

    python benchmarks/trajectory_generation.py [--checkpoint DIR] [--samples 4] [--reasoning 32] [--rounds 3]
        [--threads N] [--device cpu|cuda]

On a shared CPU pass --threads 1: with 2 intra-op threads and other jobs on the cores, a decode step of this
tiny model measured 2 ms at best but 16-48 ms median (threads wait for each other), against 1.4 ms median with 1.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from alpamayo.config.loader import load_model_config, model_tokenizer
from alpamayo.decoding.loop import generate_plans
from alpamayo.demo_release import make_demo_checkpoint
from alpamayo.devices import resolve_device
from alpamayo.generation import Sampling, TokenSampler
from alpamayo.prediction import EgoHistory
from alpamayo.runtime import planner_config
from alpamayo.text import TextModel
from planner.pipeline import Planner

TOKENS_PER_IMAGE = 180  # 320x576 frame: 20x36 patches, merged 2x2


def median_ms(fn, rounds: int):
    times, out = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), out


def drive_history() -> EgoHistory:
    t = 0.1 * np.arange(16)
    yaw = 0.4 + 0.05 * t
    xyz = np.stack([300 + 12 * t * np.cos(yaw), 40 + 12 * t * np.sin(yaw), np.full(16, 5.0)], -1)
    quat = np.stack([np.zeros(16), np.zeros(16), np.sin(yaw / 2), np.cos(yaw / 2)], -1)
    return EgoHistory(xyz=xyz, quat_xyzw=quat, t_ns=np.arange(16) * 100_000_000)


def expand_images(ids: list[int], pad: int) -> torch.Tensor:
    out: list[int] = []
    for i in ids:
        out.extend([pad] * TOKENS_PER_IMAGE if i == pad else [i])
    return torch.tensor(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, help="default: build the demo checkpoint in a temp dir")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--reasoning", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint or make_demo_checkpoint(Path(tmp) / "demo")
        run(path, args.samples, args.reasoning, args.rounds, resolve_device(args.device))


def run(path: Path, k: int, reasoning: int, rounds: int, device: torch.device) -> None:
    cfg = load_model_config(path)
    tokenizer = model_tokenizer(cfg)
    planner = Planner.from_config(planner_config(cfg), tokenizer)
    model = TextModel.from_checkpoint(path, cfg, device=device)
    ego = drive_history()

    def host_prompt():
        history = planner.history(ego)
        return history, planner.prompt([0, 1, 2, 6], 4, history, route="Turn left in 40 m")

    prompt_ms, (history, prompt) = median_ms(host_prompt, rounds)
    ids = expand_images(prompt.token_ids, tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    limits = planner.limits(reasoning)
    sampling = Sampling(temperature=0.6, top_p=0.98)

    def shared():
        model.setup_cache(len(ids) + limits.decode_positions, k)
        logits = model.prefill(ids)
        return generate_plans(model, logits, planner.vocab, TokenSampler.for_request(sampling, 0, k), limits)

    def separate():
        model.setup_cache(len(ids) + limits.decode_positions, 1)
        plans = []
        for seed in range(k):
            logits = model.prefill(ids)
            sampler = TokenSampler.for_request(sampling, seed, 1)
            plans += generate_plans(model, logits, planner.vocab, sampler, limits)
        return plans

    shared()  # warm-up
    shared_ms, plans = median_ms(shared, rounds)
    separate_ms, _ = median_ms(separate, rounds)
    samples_ms, samples = median_ms(lambda: planner.samples(plans, history), rounds)
    sample = samples[0]
    inverse_ms, _ = median_ms(
        lambda: planner.action_space.actions_from_trajectory(sample.xyz, sample.heading, 12.0), rounds
    )
    print(f"checkpoint {path} on {device}, torch threads {torch.get_num_threads()}, median of {rounds}")
    print(
        f"prompt: {len(ids)} tokens after image expansion; reasoning capped at {reasoning}, 128 trajectory tokens"
    )
    print(f"  history -> t0 frame -> tokens -> prompt   {prompt_ms:9.2f} ms")
    print(f"  {k} x (tokens -> actions -> rollout)       {samples_ms:9.2f} ms")
    print(f"  trajectory -> actions (inverse)          {inverse_ms:9.2f} ms")
    print(f"  {k} samples, one prefill + fork           {shared_ms:9.1f} ms")
    print(f"  {k} samples, {k} prefills                    {separate_ms:9.1f} ms")
    print(f"  ratio separate / shared                  {separate_ms / shared_ms:9.2f}")


if __name__ == "__main__":
    main()
