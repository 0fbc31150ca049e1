"""Speculative decoding of the reasoning: what one verify of T tokens costs against one decode step, and the
tokens per second that follow at a held accepted length; then the model-free drafts on a replayed demo drive.

At the Qwen3-VL-8B text shape (hidden 4096, 32/8 heads of 128, MLP 12288, untied 151936-row head), random
bf16 weights, decoder layers cut to `--layers` (the head is kept whole: it is 1/3 of the bytes per token at
2 layers, so cutting layers makes verify *cheaper* relative to decode than the full model would be only in the
attention; the ratios are read against the bandwidth floor printed beside them). In one run:
  * plain decode ms per token after a `--context`-token prompt;
  * one `TextModel.verify` of T = 1, 2, 4, 8, 16 tokens (then rolled back);
  * oracle drafts held at accepted length tau = 1, 2, 4, 6, 8: blocks of 8 = [pending, 7 drafted], the
    drafted tokens the target's true greedy continuation corrupted from index tau - 1 on, accepted by the
    greedy rule (`alpamayo.generation.verify_token`), cache rolled back; tokens per second vs plain decoding;
  * `lookup` and `previous` on a replayed demo drive (demo checkpoint, lock-step): their real mean accepted
    lengths and the reasoning_decode time against `--draft none`.

    python benchmarks/speculative.py [--layers 2] [--context 1024] [--blocks 8] [--drive-seconds 2.5]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

from alpamayo.config import parse_config
from alpamayo.configs import CONFIG_DIR
from alpamayo.generation import Sampling, verify_token
from alpamayo.text import TextModel
from alpamayo.text.weights import text_tensor_shapes

BLOCK = 8
TAUS = (1, 2, 4, 6, 8)


def random_8b_text(layers: int) -> TextModel:
    raw = json.loads((CONFIG_DIR / "qwen3-vl-8b.json").read_text())
    raw["text_config"]["num_hidden_layers"] = layers
    cfg = parse_config(raw, "qwen3-vl-8b.json")
    shapes = text_tensor_shapes(cfg)
    g = torch.Generator().manual_seed(0)

    def get(name: str) -> torch.Tensor:
        shape = shapes[name][0]
        if len(shape) == 1:
            return (1.0 + 0.1 * torch.randn(shape, generator=g)).to(torch.bfloat16)
        return (torch.randn(shape, generator=g) / math.sqrt(shape[-1])).to(torch.bfloat16)

    return TextModel.from_weights(cfg, get)


def weight_bytes(model: TextModel) -> int:
    t = model.text_cfg
    per_layer = (
        t.hidden_size * (t.q_dim + 2 * t.kv_dim)
        + t.q_dim * t.hidden_size
        + 3 * t.hidden_size * t.intermediate_size
    )
    return 2 * (per_layer * t.num_hidden_layers + t.vocab_size * t.hidden_size)


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def target_side(args: argparse.Namespace) -> dict:
    model = random_8b_text(args.layers)
    prompt = torch.randint(0, 150_000, (args.context,), generator=torch.Generator().manual_seed(1))
    n_cont = args.blocks * BLOCK + BLOCK
    model.setup_cache(args.context + n_cont + 2 * BLOCK, 1)
    logits = model.prefill(prompt)
    truth = [int(logits.argmax())]  # the target's own greedy continuation
    for _ in range(n_cont):
        truth.append(int(model.decode(truth[-1]).argmax()))
    model.rollback([args.context])
    decode_ms = median_ms(lambda: (model.decode(7), model.rollback([args.context])), args.reps)
    verify_ms = {}
    for t in (1, 2, 4, 8, 16):
        block = torch.tensor([truth[:t]])
        verify_ms[t] = median_ms(lambda b=block: (model.verify(b), model.rollback([args.context])), args.reps)
    greedy = Sampling()
    oracle = {}
    for tau in TAUS:
        model.rollback([args.context])
        pos, accepted = 0, []  # truth[pos] is the pending token (chosen, not yet in the cache)
        t0 = time.perf_counter()
        for _ in range(args.blocks):
            drafted = [
                tok if i < tau - 1 else (tok + 1) % 150_000
                for i, tok in enumerate(truth[pos + 1 : pos + BLOCK])
            ]
            out = model.verify(torch.tensor([[truth[pos], *drafted]]))[0]
            kept = 1
            for j, d in enumerate(drafted):
                if not verify_token(out[j], d, greedy, None)[1]:
                    break
                kept += 1
            model.rollback([model.lengths[0] - BLOCK + kept])
            accepted.append(kept)
            pos += kept
        elapsed = time.perf_counter() - t0
        oracle[tau] = {"mean_accepted": statistics.mean(accepted), "tokens_per_s": sum(accepted) / elapsed}
    return {
        "layers": args.layers,
        "context": args.context,
        "weight_gb": weight_bytes(model) / 1e9,
        "decode_ms": decode_ms,
        "verify_ms": verify_ms,
        "oracle": oracle,
    }


def drafts_on_drive(args: argparse.Namespace) -> dict:
    from alpamayo.demo_drive import make_demo_drive
    from alpamayo.demo_release import make_demo_checkpoint
    from alpamayo.replay.report import mean_accepted_length
    from alpamayo.replay.session import run_replay
    from alpamayo.replay.settings import ReplaySettings

    tmp = Path(tempfile.mkdtemp(prefix="speculative-"))
    ckpt = make_demo_checkpoint(tmp / "ckpt", 0, layout="alpamayo1.5")
    drive = make_demo_drive(tmp / "drive.mcap", args.drive_seconds, 4, 0, (1080, 1920))
    out = {}
    for draft in ("none", "lookup", "previous"):
        run = run_replay(
            ReplaySettings(
                drive=drive.path,
                checkpoint=ckpt,
                warmup=1,
                max_reasoning_tokens=32,
                seed=0,
                draft=draft,
                progress=False,
            )
        )
        reasoning = [t.stages_ms.get("reasoning_decode", 0.0) for t in run.measured]
        out[draft] = {
            "mean_accepted": mean_accepted_length([n for t in run.measured for n in t.accepted_lengths]),
            "reasoning_decode_ms": statistics.mean(reasoning) if reasoning else float("nan"),
            "ticks": len(run.measured),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--blocks", type=int, default=8, help="blocks per oracle run")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--drive-seconds", type=float, default=2.5)
    args = p.parse_args()
    torch.manual_seed(0)
    t = target_side(args)
    d = t["decode_ms"]
    print(
        f"Qwen3-VL-8B text shape, {t['layers']} layers + head ({t['weight_gb']:.2f} GB bf16), context {t['context']}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"plain decode: {d:.1f} ms/token ({1e3 / d:.2f} tokens/s)")
    print(f"{'verify T':>9} {'ms':>9} {'x decode':>9}")
    for n, ms in t["verify_ms"].items():
        print(f"{n:>9} {ms:>9.1f} {ms / d:>9.2f}")
    print(f"{'tau':>5} {'measured':>9} {'tokens/s':>9} {'x plain':>8}   (oracle drafts, blocks of {BLOCK})")
    for tau, r in t["oracle"].items():
        print(
            f"{tau:>5} {r['mean_accepted']:>9.2f} {r['tokens_per_s']:>9.2f} {r['tokens_per_s'] * d / 1e3:>8.2f}"
        )
    drive = drafts_on_drive(args)
    base = drive["none"]["reasoning_decode_ms"]
    print(
        f"{'draft':>9} {'accepted':>9} {'reasoning ms':>13} {'x none':>7}   (demo drive, lock-step, demo checkpoint)"
    )
    for name, r in drive.items():
        acc = "-" if r["mean_accepted"] is None else f"{r['mean_accepted']:.2f}"
        print(f"{name:>9} {acc:>9} {r['reasoning_decode_ms']:>13.1f} {base / r['reasoning_decode_ms']:>7.2f}")


if __name__ == "__main__":
    main()
