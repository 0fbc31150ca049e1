"""Weight-only int8 / int4 against bf16 on this CPU, in one run:

1. kernels: one 8B-shape linear (default the MLP's 12288 x 4096) at M rows, each path against its bandwidth
   floor (the bytes it must read / the STREAM-copy bandwidth): bf16 (oneDNN packed), the int8 and int4
   weight-only kernels (`aten._weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) and the dense path
   (dequantise, then the oneDNN matmul) that `alpamayo.quant.weights` switches to from
   `DEQUANTISE_FROM_ROWS` rows; "GB/s" is the weight bytes each path reads per call over its time;
   shapes: every distinct linear shape of the `--configs` text backbones (fused q/k/v, o, fused gate/up,
   down, the head) at one row, bf16 against the int8 and int4 kernels: the kernels read at a rate that
   depends on the shape, so one linear does not predict the model;
2. decode ms/token (against each recipe's floor) and prefill tokens/s at the `--configs` text shapes
   (Qwen3-VL-2B and -8B) with `--layers` decoder layers (random bf16 checkpoint, quantised at load; the
   head stays bf16 unless `--quant-head`). "linears" is the time of one decode step inside the matmul
   kernels (torch profiler, self time of `mkldnn::_linear_pointwise`, `aten::_weight_int8pack_mm`,
   `aten::_weight_int4pack_mm_for_cpu`, `aten::mm`), "rest" the same profiled step's other work
   (attention, norms, rotary, the cache write, Python), which no recipe changes;
2b. prefill tokens/s at a `--long-prompt`-token prompt (default 3000, an Alpamayo prompt: 16 images x 180
   tokens + text; 0 skips it) with `--long-layers`, each recipe against bf16 (the issue's 0.8x goal);
3. the action expert's flow step at K samples (default 6) over the 8B VLM's cache of `--expert-prefix`
   positions, its linears bf16 / int8 / int4.

    python benchmarks/quantised_decode.py [--configs 2b 8b] [--layers 4] [--prompt 128] [--new 16]
        [--long-prompt 3000] [--long-layers 2] [--rows 1 4 16 64 256] [--shape 12288 4096] [--samples 6]
        [--expert-prefix 1024] [--quant-head] [--threads N] [--skip kernels|shapes|models|expert ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from action_expert import fill_cache, vlm_model
from text_backbone import bench_model, copy_bandwidth_gbs, save_random_checkpoint

from alpamayo.config.builtin import CONFIG_DIR
from alpamayo.config.expert import RELEASE_10B_EXPERT, parse_expert_config
from alpamayo.config.flow import FlowSettings
from alpamayo.expert.decoding import ExpertDecoder
from alpamayo.expert.demo import random_expert_weights
from alpamayo.expert.weights import load_expert
from alpamayo.quant import QuantRecipe, quantise_weight
from alpamayo.quant.weights import DEQUANTISE_FROM_ROWS, Int4Weight, Int8Weight
from alpamayo.text import TextModel
from alpamayo.text.linear import Linear

CONFIGS = {"2b": "qwen3-vl-2b", "8b": "qwen3-vl-8b"}
# The ops a decode step's linears run in (bf16 packed, int8, int4, and the dense path of many-row calls).
LINEAR_OPS = (
    "mkldnn::_linear_pointwise",
    "aten::_weight_int8pack_mm",
    "aten::_weight_int4pack_mm_for_cpu",
    "aten::mm",
)


def recipes(head: bool, group: int = 128) -> dict[str, QuantRecipe]:
    return {
        "bf16": QuantRecipe(),
        "int8": QuantRecipe("int8", head=head),
        "int4": QuantRecipe("int4", group, head=head),
    }


def best_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def decode_bytes(model: torch.nn.Module) -> int:
    """Bytes one decode step reads: every linear's stored weight (quantised or not) once."""
    total = 0
    for m in model.modules():
        if isinstance(m, Linear):
            total += m.quantised.nbytes if m.quantised is not None else m.out_features * m.in_features * 2
    return total


def rotating(fn_of_copy, copies: list):
    """A call that runs `fn_of_copy(copy, x)` on the next of `copies` each time (defeats the 32 MB L3)."""
    state = {"i": 0}

    def call(x):
        state["i"] = (state["i"] + 1) % len(copies)
        return fn_of_copy(copies[state["i"]], x)

    return call


