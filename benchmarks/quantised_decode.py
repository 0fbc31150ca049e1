"""Weight-only int8 / int4 against bf16 on this CPU: decode ms/token against each recipe's bandwidth floor,
and prefill tokens/s, at the Qwen3-VL-2B and -8B text shapes with the layers cut.

A random-weight checkpoint of each shape (vision shrunk, `--layers` decoder layers) is written once in bf16;
every recipe loads it (`TextModel.from_checkpoint(..., quant=...)`, quantised at load). The floor of a recipe
is the bytes one decode step reads (each linear's stored bytes: bf16, or int8 codes + scales, or packed int4
+ scales and zeros; the head stays bf16) over the STREAM-copy bandwidth measured in the same process.

    python benchmarks/quantised_decode.py [--layers 4] [--prompt 128] [--new 16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from text_backbone import bench_model, copy_bandwidth_gbs, save_random_checkpoint

from alpamayo.quant import QuantRecipe
from alpamayo.text import TextModel
from alpamayo.text.linear import Linear

RECIPES = {"bf16": QuantRecipe(), "int8": QuantRecipe("int8"), "int4-g128": QuantRecipe("int4", 128)}


def decode_bytes(model: TextModel) -> int:
    """Bytes one decode step reads: every linear's stored weight (quantised or not) once."""
    total = 0
    for m in model.modules():
        if isinstance(m, Linear):
            total += m.quantised.nbytes if m.quantised is not None else m.out_features * m.in_features * 2
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    bw = copy_bandwidth_gbs()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, copy bandwidth {bw:.1f} GB/s")
    print("shape  recipe     weights GB  decode ms/tok  floor ms  of floor  vs bf16  prefill tok/s  vs bf16")
    g = torch.Generator().manual_seed(0)
    for config in ("qwen3-vl-2b", "qwen3-vl-8b"):
        with tempfile.TemporaryDirectory() as tmp:
            save_random_checkpoint(config, Path(tmp), torch.bfloat16, {"num_hidden_layers": args.layers})
            base = None
            for name, recipe in RECIPES.items():
                model = TextModel.from_checkpoint(tmp, dtype=torch.bfloat16, quant=recipe)
                vocab = model.cfg.text.vocab_size
                ids = torch.randint(0, vocab, (args.prompt,), generator=g)
                forced = torch.randint(0, vocab, (args.new,), generator=g)
                r = bench_model(model, ids, forced, args.rounds)
                nbytes = decode_bytes(model)
                floor = nbytes / (bw * 1e9) * 1e3
                tps = args.prompt / r["prefill_s"]
                base = base or (r["decode_ms"], tps)
                print(
                    f"{config.removeprefix('qwen3-vl-'):<6} {name:<10} {nbytes / 1e9:10.3f} {r['decode_ms']:14.1f} {floor:9.1f} "
                    f"{floor / r['decode_ms']:9.0%} {base[0] / r['decode_ms']:8.2f}x {tps:14.0f} "
                    f"{tps / base[1]:8.2f}x",
                    flush=True,
                )
                del model


if __name__ == "__main__":
    main()
