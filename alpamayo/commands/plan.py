"""`alpamayo plan`: DRAM budget, grid plan and estimated stage times of the ttnn backend on one Blackhole p150
(no device).

With an Alpamayo checkpoint that carries an action expert (or a built-in release such as `alpamayo-1.5-10b`),
the expert joins the DRAM budget and the grid plan, every preset is checked for fit, and the stages of one
prediction (vision, prefill, reasoning decode, the expert's Euler steps) get a roofline ESTIMATE from the
device's compute and bandwidth figures (`alpamayo.tt.estimate`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alpamayo.commands.common import BASE_MODEL_HELP, MOE_CONFIG_HELP, RECIPE_HELP
from alpamayo.commands.make_demo_drive import parse_size
from alpamayo.config import ModelConfig
from alpamayo.configs import EXPERT_NAMES, NAMES, builtin_config, builtin_expert
from alpamayo.expert.config import ExpertConfig, expert_config_of
from alpamayo.families.loader import load_model_config
from alpamayo.moe.config import model_block_config
from alpamayo.tt.device_spec import P150
from alpamayo.tt.estimate import decode_estimate, expert_estimate, prefill_estimate, vision_estimate
from alpamayo.tt.memory import DoesNotFit, check_fits, plan_memory
from alpamayo.tt.precision import PRESETS, Precision, load_precision
from alpamayo.tt.program_config import plan_expert, plan_text

# Alpamayo's driving prompt besides its image tokens: chat template, 48 ego-history tokens and instructions,
# ~190 tokens (prompt ~3.07k tokens with 16 images at 320x576, ../shared/reference/alpamayo-code-audit.md B.11).
TEXT_TOKENS = 192


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="DRAM and grid plan (and estimated stage times) of the ttnn backend on a Blackhole p150"
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help=f"checkpoint directory, or a built-in config name ({', '.join(NAMES + EXPERT_NAMES)})",
    )
    p.add_argument("--base-model", default=None, help=BASE_MODEL_HELP)
    p.add_argument("--recipe", default="performance", help=RECIPE_HELP)
    p.add_argument("--max-seq-len", type=int, default=8192, help="KV cache positions (prompt + generated)")
    p.add_argument("--moe-config", default=None, help=MOE_CONFIG_HELP)
    p.add_argument("--samples", type=int, default=1, help="action expert: trajectory samples K per step")
    p.add_argument("--images", type=int, default=16, help="stage estimate: images per prompt")
    p.add_argument("--image-size", default="320x576", help="stage estimate: image HEIGHTxWIDTH in pixels")
    p.add_argument(
        "--reasoning-tokens", type=int, default=64, help="stage estimate: decode steps per prediction"
    )
    p.set_defaults(handler=run)


def resolve_config(spec: str, base_model: str | None = None) -> tuple[ModelConfig, ExpertConfig | None]:
    """A checkpoint directory's config (R1 / 1.5: with its base model) and action expert, or a built-in config
    (or Alpamayo release) by name."""
    if Path(spec).exists():
        cfg = load_model_config(spec, base_model)
        return cfg, expert_config_of(cfg)
    if spec in NAMES:
        return builtin_config(spec), None
    if spec in EXPERT_NAMES:
        return builtin_expert(spec)
    raise ValueError(
        f"--checkpoint {spec!r}: no such directory and not a built-in config ({', '.join(NAMES + EXPERT_NAMES)})"
    )


def image_size(spec: str) -> tuple[int, int]:
    """`--image-size` as (height, width) pixels, both >= 1 (`parse_size`); ValueError naming the flag."""
    try:
        h, w = parse_size(spec)
    except argparse.ArgumentTypeError:
        raise ValueError(f"--image-size {spec!r}: expected HEIGHTxWIDTH in pixels, e.g. 320x576") from None
    if h < 1 or w < 1:
        raise ValueError(f"--image-size {spec!r}: height and width must be >= 1")
    return h, w


def _estimates(
    args: argparse.Namespace, cfg: ModelConfig, expert: ExpertConfig | None, precision: Precision
) -> list[str]:
    hw = image_size(args.image_size)
    prompt = TEXT_TOKENS
    stages = []
    if cfg.vision is not None and args.images:
        v = cfg.vision
        prompt += args.images * (hw[0] // v.patch_size) * (hw[1] // v.patch_size) // v.spatial_merge_size**2
        stages.append(vision_estimate(cfg, precision, args.images, hw))
    stages.append(prefill_estimate(cfg, precision, prompt))
    stages.append(decode_estimate(cfg, precision, prompt + args.reasoning_tokens, args.reasoning_tokens))
    if expert is not None:
        stages.append(expert_estimate(cfg, expert, precision, args.max_seq_len, args.samples))
    lines = [
        f"ESTIMATED ms per stage (roofline lower bound from {P150.dram_bandwidth / 1e9:.0f} GB/s DRAM and "
        f"{P150.matmul_flops_per_cycle} FLOP/cycle/core at {P150.clock_hz / 1e9:.2f} GHz per LoFi pass; not "
        f"measured): {args.images} images {hw[0]}x{hw[1]}, prompt {prompt} tokens, "
        f"{args.reasoning_tokens} reasoning tokens",
        *(f"  {s.describe(P150)}" for s in stages),
        f"  total per prediction   {sum(s.ms(P150) * s.repeat for s in stages):8.1f} ms (estimate)",
    ]
    return lines


def run(args: argparse.Namespace) -> int:
    cfg, expert = resolve_config(args.checkpoint, args.base_model)
    print(f"model family: {cfg.family.title} ({cfg.family.name})")
    precision = load_precision(args.recipe)
    # the block config a ttnn run would take, so its one-chip refusals (mesh, shared experts, bias) show here
    block = model_block_config(cfg.text, args.moe_config)
    grid = plan_text(cfg, precision, moe=block)
    memory = plan_memory(cfg, precision, args.max_seq_len, expert=expert, samples=args.samples)
    print("\n".join(memory.describe()))
    print("\n".join(grid.describe()))
    if expert is not None:
        print("\n".join(plan_expert(cfg, expert, precision, args.max_seq_len, args.samples).describe()))
        fitting = [
            f"{name} ({plan.total / 1e9:.2f} GB)"
            for name, preset in PRESETS.items()
            if (plan := plan_memory(cfg, preset, args.max_seq_len, expert=expert, samples=args.samples)).fits
        ]
        print(f"presets that fit on one {P150.name}: {', '.join(fitting) or 'none'}")
    print("\n".join(_estimates(args, cfg, expert, precision)))
    try:
        check_fits(cfg, precision, args.max_seq_len, expert=expert, samples=args.samples)
    except DoesNotFit as e:
        print(f"alpamayo plan: does not fit: {e}", file=sys.stderr)
        return 2
    return 0
