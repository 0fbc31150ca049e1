"""Action-expert sampling speed: the project's expert vs an HF-composed reference, and vs the 128-token
discrete trajectory decoder, side by side in one process on the same random weights.

Shapes: the 8B VLM text model (hidden 4096, 8 KV heads x 128, MLP 12288, vocab 155697, tied head) and the
released 2.3B expert (`expert_cfg` hidden 2048, 16 heads, MLP 8256; in-projection 2 x 512), both cut to
`--layers` decoder layers (the expert has as many as the VLM) so that the 2-core machine can run them. The VLM
cache holds `--prefix` positions per row (a 4-camera x 4-frame prompt plus reasoning is ~3.1k); its K/V are
random (neither path's cost depends on the values), so no prefill is timed.

  * ours: `ExpertDecoder.sample`, 10 Euler steps, K rows in one batch reading the cache in place;
  * HF-composed (NVIDIA's `step_fn`): transformers' `Qwen3VLTextModel` with the expert's overrides, fed
    `inputs_embeds`, 3-row position ids, the 4-D float mask and a `DynamicCache` holding the same K rows of
    the prefix, appended and cropped per step; the in- and out-projections are the project's (their cost is
    negligible: 60 -> 512 -> 512 -> 2048 per token);
  * tokens: 128 decode steps of the VLM for K rows (the discrete decoder's trajectory phase).

    python benchmarks/action_expert.py [--layers 2] [--prefix 3100] [--samples 1 6] [--rounds 2] [--dtype bfloat16]
        [--no-tokens] [--floor] [--device cpu|cuda[:N] [--cuda-graph]]

`--floor` also times the step's bare matmuls (`matmul_floor_s`): the FLOPs any exact implementation must run,
so on a GEMM-bound machine no implementation beats the reference by more than reference / floor. `--device
cuda` runs all of it on a GPU (each timing waits for the device), `--cuda-graph` replays our step as the captured
graph of `alpamayo.expert.cuda_graph`; the measurement the >= 2x goal asks for is
`--device cuda --cuda-graph --layers 36 --no-tokens` (not yet run: no GPU was lent to the tasks so far).

Measured (defaults, 1 thread, fastest of 2; the 2-core CPU idle, load < 1.5; `--no-tokens --floor`):
    K=1: ours 1366 ms (137 ms/step), HF-composed 1589 ms (159 ms/step): 1.16x; bare matmuls 114 ms/step
    K=6: ours 7651 ms (765 ms/step), HF-composed 10267 ms (1027 ms/step): 1.34x; bare matmuls 615 ms/step,
         so at most 1.67x over HF-composed here; ours runs at 1.24x the bare matmuls
An earlier run on the same machine under a load of ~12 (other jobs) gave K=1 2.25x and K=6 1.01x, and the
128-token decoder 106 s at K=1 (828 ms/token: the 155697-row head dominates), 24x slower than the expert.
At K=6 both paths are bound by the same oneDNN bf16 matmuls (384 tokens through every layer's projections and
MLP, plus attention over 3164 keys), so the >= 2x goal at K=6 cannot be met on this CPU by any exact
implementation; a GPU, where a step is launch- and memory-bound and the reference's per-step cache copy costs
the most, was not available to measure. The printed "actions max abs diff" is large in bfloat16 because random
weights make the flow field chaotic (rounding differences grow each step); in float32 one step agrees to 1.2e-6
(`--dtype float32 --steps 1`), and the golden tests pin the maths.

On the shared 2-core machine use one thread (the default): with 2 threads and other jobs on the cores, one
elementwise op on [64, 2048] took 4-15 ms instead of 0.1-0.3 ms (threads wait for each other, load average 12).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import DynamicCache, Qwen3VLTextConfig, Qwen3VLTextModel

from alpamayo.config.builtin import CONFIG_DIR
from alpamayo.config.expert import RELEASE_10B_EXPERT, parse_expert_config
from alpamayo.config.flow import FlowSettings
from alpamayo.config.model import parse_config
from alpamayo.demo_checkpoint import random_weights
from alpamayo.devices import DTYPES, resolve_device
from alpamayo.expert.decoding import ExpertDecoder
from alpamayo.expert.demo import random_expert_weights
from alpamayo.expert.weights import load_expert
from alpamayo.text import TextModel
from alpamayo.text.weights import text_tensor_shapes

VOCAB = 155697  # Alpamayo 1.5's vocabulary (Qwen3-VL + 4000 trajectory bins + markers)
N_TOKENS = 64


def vlm_model(layers: int, dtype: torch.dtype, device: torch.device) -> TextModel:
    """The 8B text model with `layers` layers and random weights, built in memory (no checkpoint file)."""
    raw = json.loads((CONFIG_DIR / "qwen3-vl-8b.json").read_text())
    raw["text_config"].update(num_hidden_layers=layers, vocab_size=VOCAB)
    raw["tie_word_embeddings"] = True
    cfg = parse_config(raw)
    return TextModel.from_weights(cfg, random_weights(text_tensor_shapes(cfg), 0, dtype, device))


def fill_cache(model: TextModel, rows: int, prefix: int) -> None:
    """A cache of `rows` rows with `prefix` random positions, as after the prompt and the reasoning."""
    model.setup_cache(prefix + 2 * N_TOKENS + 130, rows)
    g = torch.Generator().manual_seed(1)
    for buf in (*model.cache.k, *model.cache.v):
        buf.copy_(torch.randn(buf.shape, generator=g).to(buf.device, buf.dtype))
    model.lengths, model.rope_delta = [prefix] * rows, -900  # every row holds the prefix


def hf_expert(cfg, weights: dict, dtype: torch.dtype, device: torch.device) -> Qwen3VLTextModel:
    """transformers' expert in `dtype` with its rotary table kept in float32, as `from_pretrained(dtype=...)`
    keeps it (a plain `.to(bfloat16)` rounds `inv_freq` too, which at positions ~3000 moves the RoPE angles
    enough to change the sampled actions by O(1))."""
    model = Qwen3VLTextModel(Qwen3VLTextConfig(**cfg.text_dict)).eval()
    del model.embed_tokens
    model.load_state_dict({k[len("expert.") :]: v for k, v in weights.items() if k.startswith("expert.")})
    inv_freq = model.rotary_emb.inv_freq.clone()
    model.to(device, dtype)
    model.rotary_emb.inv_freq = inv_freq.to(device)
    return model


class HFComposed:
    """NVIDIA's step_fn over transformers' Qwen3VLTextModel, with the project's in/out projections."""

    def __init__(self, cfg, weights: dict, expert, dtype: torch.dtype):
        self.model = hf_expert(cfg, weights, dtype, expert.device)
        self.in_proj, self.out_proj = expert.in_proj, expert.out_proj

    @torch.inference_mode()
    def sample(self, cache: DynamicCache, pos, mask, x0, steps: int):
        prefill = cache.get_seq_length()
        x, ts = x0.clone(), torch.linspace(0, 1, steps + 1, device=x0.device)
        for i in range(steps):
            t = ts[i].expand(x.shape[0])
            out = self.model(
                inputs_embeds=self.in_proj(x, t), position_ids=pos, past_key_values=cache, attention_mask=mask,
                use_cache=True, is_causal=False,
            )  # fmt: skip
            cache.crop(prefill - cache.get_seq_length())
            v = self.out_proj(out.last_hidden_state[:, -N_TOKENS:])
            x = x + (ts[i + 1] - ts[i]).view(1, 1, 1) * v
        return x


