"""MoE decode speed: the sparse path (k of E experts per token) vs the same layers computed densely (all E).

A random-weight checkpoint with the Qwen3-VL-30B-A3B text shape but 64 experts (top-8, hidden 2048, expert
width 768; `--layers` decoder layers, all sparse; the vision tower is shrunk, it is not timed) is saved with
`save_pretrained` and loaded once. Measured, one thread count, the fastest of `--rounds` (the shared 2-core
development machine slows single runs by up to 6x when other jobs run, e.g. one decode step at 43 vs 244 ms
in consecutive runs; the fastest round is the closest to the uncontended cost):
  * one MoE layer on one token: the sparse block vs every expert on the token (unchosen ones weighted 0),
    with the weight bytes each must read and the bandwidth that implies: equal GB/s at E/k times the speed
    means the sparse path reads only the chosen experts;
  * a whole decode step (ms/token, teacher-forced on transformers' greedy tokens): sparse, all-experts, and
    transformers' own `generate` on the same weights (skip with --no-transformers).

    python benchmarks/moe_decode.py [--layers 4] [--experts 64] [--top-k 8] [--dtype bfloat16] [--json FILE]

Measured with the defaults (bfloat16, 2 AVX512-BF16 cores, machine otherwise idle; two runs):
    one MoE layer, one token: sparse 3.87 / 4.03 ms (75.5 MB of experts, 19.5 / 18.7 GB/s), all experts
        26.6 / 28.3 ms (604 MB, 22.7 / 21.3 GB/s): 6.9x / 7.0x for E/k = 8x. Of the sparse call, 3.6 ms is
        the 8 expert matmuls themselves; router, dispatch and combine take 0.06, 0.04 and 0.03 ms.
    decode step, 4 layers: sparse 43.0 / 44.2 ms/token, all experts 153.3 / 143.7 (3.6x / 3.3x: both also
        read the 622 MB untied head), transformers 75.5 / 80.6 (1.75x / 1.82x slower than sparse).
    Logits: sparse == all experts (PCC 1.000000); one MoE layer is bit-identical to transformers' at this
        shape in bfloat16 and float32; teacher-forced decode vs transformers' generate min PCC 0.998749 over
        32 steps, the difference coming from decode-step rounding outside the MoE block.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from text_backbone import bench_model, bench_transformers, copy_bandwidth_gbs, save_random_checkpoint, timed
from torch import nn

from alpamayo.devices import DTYPES
from alpamayo.numerics import pcc
from alpamayo.text import TextModel
from alpamayo.text.moe.block import SparseMoE


class AllExperts(nn.Module):
    """A sparse layer computed densely: the same router, then every expert on every token, unchosen ones
    weighted 0. Reads all E experts per token, as a dense (all-ones sparsity) kernel would."""

    def __init__(self, moe: SparseMoE):
        super().__init__()
        self.moe = moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        scores, ids = self.moe.router(flat)
        block = self.moe.block
        dense = scores.new_zeros(flat.shape[0], block.config.num_routed_experts).scatter_(1, ids, scores)
        # products in the model dtype, then one sum over experts: the sparse block's combine
        weighted = [
            dense[:, e : e + 1] * expert(flat)
            for e, expert in zip(block.storage_ids, block.experts, strict=True)
        ]
        return torch.stack(weighted, 1).sum(1).view(x.shape)


def expert_bytes(model: TextModel) -> int:
    """Bytes of one expert's weights (gate, up and down) in the model dtype."""
    moe = model.text_cfg.moe
    return 3 * model.text_cfg.hidden_size * moe.moe_intermediate_size * model.dtype.itemsize


def time_layers(layers: dict[str, nn.Module], tokens: torch.Tensor, rounds: int) -> dict[str, float]:
    """Fastest round's mean ms per one-token call, cycling through `tokens` [n, 1, H] so routing varies.

    The layers take turns call by call, so load from other processes on a shared machine hits them alike.
    """
    times = {name: [0.0] * rounds for name in layers}
    with torch.inference_mode():
        for layer in layers.values():
            layer(tokens[0])  # warm-up
        for r in range(rounds):
            for t in tokens:
                for name, layer in layers.items():
                    times[name][r] += timed(lambda layer=layer, t=t: layer(t))[1] / len(tokens)
    return {name: min(t) * 1e3 for name, t in times.items()}


