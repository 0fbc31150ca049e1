"""Text backbone speed: this project's torch backbone vs transformers, same weights, one process.

A random-weight checkpoint with the Qwen3-VL-2B text shape (28 layers, hidden 2048, tied 151936-row head;
the vision tower is shrunk, it is not timed) is saved with `save_pretrained`, then loaded into both. Measured:
  * prefill tokens/s for a 512-token prompt (last-position logits, as generation needs);
  * decode ms/token over 64 greedy tokens (transformers: `generate` time minus its prefill, per new token;
    ours: the same 64 tokens teacher-forced, so the two logit sequences can be compared step by step);
  * decode against the memory-bandwidth floor: weight bytes / STREAM-copy bandwidth (2 x bytes / time).

    python benchmarks/text_backbone.py [--dtype bfloat16] [--prompt 512] [--new 64] [--config qwen3-vl-2b]
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

from alpamayo.config.builtin import CONFIG_DIR
from alpamayo.devices import DTYPES
from alpamayo.numerics import pcc
from alpamayo.text import TextModel
from alpamayo.text.weights import text_tensor_shapes

TINY_VISION = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    num_position_embeddings=16,
    deepstack_visual_indexes=[0],
)


def save_random_checkpoint(
    config_name: str, out: Path, dtype: torch.dtype, text_overrides: dict | None = None
) -> None:
    """A published config (vision tower shrunk; `text_overrides` replace text_config fields) with random weights."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(CONFIG_DIR / f"{config_name}.json")
    for key, value in TINY_VISION.items():
        setattr(cfg.vision_config, key, value)
    for key, value in (text_overrides or {}).items():
        setattr(cfg.text_config, key, value)
    save_random_model(cfg, out, dtype)


def save_random_model(cfg, out: Path, dtype: torch.dtype) -> None:
    """transformers' model of `cfg` with random weights (norms 1 + 0.1 N, other vectors 0, matrices
    N / sqrt(fan_in)), saved with `save_pretrained`."""
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
    model = model.to_empty(device="cpu").to(dtype)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(
                    1.0 + 0.1 * torch.randn(p.shape, generator=g) if "norm" in name else torch.zeros(p.shape)
                )
            else:
                p.copy_(
                    torch.randn(p.shape, generator=g, dtype=torch.float32).to(dtype) / math.sqrt(p.shape[-1])
                )
    model.tie_weights()
    model.save_pretrained(out)


def copy_bandwidth_gbs(nbytes: int = 1 << 30, reps: int = 5) -> float:
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    return 2 * nbytes * reps / (time.perf_counter() - t) / 1e9


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def bench_transformers(path: Path, dtype: torch.dtype, ids: torch.Tensor, new: int, rounds: int) -> dict:
    from transformers import AutoModelForImageTextToText, GenerationConfig

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).eval()
    batch = ids.view(1, -1)
    gen = GenerationConfig(
        do_sample=False,
        max_new_tokens=new,
        min_new_tokens=new,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    prefill, total = [], []
    with torch.inference_mode():
        model(input_ids=batch[:, :32], logits_to_keep=1)  # warm-up
        for _ in range(rounds):
            prefill.append(timed(lambda: model(input_ids=batch, logits_to_keep=1))[1])
            out, t = timed(
                lambda: model.generate(
                    input_ids=batch, attention_mask=torch.ones_like(batch), generation_config=gen
                )
            )
            total.append(t)
    p, t = statistics.median(prefill), statistics.median(total)
    return {
        "prefill_s": p,
        "decode_ms": (t - p) / (new - 1) * 1e3,
        "tokens": out.sequences[0, ids.numel() :],
        "logits": torch.stack(out.logits, 1)[0].float(),
    }


def bench_ours(path: Path, dtype: torch.dtype, ids: torch.Tensor, forced: torch.Tensor, rounds: int) -> dict:
    """`bench_model` on the checkpoint, plus the bytes one decode step must read."""
    model = TextModel.from_checkpoint(path, dtype=dtype)
    # bytes one decode step must read: every weight once (a tied table is read by the head, one row by the lookup)
    weight_bytes = sum(math.prod(s[0]) for s in text_tensor_shapes(model.cfg).values()) * dtype.itemsize
    return {**bench_model(model, ids, forced, rounds), "weight_bytes": weight_bytes}


def bench_model(model: TextModel, ids: torch.Tensor, forced: torch.Tensor, rounds: int) -> dict:
    """Prefill, then decode teacher-forced on transformers' tokens (the same work as greedy decoding).

    Returns the median prefill seconds, the median decode ms/token and the logits [len(forced), V].
    """
    model.setup_cache(ids.numel() + forced.numel())
    model.prefill(ids[:32])  # warm-up
    prefill, decode = [], []
    for _ in range(rounds):
        first, t = timed(lambda: model.prefill(ids))
        prefill.append(t)
        rest, t = timed(lambda: [model.decode(int(tok)) for tok in forced[:-1]])
        decode.append(t)
    return {
        "prefill_s": statistics.median(prefill),
        "decode_ms": statistics.median(decode) / (forced.numel() - 1) * 1e3,
        "logits": torch.stack([first, *rest]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="qwen3-vl-2b")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="repeats per measurement; the median is reported")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    ids = torch.randint(0, 150_000, (args.prompt,), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        _, build = timed(lambda: save_random_checkpoint(args.config, path, dtype))
        print(
            f"random {args.config} checkpoint ({args.dtype}) saved in {build:.0f} s; {torch.get_num_threads()} threads"
        )
        hf = bench_transformers(path, dtype, ids, args.new, args.rounds)
        ours = bench_ours(path, dtype, ids, hf["tokens"], args.rounds)
    bw = copy_bandwidth_gbs()
    floor_ms = ours["weight_bytes"] / (bw * 1e9) * 1e3
    top1 = (ours["logits"].argmax(-1) == hf["logits"].argmax(-1)).float().mean()
    logit_pcc = min(pcc(a, b) for a, b in zip(hf["logits"], ours["logits"], strict=True))
    rows = [
        ("prefill tokens/s", args.prompt / hf["prefill_s"], args.prompt / ours["prefill_s"]),
        ("decode ms/token", hf["decode_ms"], ours["decode_ms"]),
    ]
    print(f"\n{'':18s} {'transformers':>13s} {'alpamayo':>10s} {'speed-up':>9s}")
    for name, theirs, mine in rows:
        ratio = mine / theirs if "tokens/s" in name else theirs / mine
        print(f"{name:18s} {theirs:13.1f} {mine:10.1f} {ratio:8.2f}x")
    print(
        f"\nweights {ours['weight_bytes'] / 1e9:.2f} GB, copy bandwidth {bw:.1f} GB/s -> floor {floor_ms:.1f} ms/token;"
        f" alpamayo decode at {floor_ms / ours['decode_ms']:.0%} of the floor, transformers at "
        f"{floor_ms / hf['decode_ms']:.0%}"
    )
    print(
        f"teacher-forced on transformers' greedy tokens: top-1 agreement {top1:.1%}, min per-step logit PCC "
        f"{logit_pcc:.6f}"
    )
    if args.json:
        figures = {
            "prefill_tok_s": [r[1] for r in rows[:1]] + [r[2] for r in rows[:1]],
            "copy_gbs": bw,
            "decode_ms": [hf["decode_ms"], ours["decode_ms"]],
            "top1": float(top1),
            "min_pcc": logit_pcc,
        }
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