def matmul_floor_s(
    t, rows: int, prefix: int, dtype: torch.dtype, device: torch.device, steps: int, rounds: int
) -> float:
    """Seconds for the bare matmuls of `steps` expert steps, nothing else: per layer the q/k/v/o projections
    and the MLP (gate+up, down) on rows x 64 tokens, and attention's two matmuls per row and KV head over the
    prefix plus the 64 own positions (query heads of a KV group stacked, as the project does). Any exact
    implementation of the step runs at least these FLOPs; on a GEMM-bound machine this bounds its time."""
    g = torch.Generator().manual_seed(3)
    m, groups, keys = rows * N_TOKENS, t.num_attention_heads // t.num_key_value_heads, prefix + N_TOKENS

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device, dtype)

    x, inner = rand(m, t.hidden_size), rand(m, t.intermediate_size)
    shapes = [(t.q_dim, t.hidden_size), (t.kv_dim, t.hidden_size), (t.kv_dim, t.hidden_size)]
    shapes += [(t.hidden_size, t.q_dim), (2 * t.intermediate_size, t.hidden_size)]
    projections = [rand(*s) for s in shapes]
    down = rand(t.hidden_size, t.intermediate_size)
    q = rand(rows * t.num_key_value_heads, groups * N_TOKENS, t.head_dim)
    k, v = (
        rand(rows * t.num_key_value_heads, keys, t.head_dim),
        rand(rows * t.num_key_value_heads, keys, t.head_dim),
    )

    @torch.inference_mode()
    def run():
        for _ in range(steps * t.num_hidden_layers):
            for w in projections:
                torch.nn.functional.linear(x, w)
            torch.nn.functional.linear(inner, down)
            torch.bmm(torch.bmm(q, k.transpose(1, 2)), v)

    return best_s(run, rounds, device)


