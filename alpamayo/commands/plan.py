"""`alpamayo plan`: DRAM budget, grid plan and estimated stage times of the ttnn backend on one Blackhole p150
(no device); with `--backend torch` the GPU memory of the torch backend per weight-only recipe (`--quant`,
`alpamayo.plan.gpu_memory`) and the smallest common GPU each fits.

With an Alpamayo checkpoint that carries an action expert (or a built-in release such as `alpamayo-1.5-10b`),
the expert joins the DRAM budget and the grid plan, every preset is checked for fit, and the stages of one
prediction (vision, prefill, reasoning decode, the expert's Euler steps) get two times: the roofline from the
device's compute and bandwidth figures (`alpamayo.plan.estimate`) and the expected time, the same ops at
efficiencies and fixed costs fitted to published p150 measurements (`alpamayo.plan.calibration`);
`--calibration` prints that fit against each measurement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alpamayo.backends import BACKENDS
from alpamayo.commands.common import BASE_MODEL_HELP, MOE_CONFIG_HELP, RECIPE_HELP, add_quant_args
from alpamayo.commands.make_demo_drive import parse_size
from alpamayo.config.builtin import EXPERT_NAMES, NAMES, builtin_config, builtin_expert, model_block_config
from alpamayo.config.expert import ExpertConfig, expert_config_of
from alpamayo.config.loader import load_shape_config
from alpamayo.config.model import ModelConfig
from alpamayo.devices import DTYPES
from alpamayo.plan.calibration.anchors import ANCHORS_PATH, UNITS, load_anchors
from alpamayo.plan.calibration.model import FIT_TOLERANCE, ExpectedModel, calibration, fitted
from alpamayo.plan.device_spec import P150
from alpamayo.plan.dram import DoesNotFit, check_fits, plan_memory
from alpamayo.plan.estimate import (
    StageEstimate,
    both,
    decode_estimate,
    expert_estimate,
    prefill_estimate,
    roofline_timer,
    speculative_lines,
    vision_estimate,
)
from alpamayo.plan.gpu_memory import GPUS_GB, GpuPlan, plan_gpu_memory
from alpamayo.plan.precision import PRESETS, Precision, load_precision
from alpamayo.plan.programs.expert import plan_expert
from alpamayo.plan.programs.grid import model_name
from alpamayo.plan.programs.text import plan_text
from alpamayo.prediction import FRAMES_PER_CAMERA
from alpamayo.quant import GROUP_SIZES, PART_NAMES, QuantRecipe, describe_fallbacks
from alpamayo.runtime import CACHE_STEP, frames_to_encode
from planner.settings import PlannerSettings

# Alpamayo's driving prompt besides its image tokens: chat template, 48 ego-history tokens and instructions,
# ~190 tokens (prompt ~3.07k tokens with 16 images at 320x576, ../shared/reference/alpamayo-code-audit.md B.11).
TEXT_TOKENS = 192


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="DRAM and grid plan (and estimated stage times) of the ttnn backend on a Blackhole p150, or the "
        "torch backend's GPU memory per --quant recipe",
    )
    p.add_argument(
        "--checkpoint",
        help=f"checkpoint directory, or a built-in config name ({', '.join(NAMES + EXPERT_NAMES)}); required "
        "unless --calibration",
    )
    p.add_argument(
        "--calibration",
        action="store_true",
        help="print the expected model's calibration: each published p150 measurement against the model, "
        "with leave-one-out (no --checkpoint needed)",
    )
    p.add_argument(
        "--anchors",
        action="append",
        default=[],
        metavar="FILE",
        help="more p150 measurements to fit the expected model to (the anchors file format, e.g. the "
        "anchors.json that scripts/card-check writes); repeatable",
    )
    p.add_argument("--base-model", default=None, help=BASE_MODEL_HELP)
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="ttnn",
        help="ttnn: the p150 DRAM plan (default); torch: GPU memory per weight-only recipe",
    )
    p.add_argument("--recipe", default="performance", help=RECIPE_HELP)
    add_quant_args(p)
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="bfloat16",
        help="--backend torch: the model dtype (default bfloat16, as on a GPU)",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="--backend torch: whose int4 packing rules apply (default cuda)",
    )
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="KV cache positions (prompt + generated; default: ttnn 8192, torch the runtime's cache for the "
        "stage-estimate prompt plus --reasoning-tokens and the trajectory tokens)",
    )
    p.add_argument("--moe-config", default=None, help=MOE_CONFIG_HELP)
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        help="action expert: trajectory samples K per step (default: ttnn 1; torch 6, alpamayo eval's)",
    )
    p.add_argument("--images", type=int, default=16, help="stage estimate: images per prompt")
    p.add_argument("--image-size", default="320x576", help="stage estimate: image HEIGHTxWIDTH in pixels")
    p.add_argument(
        "--reasoning-tokens", type=int, default=64, help="stage estimate: decode steps per prediction"
    )
    p.add_argument(
        "--accept-len",
        type=float,
        default=None,
        metavar="TAU",
        help="stage estimate with speculative decoding: mean tokens per verify (accepted prefix + 1)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=8,
        help="speculative block: tokens verified per step (1..32; DFlash: 8)",
    )
    p.set_defaults(handler=run)


def resolve_config(spec: str, base_model: str | None = None) -> tuple[ModelConfig, ExpertConfig | None]:
    """A checkpoint directory's config (R1 / 1.5: with its base model, or the bundled Qwen3-VL-8B config for
    the two known base ids when it is not on disk: planning reads no tokenizer) and action expert, or a
    built-in config (or Alpamayo release) by name."""
    if Path(spec).exists():
        cfg = load_shape_config(spec, base_model)
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


def stage_lines(stage: StageEstimate, model: ExpectedModel) -> list[str]:
    """A stage's roofline line and its expected line: ms per pass and per prediction, the factor over the
    roofline and the op classes that take most of it."""
    roof, per = stage.ms(P150), model.pass_ms(stage)
    times = f" x {stage.repeat} = {per * stage.repeat:.2f} ms" if stage.repeat > 1 else ""
    parts = model.by_class(stage)
    total = sum(parts.values())
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
    where = ", ".join(f"{name} {100 * ms / total:.0f}%" for name, ms in top if ms > 0)
    return [
        f"  {stage.describe(P150)}",
        f"  {'':<22} expected {per:8.3f} ms{times} (x{per / roof:.2f} the roofline; {where})",
    ]


def _estimates(
    args: argparse.Namespace, cfg: ModelConfig, expert: ExpertConfig | None, precision: Precision
) -> list[str]:
    hw = image_size(args.image_size)
    prompt = TEXT_TOKENS
    stages = []
    vision = tick_vision = None
    image_rows = 0
    if cfg.vision is not None and args.images:
        v = cfg.vision
        image_rows = (
            args.images * (hw[0] // v.patch_size) * (hw[1] // v.patch_size) // v.spatial_merge_size**2
        )
        prompt += image_rows
        vision = vision_estimate(cfg, precision, args.images, hw)
        stages.append(vision)
        cameras, partial = divmod(args.images, FRAMES_PER_CAMERA)
        if cameras and not partial:  # the frames the runtime encodes at a stream's 10 Hz tick
            tick_vision = vision_estimate(cfg, precision, frames_to_encode(cameras, shift=1), hw)
    stages.append(prefill_estimate(cfg, precision, prompt, image_rows))
    stages.append(decode_estimate(cfg, precision, prompt + args.reasoning_tokens, args.reasoning_tokens))
    if expert is not None:
        offset = prompt + args.reasoning_tokens  # the cache index after <|traj_future_start|>
        stages.append(expert_estimate(cfg, expert, precision, args.max_seq_len, args.samples, offset))
    model = fitted(*(Path(a) for a in args.anchors))
    timers = {"roofline": roofline_timer(P150), "expected": model.pass_ms}
    total = {k: sum(t(s) * s.repeat for s in stages) for k, t in timers.items()}
    lines = [
        f"p150 TIME PER STAGE: the roofline (a lower bound from {P150.dram_bandwidth / 1e9:.0f} GB/s DRAM and "
        f"{P150.matmul_flops_per_cycle} FLOP/cycle/core at {P150.clock_hz / 1e9:.2f} GHz per LoFi pass) and the "
        f"expected time (the roofline's ops at per-class efficiencies and fixed costs fitted to "
        f"{len(model.anchor_ids)} published p150 measurements: `alpamayo plan --calibration`); neither is "
        f"measured on these programs: {args.images} images {hw[0]}x{hw[1]}, prompt {prompt} tokens, "
        f"{args.reasoning_tokens} reasoning tokens",
        *(line for s in stages for line in stage_lines(s, model)),
        f"  total per prediction:  {both(total)}: a first prediction, every frame through vision",
    ]
    tick = None
    if vision is not None and tick_vision is not None:
        tick = {
            k: total[k] - t(vision) * vision.repeat + t(tick_vision) * tick_vision.repeat
            for k, t in timers.items()
        }
        lines.append(
            f"  a stream's tick:       {both(tick)}: {tick_vision.repeat} of {vision.repeat} frames "
            f"through vision, one new frame per camera at 10 Hz (the runtime's frame cache keeps the last "
            f"window, `alpamayo.runtime.frames_to_encode`)"
        )
    shown = [*stages] if tick_vision is None else [tick_vision, *stages[1:]]
    lines += dominant_lines(shown, model, "a stream's tick" if tick_vision is not None else "a prediction")
    if args.accept_len is not None:
        context = prompt + args.reasoning_tokens
        lines += speculative_lines(
            cfg,
            precision,
            context,
            args.reasoning_tokens,
            args.accept_len,
            args.block_size,
            total,
            timers,
            tick_total=tick,
            stage_lines=lambda stage: stage_lines(stage, model),
        )
    return lines


def dominant_lines(stages: list[StageEstimate], model: ExpectedModel, of: str) -> list[str]:
    """Where the expected time of `of` goes: by stage and by op class, largest first."""
    by_stage = {s.name: model.ms(s) for s in stages}
    classes: dict[str, float] = {}
    for s in stages:
        for name, ms in model.by_class(s).items():
            classes[name] = classes.get(name, 0.0) + ms
    total = sum(by_stage.values())

    def shares(parts: dict[str, float]) -> str:
        return ", ".join(
            f"{k} {v:.0f} ms ({100 * v / total:.0f}%)"
            for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
            if v >= 0.5
        )

    return [
        f"  expected, where {of} goes: by stage {shares(by_stage)}",
        f"  {'':<22} by op class {shares(classes)}",
    ]


def calibration_lines(extra: list[str]) -> list[str]:
    """`--calibration`: every anchor measured against modelled, the fitted ones also against a fit made
    without them (leave-one-out), and the fitted coefficients."""
    anchors = load_anchors(ANCHORS_PATH)
    for path in extra:
        anchors += load_anchors(path)
    model, checks = calibration(anchors)
    fitted_checks = [c for c in checks if c.anchor.fit]
    lines = [
        f"p150 CALIBRATION: {len(checks)} published measurements ({ANCHORS_PATH.name}"
        + "".join(f", {p}" for p in extra)
        + f"), {len(fitted_checks)} fitted; measured, modelled by the expected model, and modelled by a fit "
        "made without the anchor (leave-one-out: how the model generalises)",
    ]
    rows = [["anchor", "stage", "measured", "modelled", "ratio", "left out", "ratio", "source"]]
    for c in checks:
        a = c.anchor
        unit = a.unit

        def fmt(ms: float | None, unit: str = unit) -> str:
            if ms is None:
                return "-"
            return "0 (no anchor)" if ms < 1e-6 else f"{UNITS[unit][1](ms):.4g} {unit}"

        # a figure in t/s/u grows as the time shrinks: ratios are of times (modelled / measured ms)
        left = c.left_out_ratio
        rows.append(
            [
                a.id if a.fit else f"{a.id} (reference)",
                a.workload["stage"],
                fmt(a.measured_ms),
                fmt(c.modelled_ms),
                f"{c.ratio:.2f}",
                fmt(c.left_out_ms),
                "-" if left is None else f"{left:.2f}",
                a.source.describe(),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    worst = max(fitted_checks, key=lambda c: abs(c.ratio - 1))
    loo = sorted(abs(c.left_out_ratio - 1) for c in fitted_checks if c.left_out_ratio is not None)
    lines += [
        f"  fitted anchors: worst {worst.anchor.id} at {worst.ratio:.2f}x (the test holds each within "
        f"{100 * FIT_TOLERANCE:.0f}%); leave-one-out: median error {100 * loo[len(loo) // 2]:.0f}%, "
        f"{sum(e <= FIT_TOLERANCE for e in loo)} of {len(loo)} within {100 * FIT_TOLERANCE:.0f}% (a class "
        "whose only anchor is left out falls back to its roofline)",
        "  ratios are modelled / measured times; reference rows are not fitted: their notes in the anchors "
        "file say why",
        "fitted coefficients (expected = the roofline's ops at these efficiencies, plus these fixed costs):",
        *model.describe(),
    ]
    return lines


def prompt_tokens(args: argparse.Namespace, cfg: ModelConfig) -> tuple[int, int]:
    """(prompt tokens, patches of one image) of the stage-estimate prompt: `--images` at `--image-size`."""
    hw = image_size(args.image_size)
    if cfg.vision is None or not args.images:
        return TEXT_TOKENS, 0
    v = cfg.vision
    patches = (hw[0] // v.patch_size) * (hw[1] // v.patch_size)
    return TEXT_TOKENS + args.images * patches // v.spatial_merge_size**2, patches


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f}"


def _fits(plan: GpuPlan, total: int) -> str:
    if plan.refused:
        return "cannot load"
    return next((f"{g} GB" for g in GPUS_GB if total <= g * 1e9), f"none (> {GPUS_GB[-1]} GB)")


def torch_plan(args: argparse.Namespace, cfg: ModelConfig, expert: ExpertConfig | None) -> int:
    """`--backend torch`: the GPU memory table of every recipe (the chosen one marked, with how many of its
    linears are packed at int8 where int4 cannot take their width), its weights by part, the int4 recipes'
    int8 layers by part, and why a recipe cannot load where the device has no kernel for it; 2 when the
    chosen one cannot."""
    chosen = QuantRecipe(args.quant, args.quant_group, args.quant_head)
    dtype = DTYPES[args.dtype]
    samples = 6 if args.samples is None else args.samples
    prompt, patches = prompt_tokens(args, cfg)
    generated = args.reasoning_tokens + PlannerSettings.from_config(cfg).tokens_per_future
    context = args.max_seq_len or -(-(prompt + generated) // CACHE_STEP) * CACHE_STEP
    guidance = expert is not None  # every release's expert runs navigation guidance on torch
    recipes = [QuantRecipe(), QuantRecipe("int8", head=args.quant_head)]
    recipes += [QuantRecipe("int4", g, args.quant_head) for g in GROUP_SIZES]
    plans = {
        r: plan_gpu_memory(cfg, expert, r, dtype, context, samples, prompt, patches, guidance, args.device)
        for r in recipes
    }
    with_expert = f", action expert at K={samples} samples" if expert is not None else ""
    length = (
        "--max-seq-len" if args.max_seq_len else f"prompt {prompt} + {generated} generated tokens, rounded up"
    )
    print(
        f"GPU memory plan, torch backend ({args.dtype} on {args.device}): {model_name(cfg)}{with_expert}, "
        f"KV cache of {samples} x {context} positions ({length})"
    )
    cols = ["recipe", "int8 linears", "weights GB", "KV cache GB", "activations GB (ESTIMATE)", "total GB"]
    cols += ["smallest GPU"]
    if guidance:
        cols += ["+ unguided cache GB", "total with --nav-guidance GB", "smallest GPU"]
    rows = [cols]
    for r, plan in plans.items():
        base = plan.total - plan.unguided_cache
        at_int8 = f"{plan.fallback}/{plan.linears}" if r.mode == "int4" else "-"
        row = [
            ("* " if r == chosen else "  ") + plan.recipe,
            at_int8,
            _gb(plan.weight_bytes),
            _gb(plan.kv_cache),
        ]
        row += [_gb(plan.activations), _gb(base), _fits(plan, base)]
        if guidance:
            row += [_gb(plan.unguided_cache), _gb(plan.total), _fits(plan, plan.total)]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    print(
        "\n".join(
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
        )
    )
    plan = plans.get(chosen) or plan_gpu_memory(
        cfg, expert, chosen, dtype, context, samples, prompt, patches, guidance, args.device
    )
    print(f"weights of {plan.recipe} by part (quantised linears + tensors at {args.dtype}):")
    for part, count in plan.weights.items():
        print(f"  {part:<8} {_gb(count.quantised):>7} + {_gb(count.plain):>7} GB")
    print(
        f"GB = 1e9 bytes; not counted: the CUDA context and allocator slack. Embeddings, norms, biases, routers "
        f"and the expert's in-projection stay {args.dtype}, the head too unless --quant-head."
    )
    for r, other in plans.items():
        for part, count in other.weights.items():
            if count.fallback:
                print(describe_fallbacks(r, args.device, PART_NAMES[part], count.fallback, count.linears))
    for other in plans.values():
        if other.refused:
            print(
                f"{other.recipe} cannot load on {args.device}: {len(other.refused)} linear(s) refused, e.g. {other.refused[0]}"
            )
    if plan.refused:
        print(f"alpamayo plan: --quant {plan.recipe} cannot load: {plan.refused[0]}", file=sys.stderr)
        return 2
    return 0


def run(args: argparse.Namespace) -> int:
    if args.calibration:
        print("\n".join(calibration_lines(args.anchors)))
        return 0
    if args.checkpoint is None:
        raise ValueError("--checkpoint is required (a directory or a built-in name), unless --calibration")
    cfg, expert = resolve_config(args.checkpoint, args.base_model)
    print(f"model family: {cfg.family.title} ({cfg.family.name})")
    if args.backend == "torch":
        return torch_plan(args, cfg, expert)
    args.max_seq_len = 8192 if args.max_seq_len is None else args.max_seq_len
    args.samples = 1 if args.samples is None else args.samples
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