def bench_steps(model: TextModel, ids: torch.Tensor, forced: torch.Tensor, rounds: int) -> dict[str, dict]:
    """`bench_model` for the sparse and the all-experts model, taking turns round by round (fastest round)."""
    runs: dict[str, list[dict]] = {"sparse": [], "all experts": []}
    for _ in range(rounds):
        for name in runs:
            set_dense(model, name == "all experts")
            runs[name].append(bench_model(model, ids, forced, 1))
    set_dense(model, False)
    return {
        name: {"decode_ms": min(r["decode_ms"] for r in rs), "logits": rs[0]["logits"]}
        for name, rs in runs.items()
    }


def set_dense(model: TextModel, dense: bool) -> None:
    """Swap every sparse layer's MLP between the sparse block and its all-experts version."""
    for layer in model.layers:
        if dense and isinstance(layer.mlp, SparseMoE):
            layer.mlp = AllExperts(layer.mlp)
        elif not dense and isinstance(layer.mlp, AllExperts):
            layer.mlp = layer.mlp.moe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="repeats per measurement; the fastest is reported (transformers: the median)",
    )
    ap.add_argument("--no-transformers", action="store_true", help="skip transformers' generate")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    overrides = dict(num_hidden_layers=args.layers, num_experts=args.experts, num_experts_per_tok=args.top_k)
    ids = torch.randint(0, 150_000, (args.prompt,), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        _, build = timed(lambda: save_random_checkpoint("qwen3-vl-30b-a3b", path, dtype, overrides))
        print(
            f"random qwen3-vl-30b-a3b checkpoint, {args.layers} layers, {args.experts} experts, top-{args.top_k} "
            f"({args.dtype}) saved in {build:.0f} s; {torch.get_num_threads()} threads"
        )
        hf = None
        if not args.no_transformers:
            hf = bench_transformers(path, dtype, ids, args.new, args.rounds)
        forced = (
            hf["tokens"]
            if hf
            else torch.randint(0, 150_000, (args.new,), generator=torch.Generator().manual_seed(3))
        )
        model = TextModel.from_checkpoint(path, dtype=dtype)

    hidden = model.text_cfg.hidden_size
    tokens = torch.randn(16, 1, 1, hidden, generator=torch.Generator().manual_seed(2)).to(dtype)
    sparse_layer = model.layers[0].mlp
    layer_ms = time_layers(
        {"sparse": sparse_layer, "all experts": AllExperts(sparse_layer)}, tokens, args.rounds
    )
    per_expert = expert_bytes(model)
    layer_bytes = {"sparse": args.top_k * per_expert, "all experts": args.experts * per_expert}

    step = bench_steps(model, ids, forced, args.rounds)

    print(f"\none MoE layer, one token  {'ms':>8s} {'expert MB':>10s} {'GB/s':>6s}")
    for name, ms in layer_ms.items():
        print(f"  {name:22s} {ms:8.2f} {layer_bytes[name] / 1e6:10.1f} {layer_bytes[name] / ms / 1e6:6.1f}")
    layer_ratio = layer_ms["all experts"] / layer_ms["sparse"]
    print(
        f"  all experts / sparse: {layer_ratio:.2f}x (E/k = {args.experts / args.top_k:.0f}x); copy bandwidth "
        f"{copy_bandwidth_gbs():.1f} GB/s"
    )
    print(f"\ndecode step ({args.layers} layers)  {'ms/token':>9s}")
    rows = [(name, r["decode_ms"]) for name, r in step.items()]
    if hf:
        rows.append(("transformers", hf["decode_ms"]))
    for name, ms in rows:
        print(f"  {name:22s} {ms:9.1f}")
    step_ratio = step["all experts"]["decode_ms"] / step["sparse"]["decode_ms"]
    agree = min(
        pcc(a, b) for a, b in zip(step["sparse"]["logits"], step["all experts"]["logits"], strict=True)
    )
    print(
        f"  all experts / sparse: {step_ratio:.2f}x; min per-step logit PCC sparse vs all experts {agree:.6f}"
    )
    figures = {
        "layer_ms_sparse": layer_ms["sparse"],
        "layer_ms_all_experts": layer_ms["all experts"],
        "layer_ratio": layer_ratio,
        "step_ms_sparse": step["sparse"]["decode_ms"],
        "step_ms_all_experts": step["all experts"]["decode_ms"],
        "step_ratio": step_ratio,
    }
    if hf:
        hf_pcc = min(pcc(a, b) for a, b in zip(hf["logits"], step["sparse"]["logits"], strict=True))
        print(
            f"  transformers / sparse: {hf['decode_ms'] / step['sparse']['decode_ms']:.2f}x; min per-step logit "
            f"PCC vs transformers {hf_pcc:.6f}"
        )
        figures |= {"step_ms_transformers": hf["decode_ms"], "min_pcc_vs_transformers": hf_pcc}
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