def best_s(fn, rounds: int, device: torch.device) -> float:
    """Fastest of `rounds` (the shared machine slows single runs; the fastest is the closest to the cost); on
    CUDA each round ends when the device has finished its work."""

    def finish() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times = []
    for _ in range(rounds):
        finish()
        t = time.perf_counter()
        fn()
        finish()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prefix", type=int, default=3100)
    ap.add_argument("--samples", type=int, nargs="+", default=[1, 6])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--no-tokens", action="store_true", help="skip the 128-token decoder")
    ap.add_argument(
        "--floor", action="store_true", help="also time the step's bare matmuls (see matmul_floor_s)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (see above)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (both paths and the floor run there)")
    ap.add_argument(
        "--cuda-graph", action="store_true", help="on CUDA, replay our velocity step as a captured CUDA graph"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype, device = DTYPES[args.dtype], resolve_device(args.device)
    vlm = vlm_model(args.layers, dtype, device)
    cfg = parse_expert_config(RELEASE_10B_EXPERT, vlm.cfg.raw_text_config)
    weights = {k: v.to(dtype) for k, v in random_expert_weights(cfg, seed=0).items()}
    with tempfile.TemporaryDirectory() as tmp:
        save_file(weights, Path(tmp) / "model.safetensors")
        expert = load_expert(tmp, cfg, vlm.text_cfg, dtype, device)
    hf = HFComposed(cfg, weights, expert, dtype)
    decoder = ExpertDecoder(expert, FlowSettings(steps=args.steps), cuda_graph=args.cuda_graph)
    where = (
        f"torch threads {torch.get_num_threads()}"
        if device.type == "cpu"
        else torch.cuda.get_device_name(device)
    )
    graph = ", our step a CUDA graph" if args.cuda_graph and device.type == "cuda" else ""
    print(
        f"{args.layers} layers of the 8B VLM + 2.3B expert, {args.dtype}, prefix {args.prefix}, {args.steps} steps, "
        f"{device}: {where}{graph}, fastest of {args.rounds}"
    )
    for k in args.samples:
        fill_cache(vlm, k, args.prefix)
        offsets = [args.prefix - 3 * i for i in range(k)]  # rows whose reasoning ended at different lengths
        ctx = expert.context(vlm.cache, offsets, vlm.rope_delta, vlm.cache_len)
        hf_cache = DynamicCache()
        for i, (kk, vv) in enumerate(zip(ctx.keys, ctx.values, strict=True)):
            hf_cache.update(kk.clone(), vv.clone(), i)
        pos = ctx.positions[None].expand(3, -1, -1)
        mask = torch.zeros(k, 1, N_TOKENS, args.prefix + N_TOKENS, dtype=dtype, device=device)
        for i, off in enumerate(offsets):
            mask[i, :, :, off : args.prefix] = torch.finfo(dtype).min
        x0 = torch.randn(k, N_TOKENS, 2, generator=torch.Generator().manual_seed(2)).to(device)
        ours_out = decoder.sample(ctx, noise=x0)
        hf_out = hf.sample(hf_cache, pos, mask, x0, args.steps)
        err = float((ours_out - hf_out).abs().max())
        ours = best_s(lambda: decoder.sample(ctx, noise=x0), args.rounds, device)  # noqa: B023
        ref = best_s(lambda: hf.sample(hf_cache, pos, mask, x0, args.steps), args.rounds, device)  # noqa: B023
        line = (
            f"K={k}: ours {ours * 1e3:8.1f} ms ({ours / args.steps * 1e3:7.1f} ms/step), HF-composed "
            f"{ref * 1e3:8.1f} ms ({ref / args.steps * 1e3:7.1f} ms/step): {ref / ours:5.2f}x; "
            f"actions max abs diff {err:.2e}"
        )
        if args.floor:
            floor = matmul_floor_s(cfg.text, k, args.prefix, dtype, device, args.steps, args.rounds)
            line += (
                f"; bare matmuls {floor / args.steps * 1e3:7.1f} ms/step (ours at {ours / floor:4.2f}x of them, "
                f"at most {ref / floor:4.2f}x over HF-composed on this machine)"
            )
        if not args.no_tokens:
            ids = torch.zeros(k, dtype=torch.long, device=device)

            def tokens():
                vlm.cache_len = args.prefix
                for _ in range(128):
                    vlm.decode(ids)  # noqa: B023

            tok = best_s(tokens, 1, device)
            line += f"; 128-token decoder {tok * 1e3:8.1f} ms ({tok / 128 * 1e3:6.1f} ms/token): {tok / ours:5.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