def bench_kernels(n: int, k: int, rows: list[int], bw: float) -> None:
    w = (torch.randn(n, k, generator=torch.Generator().manual_seed(0)) / k**0.5).bfloat16()
    dense = [Linear(w.clone()) for _ in range(2)]
    for lin in dense:
        lin.pack()
    q8 = quantise_weight(w, QuantRecipe("int8"), "w")
    q4 = quantise_weight(w, QuantRecipe("int4", 128), "w")
    # enough copies of each that one round reads >= 128 MB, so no call finds its weight in the cache
    n8, n4 = -(-(128 << 20) // q8.nbytes), -(-(128 << 20) // q4.nbytes)
    c8 = [Int8Weight(q8.q.clone(), q8.scales.clone()) for _ in range(n8)]
    c4 = [Int4Weight(q4.packed.clone(), q4.scales_and_zeros.clone(), 128, (n, k)) for _ in range(n4)]
    paths = {
        "bf16 oneDNN": (rotating(lambda lin, x: lin(x), dense), n * k * 2),
        "int8 kernel": (rotating(Int8Weight.kernel_matmul, c8), q8.nbytes),
        "int8 dense": (rotating(Int8Weight.dense_matmul, c8), q8.nbytes),
        "int4 kernel": (rotating(Int4Weight.kernel_matmul, c4), q4.nbytes),
        "int4 dense": (rotating(Int4Weight.dense_matmul, c4), q4.nbytes),
    }
    print(f"\n1. kernels: one {n} x {k} linear, bf16 activations; floor = weight bytes / {bw:.1f} GB/s")
    print("rows  path          ms/call  floor ms  of floor    GB/s  vs bf16  (the model uses)")
    for m in rows:
        x = torch.randn(m, k).bfloat16()
        reps = 5 if m <= 16 else 2
        base = None
        for name, (fn, nbytes) in paths.items():
            ms = best_ms(lambda: fn(x), reps)  # noqa: B023
            base = base or ms
            floor = nbytes / (bw * 1e9) * 1e3
            mode = name.split()[0]
            used = mode == "bf16" or (name.endswith("dense") == (m >= DEQUANTISE_FROM_ROWS[mode]))
            print(
                f"{m:4d}  {name:<12} {ms:8.2f} {floor:9.2f} {floor / ms:9.0%} {nbytes / ms / 1e6:7.1f} "
                f"{base / ms:7.2f}x  {'*' if used else ''}",
                flush=True,
            )


def linear_shapes(config: str) -> dict[str, tuple[int, int]]:
    """[out, in] of each distinct linear of a published text config, fused as `alpamayo.text` runs them."""
    t = json.loads((CONFIG_DIR / f"{config}.json").read_text())["text_config"]
    h, i, d = t["hidden_size"], t["intermediate_size"], t["head_dim"]
    q, kv = t["num_attention_heads"] * d, t["num_key_value_heads"] * d
    return {
        "qkv": (q + 2 * kv, h),
        "o": (h, q),
        "gate_up": (2 * i, h),
        "down": (h, i),
        "head": (t["vocab_size"], h),
    }


def bench_shapes(configs: list[str]) -> None:
    print(
        "\n1b. every linear shape of the text backbones at M = 1, bf16 activations; GB/s = bytes read / time"
    )
    print(
        "shape  linear       N x K          bf16 ms   GB/s  int8 ms   GB/s  vs bf16  int4 ms   GB/s  vs bf16"
    )
    g = torch.Generator().manual_seed(0)
    for key in configs:
        for name, (n, k) in linear_shapes(CONFIGS[key]).items():
            # random codes and scales: the kernels' speed does not depend on the values, and quantising a
            # 151936-row head in float32 would need several GB of temporaries
            w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
            copies = max(2, -(-(128 << 20) // (n * k)))  # >= 128 MB of int8 a round: no call hits the L3
            dense = [Linear(w if c == 0 else w.clone()) for c in range(max(1, copies // 2))]
            for lin in dense:
                lin.pack()
            del w
            scales = torch.rand(n, generator=g).bfloat16() / 100
            c8 = [
                Int8Weight(torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8), scales)
                for _ in range(copies)
            ]
            codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
            sz = (torch.rand(k // 128, n, 2, generator=g) / 100).bfloat16()
            q4 = Int4Weight.from_codes(codes, sz, 128)
            del codes
            c4 = [q4] + [
                Int4Weight(q4.packed.clone(), q4.scales_and_zeros.clone(), 128, (n, k))
                for _ in range(2 * copies - 1)
            ]
            x = torch.randn(1, k, generator=g).bfloat16()
            reps = 3 if n * k > 1e8 else 9
            ms = [
                best_ms(lambda: fn(x), reps)  # noqa: B023
                for fn in (
                    rotating(lambda lin, v: lin(v), dense),
                    rotating(Int8Weight.kernel_matmul, c8),
                    rotating(Int4Weight.kernel_matmul, c4),
                )
            ]
            rates = [n * k * 2 / ms[0] / 1e6, c8[0].nbytes / ms[1] / 1e6, q4.nbytes / ms[2] / 1e6]
            print(
                f"{key:<6} {name:<8} {n:>7} x {k:<5} {ms[0]:9.2f} {rates[0]:6.1f} {ms[1]:8.2f} {rates[1]:6.1f} "
                f"{ms[0] / ms[1]:7.2f}x {ms[2]:8.2f} {rates[2]:6.1f} {ms[0] / ms[2]:7.2f}x",
                flush=True,
            )
            del dense, c8, c4, q4


def decode_split(model: TextModel, steps: int = 4) -> tuple[float, float]:
    """(ms in the linears' kernels, ms in the rest) per decode step, both from one profiled run of `steps`
    steps after a 16-token prefill: the kernels' self time (`LINEAR_OPS`) and the step's wall time minus it
    (the rest carries the profiler's own cost of ~100 small ops a layer, so it reads a little high)."""
    model.setup_cache(16 + steps + 1)
    model.prefill(torch.arange(16))
    model.decode(1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            model.decode(1)
        wall = (time.perf_counter() - t) * 1e3 / steps
    linears = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in LINEAR_OPS) / 1e3 / steps
    return linears, wall - linears


def bench_models(args: argparse.Namespace, bw: float) -> None:
    """Section 2: every recipe's model loaded side by side, then `--rounds` rounds that each run every model's
    prefill and decode in turn, medians per recipe: on this shared machine a load burst or a frequency change
    then hits every recipe's figures alike instead of one recipe's run (measured with one model after the
    other: the 8B bf16 decode read 498.8 ms/token where its profiled step took 261)."""
    print(
        f"\n2. text backbone, {args.layers} layers, prompt {args.prompt}, {args.new} decode steps, "
        f"{args.rounds} interleaved round(s), medians"
    )
    print(
        "shape  recipe     weights GB  decode ms/tok  floor ms  of floor  vs bf16  linears ms  rest ms  "
        "prefill tok/s  vs bf16"
    )
    g = torch.Generator().manual_seed(0)
    for key in args.configs:
        config = CONFIGS[key]
        with tempfile.TemporaryDirectory() as tmp:
            save_random_checkpoint(config, Path(tmp), torch.bfloat16, {"num_hidden_layers": args.layers})
            models = {
                recipe.name or name: TextModel.from_checkpoint(tmp, dtype=torch.bfloat16, quant=recipe)
                for name, recipe in recipes(args.quant_head).items()
            }
            vocab = next(iter(models.values())).cfg.text.vocab_size
            ids = torch.randint(0, vocab, (args.prompt,), generator=g)
            forced = torch.randint(0, vocab, (args.new,), generator=g)
            runs: dict[str, list[dict]] = {name: [] for name in models}
            for _ in range(args.rounds):
                for name, model in models.items():
                    runs[name].append(bench_model(model, ids, forced, 1))
            base = None
            for name, model in models.items():
                decode_ms = statistics.median(r["decode_ms"] for r in runs[name])
                tps = args.prompt / statistics.median(r["prefill_s"] for r in runs[name])
                nbytes = decode_bytes(model)
                floor = nbytes / (bw * 1e9) * 1e3
                base = base or (decode_ms, tps)
                linears, rest = decode_split(model)
                print(
                    f"{key:<6} {name:<10} {nbytes / 1e9:10.3f} "
                    f"{decode_ms:14.1f} {floor:9.1f} {floor / decode_ms:9.0%} "
                    f"{base[0] / decode_ms:8.2f}x {linears:11.1f} {rest:8.1f} "
                    f"{tps:14.0f} {tps / base[1]:8.2f}x",
                    flush=True,
                )
            del models


def bench_long_prefill(args: argparse.Namespace) -> None:
    print(f"\n2b. prefill of a {args.long_prompt}-token prompt, {args.long_layers} layers")
    print("shape  recipe     prefill s  tok/s  vs bf16")
    g = torch.Generator().manual_seed(1)
    for key in args.configs:
        with tempfile.TemporaryDirectory() as tmp:
            save_random_checkpoint(
                CONFIGS[key], Path(tmp), torch.bfloat16, {"num_hidden_layers": args.long_layers}
            )
            base = None
            for name, recipe in recipes(args.quant_head).items():
                model = TextModel.from_checkpoint(tmp, dtype=torch.bfloat16, quant=recipe)
                ids = torch.randint(0, model.cfg.text.vocab_size, (args.long_prompt,), generator=g)
                model.setup_cache(args.long_prompt)
                model.prefill(ids[:64])  # warm-up
                s = best_ms(lambda m=model: m.prefill(ids), args.rounds) / 1e3  # noqa: B023
                base = base or s
                print(
                    f"{key:<6} {recipe.name or name:<10} {s:9.2f} {args.long_prompt / s:6.0f} {base / s:7.2f}x",
                    flush=True,
                )
                del model


def bench_expert(args: argparse.Namespace) -> None:
    vlm = vlm_model(args.layers, torch.bfloat16, torch.device("cpu"))
    cfg = parse_expert_config(RELEASE_10B_EXPERT, vlm.cfg.raw_text_config)
    weights = {k: v.to(torch.bfloat16) for k, v in random_expert_weights(cfg, seed=0).items()}
    k = args.samples
    fill_cache(vlm, k, args.expert_prefix)
    x0 = torch.randn(k, 64, 2, generator=torch.Generator().manual_seed(2))
    print(
        f"\n3. action expert (2.3B shape, {args.layers} layers), one flow step at K = {k} "
        f"({k} x 64 tokens), over a {args.expert_prefix}-position cache"
    )
    print("recipe     linears GB  ms/step  vs bf16")
    base = None
    with tempfile.TemporaryDirectory() as tmp:
        save_file(weights, Path(tmp) / "model.safetensors")
        # the released expert's MLP is 8256 wide: 128 does not divide it, 64 does
        for name, recipe in recipes(args.quant_head, group=64).items():
            expert = load_expert(tmp, cfg, vlm.text_cfg, torch.bfloat16, "cpu", quant=recipe)
            decoder = ExpertDecoder(expert, FlowSettings(steps=1))
            offsets = [args.expert_prefix - 3 * i for i in range(k)]
            ctx = expert.context(vlm.cache, offsets, vlm.rope_delta, vlm.cache_len)
            ms = best_ms(lambda: decoder.sample(ctx, noise=x0), args.rounds)  # noqa: B023
            base = base or ms
            print(
                f"{recipe.name or name:<10} {decode_bytes(expert) / 1e9:10.3f} {ms:8.1f} {base / ms:7.2f}x",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS), help="text shapes")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--long-prompt", type=int, default=3000, help="also prefill a prompt this long (0: no)")
    ap.add_argument("--long-layers", type=int, default=2, help="decoder layers for --long-prompt")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--shape", type=int, nargs=2, default=[12288, 4096], metavar=("N", "K"))
    ap.add_argument("--samples", type=int, default=6, help="expert: K samples")
    ap.add_argument("--expert-prefix", type=int, default=1024, help="expert: cached VLM positions")
    ap.add_argument("--quant-head", action="store_true", help="quantise the heads too")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--skip", nargs="+", default=[], choices=["kernels", "shapes", "models", "expert"])
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    bw = copy_bandwidth_gbs()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, copy bandwidth {bw:.1f} GB/s")
    if "kernels" not in args.skip:
        bench_kernels(*args.shape, args.rows, bw)
    if "shapes" not in args.skip:
        bench_shapes(args.configs)
    if "models" not in args.skip:
        bench_models(args, bw)
        if args.long_prompt:
            bench_long_prefill(args)
    if "expert" not in args.skip:
        bench_expert(args)


if __name__ == "__main__":
    main()
