"""First contact with a GPU (`scripts/gpu-check`): the CUDA tests, then one Alpamayo-1.5-10B-shaped prediction
stage by stage at bf16, int8 and int4, plain and with a draft, beside the same work composed from
`transformers` the way NVIDIA's code runs it, on the same device in the same run, with the ratios; one report.

Shapes: the 1.5 VLM (Qwen3-VL-8B text, hidden 4096, 32/8 heads of 128, MLP 12288, tied 155697-row head; its
vision tower, hidden 1152, 27 blocks) and the released 2.3B action expert, random weights, the text and
expert layers (`--layers`, default `auto`: as many of the 36 as a quarter of the free device memory holds per
copy) and the vision blocks (`--vision-layers`) cut. Stages, each timed after a warm-up (the median of
`--rounds`; CUDA timings wait for the device):
  * vision: one 320x576 frame (720 patches): `vision.encoder.VisionEncoder` against transformers'
    `Qwen3VLVisionModel` on the same checkpoint;
  * prefill of `--prompt` tokens and decode ms/token over `--new` tokens at each recipe (`--quant` of the
    torch backend: bf16, int8, int4 group 128), against transformers' `Qwen3VLForConditionalGeneration`
    (bf16, `--prompt` tokens with a `DynamicCache`, then one token per forward, as `generate` runs it);
  * with a draft: one `TextModel.verify` of `--block` tokens (rolled back) per recipe, and the reasoning of
    `--reasoning` tokens plain (one decode step each) against speculative at `--accept-len` tokens per
    verify (a model-free draft: it costs the host nothing measurable);
  * the expert's 10 Euler steps at K = 1 per recipe (its linears quantised, group 64) against the
    HF-composed step of NVIDIA's `step_fn` (`benchmarks/action_expert.py`'s `HFComposed`).

Every stage has a timeout (`--stage-timeout`) inside a total budget (`--budget-s`, default 540 s: a lent H100
or H200 is available for 10 minutes); a stage that fails or runs out is recorded with the reason and the run
goes on, and the report (`--out`: report.json and report.md) is rewritten after every stage, so a run cut
short leaves everything measured so far. `--tiny` runs the same code at tiny shapes (CI runs it on the CPU).

    python benchmarks/gpu_check.py [--device cuda] [--out gpu-check] [--layers auto] [--vision-layers 4]
        [--prompt 3072] [--new 32] [--rounds 3] [--skip-tests] [--tiny]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/gpu_check.py` from anywhere
    sys.path.insert(0, str(ROOT))

from action_expert import N_TOKENS, HFComposed, fill_cache  # noqa: E402
from text_backbone import save_random_model  # noqa: E402

from alpamayo.config.builtin import CONFIG_DIR  # noqa: E402
from alpamayo.config.expert import RELEASE_10B_EXPERT, parse_expert_config  # noqa: E402
from alpamayo.config.flow import FlowSettings  # noqa: E402
from alpamayo.devices import resolve_device  # noqa: E402
from alpamayo.expert.decoding import ExpertDecoder  # noqa: E402
from alpamayo.expert.demo import random_expert_weights  # noqa: E402
from alpamayo.expert.weights import load_expert  # noqa: E402
from alpamayo.quant import QuantRecipe  # noqa: E402
from alpamayo.text import TextModel  # noqa: E402
from vision.encoder import VisionEncoder  # noqa: E402

VOCAB = 155697  # Alpamayo 1.5's vocabulary
FULL_LAYERS = 36
RECIPES = {"bf16": QuantRecipe(), "int8": QuantRecipe("int8"), "int4": QuantRecipe("int4", 128)}
EXPERT_GROUP = 64  # the released expert's MLP is 8256 wide: 64 divides it, 128 does not
TINY_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
)
TINY_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
TINY_EXPERT = {"hidden_size": 32, "num_attention_heads": 2, "head_dim": 16, "intermediate_size": 64}


class StageTimeout(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise StageTimeout in the main thread after `seconds` (SIGALRM: a CUDA call returns first)."""

    def fire(*_: Any) -> None:
        raise StageTimeout(f"over its {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def median_ms(fn: Callable[[], Any], rounds: int, device: torch.device) -> float:
    """Median ms of `fn` over `rounds` calls after one warm-up, waiting for the device each time."""
    fn()
    times = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


class Report:
    """report.json and report.md under `out`, rewritten after every stage."""

    def __init__(self, out: Path, run: dict[str, Any]):
        self.out, self.run, self.stages = out, run, []
        out.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, status: str, figures: dict[str, Any], seconds: float) -> None:
        self.stages.append({"stage": name, "status": status, "seconds": round(seconds, 1), **figures})
        self.write()

    def write(self) -> None:
        (self.out / "report.json").write_text(json.dumps({"run": self.run, "stages": self.stages}, indent=1))
        lines = [f"# gpu-check {self.run['date']}: {self.run['device_name']}", ""]
        lines += [f"- {k}: {v}" for k, v in self.run.items() if k not in ("date",)]
        lines += ["", "| stage | status | figures |", "|---|---|---|"]
        for s in self.stages:
            figures = ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in s.items()
                if k not in ("stage", "status")
            )
            lines.append(f"| {s['stage']} | {s['status']} | {figures} |")
        lines += ["", "ratios: the transformers composition's time over ours (> 1: ours is faster)."]
        (self.out / "report.md").write_text("\n".join(lines) + "\n")


