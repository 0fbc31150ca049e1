"""The cost of `--reproducible` on the torch CPU backend: prefill, a decode step and an action-expert step, with
the process's threads (torch's default: every core) against the mode's one torch and one BLAS thread.

Shapes: the 8B VLM text model (hidden 4096, 8 KV heads x 128, MLP 12288, vocab 155697, tied head) and the
released 2.3B expert, both cut to `--layers` decoder layers so that a 2-core machine runs them; float32, the
oracle's dtype. Measured, median of --rounds, the two modes interleaved round by round (so load that comes
and goes on a shared machine hits both alike):
  * prefill of `--prompt` tokens (last-position logits);
  * one decode step at that context;
  * one expert step (K = 1, 64 action tokens against the prefix, `ExpertDecoder.sample` with 1 Euler step).

    python benchmarks/reproducible.py [--layers 2] [--prompt 512] [--rounds 3] [--threads N]

Measured on the shared 2-core AMD EPYC host (defaults): at load average 7-9, prefill 9259 -> 9739 ms (1.05x),
decode step 413 -> 424 ms (1.03x), expert step 755 -> 460 ms (0.61x: the second thread mostly waited); at load
13-15, 1.16x, 0.60x and 0.54x. docs/eval.md ("Reproducible runs") has the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from threadpoolctl import threadpool_limits

from alpamayo.config.builtin import CONFIG_DIR
from alpamayo.config.expert import RELEASE_10B_EXPERT, parse_expert_config
from alpamayo.config.flow import FlowSettings
from alpamayo.config.model import parse_config
from alpamayo.demo_checkpoint import random_weights
from alpamayo.expert.decoding import ExpertDecoder
from alpamayo.expert.demo import random_expert_weights
from alpamayo.expert.weights import load_expert
from alpamayo.reproducibility.mode import compute_on_one_thread
from alpamayo.text import TextModel
from alpamayo.text.weights import text_tensor_shapes

N_ACTION_TOKENS = 64


def text_model(layers: int) -> TextModel:
    """The 8B text shape with `layers` layers and random float32 weights (as benchmarks/action_expert.py)."""
    raw = json.loads((CONFIG_DIR / "qwen3-vl-8b.json").read_text())
    raw["text_config"].update(num_hidden_layers=layers, vocab_size=155697)
    raw["tie_word_embeddings"] = True
    cfg = parse_config(raw)
    weights = random_weights(text_tensor_shapes(cfg), 0, torch.float32, torch.device("cpu"))
    return TextModel.from_weights(cfg, weights)


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--threads", type=int, help="the default mode's torch threads (default: torch's, every core)"
    )
    args = ap.parse_args()
    threads = args.threads or torch.get_num_threads()
    vlm = text_model(args.layers)
    cfg = parse_expert_config(RELEASE_10B_EXPERT, vlm.cfg.raw_text_config)
    with tempfile.TemporaryDirectory() as tmp:
        save_file(random_expert_weights(cfg, seed=0), Path(tmp) / "model.safetensors")
        expert = load_expert(tmp, cfg, vlm.text_cfg, torch.float32, torch.device("cpu"))
    decoder = ExpertDecoder(expert, FlowSettings(steps=1))
    ids = torch.randint(0, 150000, (args.prompt,), generator=torch.Generator().manual_seed(0))
    vlm.setup_cache(args.prompt + N_ACTION_TOKENS + 8)
    noise = torch.randn(1, N_ACTION_TOKENS, 2, generator=torch.Generator().manual_seed(1))

    def stages() -> dict[str, float]:
        vlm.cache_len = 0
        prefill = seconds(lambda: vlm.prefill(ids))
        decode = seconds(lambda: vlm.decode(0))
        ctx = expert.context(vlm.cache, [args.prompt], vlm.rope_delta, vlm.cache_len)
        step = seconds(lambda: decoder.sample(ctx, noise=noise))
        return {"prefill": prefill, "decode step": decode, "expert step": step}

    times: dict[str, dict[str, list[float]]] = {"default": {}, "reproducible": {}}
    with threadpool_limits(
        limits=None
    ):  # gives the BLAS libraries their threads back after the mode's rounds
        for _ in range(args.rounds + 1):  # the first round warms both up and is not counted
            for mode in times:
                torch.set_num_threads(threads)
                if mode == "reproducible":
                    compute_on_one_thread()
                for stage, s in stages().items():
                    times[mode].setdefault(stage, []).append(s)
    print(
        f"{args.layers} layers of the 8B VLM + the 2.3B expert, float32, prompt {args.prompt}; default mode "
        f"{threads} torch thread(s), --reproducible 1; median of {args.rounds} interleaved rounds"
    )
    for stage in times["default"]:
        fast, fixed = (statistics.median(times[m][stage][1:]) * 1e3 for m in times)
        print(
            f"{stage:12s} default {fast:9.1f} ms   --reproducible {fixed:9.1f} ms   cost {fixed / fast:5.2f}x"
        )


if __name__ == "__main__":
    main()