def vlm_config(args: argparse.Namespace) -> Any:
    """transformers' config of the 1.5-shaped VLM, cut."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(CONFIG_DIR / "qwen3-vl-8b.json")
    text, vision = cfg.text_config, cfg.vision_config
    text.num_hidden_layers, text.vocab_size = args.layers, VOCAB
    cfg.tie_word_embeddings = True
    if args.tiny:
        for k, v in TINY_TEXT.items():
            setattr(text, k, v)
        for k, v in TINY_VISION.items():
            setattr(vision, k, v)
        text.rope_parameters = {**text.rope_parameters, "mrope_section": [4, 2, 2]}  # sums to head_dim / 2
    vision.depth = args.vision_layers if not args.tiny else TINY_VISION["depth"]
    vision.deepstack_visual_indexes = list(range(vision.depth))[-3:]
    text.bos_token_id = text.eos_token_id = None
    return cfg


def auto_layers(device: torch.device) -> int:
    """Text (and expert) layers whose bf16 weights, four copies (ours at each recipe one at a time, the
    transformers model, the expert pair) fit in a quarter of the free memory each."""
    if device.type != "cuda":
        return 2
    free, _ = torch.cuda.mem_get_info(device)
    per_layer = 2 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 12288)  # q/k/v, o, MLP at bf16
    expert_layer = 2 * (2048 * 4096 * 2 + 2 * 1024 * 2048 + 3 * 2048 * 8256)
    head = 2 * VOCAB * 4096
    return max(1, min(FULL_LAYERS, int((free / 4 - head) / (2 * per_layer + expert_layer))))


def run_tests(device: torch.device) -> dict[str, Any]:
    """The `cuda` tests (skipped on a CPU: they need a GPU)."""
    if device.type != "cuda":
        return {"note": "not run: no CUDA device"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return {"exit": proc.returncode, "summary": lines[-1] if lines else "no output"}


def vision_stage(path: Path, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from transformers import AutoModelForImageTextToText

    hf = (
        AutoModelForImageTextToText.from_pretrained(path, dtype=torch.bfloat16).model.visual.to(device).eval()
    )
    ours = VisionEncoder.from_checkpoint(path, dtype=torch.bfloat16, device=device)
    v = ours.cfg
    grid = torch.tensor([[1, 320 // v.patch_size, 576 // v.patch_size]])
    pixels = torch.randn(int(grid.prod()), v.patch_dim, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        theirs = median_ms(
            lambda: hf(pixels.to(device, torch.bfloat16), grid_thw=grid.to(device)), args.rounds, device
        )
    mine = median_ms(lambda: ours.encode(pixels, grid), args.rounds, device)
    return {"ours_ms": mine, "transformers_ms": theirs, "ratio": theirs / mine}


def hf_text_stage(path: Path, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """transformers' VLM at bf16: prefill with a DynamicCache, then one token per forward (generate's loop)."""
    from transformers import AutoModelForImageTextToText, DynamicCache

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    vocab = model.config.text_config.vocab_size
    ids = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1)).to(device)
    step = torch.zeros(1, 1, dtype=torch.long, device=device)
    state: dict[str, Any] = {}

    @torch.inference_mode()
    def prefill() -> None:
        state["cache"] = DynamicCache()
        model(input_ids=ids, past_key_values=state["cache"], use_cache=True, logits_to_keep=1)

    @torch.inference_mode()
    def decode() -> None:
        cache = state["cache"]
        if cache.get_seq_length() > args.prompt:
            cache.crop(args.prompt - cache.get_seq_length())  # back to the prompt (a negative crop drops)
        for _ in range(args.new):
            model(input_ids=step, past_key_values=cache, use_cache=True)

    prefill_ms = median_ms(prefill, args.rounds, device)
    decode_ms = median_ms(decode, args.rounds, device) / args.new
    return {"prefill_ms": prefill_ms, "decode_ms_per_token": decode_ms}


def ours_text_stage(
    path: Path, recipe: QuantRecipe, args: argparse.Namespace, device: torch.device, hf: dict[str, Any] | None
) -> dict[str, Any]:
    """Ours at `recipe`: prefill, decode, a verify block, and the reasoning plain against speculative."""
    model = TextModel.from_checkpoint(path, dtype=torch.bfloat16, device=device, quant=recipe)
    vocab = model.cfg.text.vocab_size
    ids = torch.randint(0, vocab, (args.prompt,), generator=torch.Generator().manual_seed(1))
    block = torch.zeros(1, args.block, dtype=torch.long)
    model.setup_cache(args.prompt + max(args.new, args.block) + 8)
    prefill_ms = median_ms(lambda: model.prefill(ids), args.rounds, device)

    def decode() -> None:
        model.rollback([args.prompt])
        for _ in range(args.new):
            model.decode(0)

    def verify() -> None:
        model.rollback([args.prompt])
        model.verify(block)

    model.prefill(ids)
    decode_ms = median_ms(decode, args.rounds, device) / args.new
    verify_ms = median_ms(verify, args.rounds, device)
    verifies = math.ceil(args.reasoning / args.accept_len)
    out = {
        "prefill_ms": prefill_ms,
        "decode_ms_per_token": decode_ms,
        f"verify_{args.block}_ms": verify_ms,
        f"reasoning_{args.reasoning}_plain_ms": decode_ms * args.reasoning,
        f"reasoning_with_draft_tau{args.accept_len:g}_ms": verify_ms * verifies,
    }
    if hf is not None:
        out["prefill_ratio"] = hf["prefill_ms"] / prefill_ms
        out["decode_ratio"] = hf["decode_ms_per_token"] / decode_ms
    return out


def expert_stage(path: Path, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """10 Euler steps at K = 1 per recipe, against the HF-composed step (bf16)."""
    vlm = TextModel.from_checkpoint(path, dtype=torch.bfloat16, device=device)
    raw = dict(RELEASE_10B_EXPERT)
    if args.tiny:
        raw = {
            **raw,
            "expert_cfg": TINY_EXPERT,
            "action_in_proj_cfg": {**raw["action_in_proj_cfg"], "hidden_size": 16},
        }
    cfg = parse_expert_config(raw, vlm.cfg.raw_text_config)
    weights = {k: v.to(torch.bfloat16) for k, v in random_expert_weights(cfg, seed=0).items()}
    prefix = args.prompt + args.reasoning
    fill_cache(vlm, 1, prefix)
    x0 = torch.randn(1, N_TOKENS, 2, generator=torch.Generator().manual_seed(2)).to(device)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        save_file(weights, Path(tmp) / "model.safetensors")
        for name, recipe in RECIPES.items():
            quant = QuantRecipe(recipe.mode, EXPERT_GROUP) if recipe.mode == "int4" else recipe
            expert = load_expert(tmp, cfg, vlm.text_cfg, torch.bfloat16, device, quant=quant)
            decoder = ExpertDecoder(expert, FlowSettings(steps=10))
            ctx = expert.context(vlm.cache, [prefix], vlm.rope_delta, vlm.cache_len)
            out[f"{name}_ms"] = median_ms(lambda: decoder.sample(ctx, noise=x0), args.rounds, device)  # noqa: B023
            if name == "bf16":
                from transformers import DynamicCache

                hf = HFComposed(cfg, weights, expert, torch.bfloat16)
                cache = DynamicCache()
                for i, (k, v) in enumerate(zip(ctx.keys, ctx.values, strict=True)):
                    cache.update(k.clone(), v.clone(), i)
                pos = ctx.positions[None].expand(3, -1, -1)
                mask = torch.zeros(1, 1, N_TOKENS, prefix + N_TOKENS, dtype=torch.bfloat16, device=device)
                out["transformers_ms"] = median_ms(
                    lambda hf=hf, cache=cache, pos=pos, mask=mask: hf.sample(cache, pos, mask, x0, 10),
                    args.rounds,
                    device,
                )
    out.update({f"{n}_ratio": out["transformers_ms"] / out[f"{n}_ms"] for n in RECIPES})
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda[:N] or cpu (CI: cpu with --tiny)")
    ap.add_argument("--out", type=Path, default=Path("gpu-check"))
    ap.add_argument("--layers", default="auto", help="text and expert layers (1.5: 36), or auto")
    ap.add_argument("--vision-layers", type=int, default=4, help="vision blocks (1.5: 27)")
    ap.add_argument("--prompt", type=int, default=3072)
    ap.add_argument("--new", type=int, default=32, help="decode steps timed per round")
    ap.add_argument("--reasoning", type=int, default=64)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--accept-len", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stage-timeout", type=float, default=240.0)
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (the CI run on a CPU)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    device = resolve_device(args.device)
    args.layers = auto_layers(device) if args.layers == "auto" else int(args.layers)
    if args.tiny:
        args.prompt, args.new, args.rounds = min(args.prompt, 64), min(args.new, 4), min(args.rounds, 1)
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({platform.processor() or 'cpu'})"
    )
    run = {
        "date": datetime.date.today().isoformat(),
        "device_name": name,
        "device": str(device),
        "torch": torch.__version__,
        "shapes": "tiny"
        if args.tiny
        else f"Alpamayo 1.5, {args.layers} text/expert layers, {args.vision_layers} vision blocks",
        "prompt": args.prompt,
        "decode_steps": args.new,
    }
    report = Report(args.out, run)
    hf: dict[str, Any] | None = None

    def stage(label: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        left = args.budget_s - (time.monotonic() - start)
        t0 = time.monotonic()
        if left <= 1:
            report.add(label, "skipped: the run's budget is spent", {}, 0.0)
            return None
        try:
            with deadline(min(args.stage_timeout, left)):
                figures = fn()
        except StageTimeout as e:
            report.add(label, f"timed out ({e})", {}, time.monotonic() - t0)
            return None
        except Exception as e:  # a stage's failure is the report's content; the run goes on
            report.add(label, f"failed: {type(e).__name__}: {str(e)[:300]}", {}, time.monotonic() - t0)
            return None
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        report.add(label, "ok", figures, time.monotonic() - t0)
        print(f"gpu-check: {label} done in {time.monotonic() - t0:.1f} s", flush=True)
        return figures

    if not args.skip_tests:
        stage("cuda tests", lambda: run_tests(device))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        if (
            stage(
                "random checkpoint",
                lambda: (save_random_model(vlm_config(args), path, torch.bfloat16), {})[1],
            )
            is None
        ):
            return 1
        stage("vision, one frame", lambda: vision_stage(path, args, device))
        hf = stage("text, transformers bf16", lambda: hf_text_stage(path, args, device))
        for label, recipe in RECIPES.items():
            stage(f"text, ours {label}", lambda r=recipe: ours_text_stage(path, r, args, device, hf))
        stage("expert, 10 steps K=1", lambda: expert_stage(path, args, device))
    print((args.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
