"""Arguments shared by several sub-commands."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alpamayo.backends import BACKENDS, BackendOptions, load_text_model
from alpamayo.checkpoint import Checkpoint
from alpamayo.config.flow import CHECKPOINT_GUIDANCE, parse_guidance
from alpamayo.config.loader import check_checkpoint
from alpamayo.config.model import ModelConfig
from alpamayo.devices import DTYPES
from alpamayo.errors import ConfigError
from alpamayo.expert.decoding import DECODERS
from alpamayo.model_spec import ModelSpec
from alpamayo.quant import GROUP_SIZES, QUANT_MODES, QuantRecipe
from alpamayo.runtime import AlpamayoVLA
from alpamayo.tt.device import MODES as TT_MODES

RECIPE_HELP = (
    "ttnn precision recipe: accuracy, performance or a recipe YAML file (see alpamayo.plan.precision)"
)
MOE_CONFIG_HELP = (
    "ttnn backend, MoE checkpoints: the MoE block config YAML (default: the shipped one for the "
    "model's shape, see alpamayo.config.moe)"
)


BASE_MODEL_HELP = (
    "Alpamayo 1 (R1) / 1.5: the base-model directory (tokenizer, Qwen3-VL config) when config.json's "
    "vlm_name_or_path is neither a local directory nor in the local Hugging Face cache"
)


SPEC_KEYS = tuple(ModelSpec().to_dict())  # the model flags' dests: `--flow-steps` sets `flow_steps`


def _model_flags(checkpoint_required: bool) -> list[tuple[str, dict[str, Any]]]:
    d = ModelSpec()
    return [
        (
            "--checkpoint",
            dict(
                required=checkpoint_required,
                help="checkpoint directory: Hugging Face Qwen3-VL, Alpamayo R1 / 1.5 / 2 Super, or the demo layout",
            ),
        ),
        ("--base-model", dict(default=d.base_model, help=BASE_MODEL_HELP)),
        (
            "--backend",
            dict(
                choices=BACKENDS,
                default=d.backend,
                help="torch (CPU/CUDA reference) or ttnn (one Tenstorrent Blackhole p150)",
            ),
        ),
        (
            "--dtype",
            dict(choices=sorted(DTYPES), default=d.dtype, help="torch backend: weights and activations"),
        ),
        ("--device", dict(default=d.device, help="torch backend: cpu or cuda[:N]")),
        ("--recipe", dict(default=d.recipe, help=RECIPE_HELP)),
        (
            "--tt-cache",
            dict(
                default=d.tt_cache,
                help="ttnn backend: directory for the packed weight cache (.tensorbin files)",
            ),
        ),
        ("--moe-config", dict(default=d.moe_config, help=MOE_CONFIG_HELP)),
        (
            "--tt-mode",
            dict(
                choices=TT_MODES,
                default=d.tt_mode,
                help="ttnn backend: device (a Blackhole card, ttsim or the dry run) or golden (every device "
                "program through ttnn's golden functions on the host, no card; alpamayo.tt.golden); default "
                "$ALPAMAYO_TT_MODE, else device",
            ),
        ),
        *_quant_flags(),
        (
            "--reproducible",
            dict(
                action="store_true",
                help="compute on one torch and one BLAS thread, so outputs are the same bytes on any thread "
                "count, in-process or on any Ray worker layout (costs the parallel speed-up on CPU; docs/eval.md)",
            ),
        ),
    ]


def _decoding_flags() -> list[tuple[str, dict[str, Any]]]:
    d = ModelSpec()
    return [
        (
            "--temperature",
            dict(
                type=float,
                default=d.temperature,
                help="0 = greedy; default: the model family's (Alpamayo R1 / 1.5 / 2 Super: 0.6; other layouts: 0)",
            ),
        ),
        (
            "--top-p",
            dict(
                type=float,
                default=d.top_p,
                help="nucleus mass; default: the family's (Alpamayo: 0.98, else 1)",
            ),
        ),
        ("--top-k", dict(type=int, default=d.top_k, help="keep the k most probable tokens (default: all)")),
        (
            "--max-reasoning-tokens",
            dict(
                type=int,
                default=d.max_reasoning_tokens,
                help=f"reasoning cap: after this many, the trajectory starts (default {d.max_reasoning_tokens})",
            ),
        ),
        (
            "--decoder",
            dict(
                choices=DECODERS,
                default=d.decoder,
                help="trajectory decoder: the flow-matching action expert (default when the checkpoint has expert "
                "weights, as NVIDIA's releases decode) or the 128 discrete trajectory tokens",
            ),
        ),
        (
            "--draft",
            dict(
                default=d.draft,
                help="speculative draft of the reasoning (same output, fewer weight reads): none, lookup (prompt "
                "lookup), previous (the stream's previous reasoning) or dflash:DIR (a z-lab DFlash draft)",
            ),
        ),
        (
            "--flow-steps",
            dict(type=int, default=d.flow_steps, help="expert: Euler steps (default: the config's, 10)"),
        ),
        (
            "--flow-temperature",
            dict(type=float, default=d.flow_temperature, help="expert: initial-noise scale (default 1)"),
        ),
        (
            "--nav-guidance",
            dict(
                type=guidance_arg,
                nargs="?",
                const=CHECKPOINT_GUIDANCE,
                default=d.nav_guidance,
                metavar="W",
                help="expert: navigation classifier-free guidance, v = (1-W) v_unguided + W v_guided (1 = pure "
                "guided, two expert forwards per step); without W the checkpoint's "
                "diffusion_cfg.inference_guidance_weight, as NVIDIA's Alpamayo 2 Super example runs it; needs a "
                "route: --route (replay, profile and eval also take --route auto and --route-file)",
            ),
        ),
    ]


def _quant_flags() -> list[tuple[str, dict[str, Any]]]:
    d = ModelSpec()
    return [
        (
            "--quant",
            dict(
                choices=QUANT_MODES,
                default=d.quant,
                help="torch backend: weight-only quantisation of the linears at load (int8 per output channel, "
                "int4 group-wise); with --backend ttnn use --recipe",
            ),
        ),
        (
            "--quant-group",
            dict(
                type=int,
                choices=GROUP_SIZES,
                default=d.quant_group,
                help=f"--quant int4: input columns per scale and zero (default {d.quant_group})",
            ),
        ),
        (
            "--quant-head",
            dict(action="store_true", help="--quant: quantise the LM head too (default: model dtype)"),
        ),
        (
            "--quant-cache",
            dict(
                default=d.quant_cache,
                help="--quant: directory for the packed-weight cache, so the next load skips quantising",
            ),
        ),
    ]


def add_model_args(
    parser: argparse.ArgumentParser,
    checkpoint_required: bool = True,
    decoding: bool = True,
    overrides: bool = False,
) -> None:
    """The flags of a `ModelSpec`, one per key (`--flow-steps` sets `flow_steps`): what to load (checkpoint,
    base model, backend options) and, with `decoding`, how the runtime decodes (sampling, reasoning cap,
    decoder, draft, flow settings); `model_spec` builds the spec from them. checkpoint_required False: a
    command that may run without a model checks it. `overrides`: every flag defaults to None (not given) and
    overrides the same key of a config file (`alpamayo serve`'s node YAML)."""
    flags = _model_flags(checkpoint_required and not overrides) + (_decoding_flags() if decoding else [])
    for flag, kwargs in flags:
        if overrides:
            kwargs = {**kwargs, "default": None, "required": False}
            kwargs["help"] = f"overrides model.{flag[2:].replace('-', '_')} ({kwargs['help']})"
        parser.add_argument(flag, **kwargs)


def model_spec(args: argparse.Namespace, resolve: bool = False) -> ModelSpec:
    """The ModelSpec of `add_model_args`' flags (keys the command has no flag for take their defaults); an
    error names the flag. `resolve` makes the checkpoint and base-model paths absolute (for Ray workers)."""
    values = {k: getattr(args, k) for k in SPEC_KEYS if getattr(args, k, None) is not None}
    if resolve:
        for key in ("checkpoint", "base_model"):
            if key in values:
                values[key] = str(Path(values[key]).resolve())
    try:
        return ModelSpec(**values)
    except ConfigError as e:  # named by the spec's key: name the flag instead
        raise ConfigError(re.sub(r"model\.(\w+)", lambda m: "--" + m[1].replace("_", "-"), str(e))) from None


def add_quant_args(parser: argparse.ArgumentParser) -> None:
    """`--quant`, `--quant-group`, `--quant-head`, `--quant-cache`: the torch backend's weight-only recipe."""
    for flag, kwargs in _quant_flags():
        parser.add_argument(flag, **kwargs)


def check_quant_backend(args: argparse.Namespace) -> None:
    """ValueError for `add_quant_args`' --quant with --backend ttnn (use --recipe), raised before a command
    reads any input, so every command refuses it alike; a no-op for commands without both flags."""
    if isinstance(getattr(args, "quant", None), str) and isinstance(getattr(args, "backend", None), str):
        BackendOptions(args.backend, quant=QuantRecipe(args.quant, args.quant_group, args.quant_head))


@contextmanager
def text_model(args: argparse.Namespace, cfg: ModelConfig, max_seq_len: int) -> Iterator[Any]:
    """The text backbone of `--backend` with its cache set up for `max_seq_len`; closed on exit (ttnn)."""
    ckpt = Checkpoint(args.checkpoint, cfg.weight_prefix)
    check_checkpoint(ckpt, cfg)
    model = load_text_model(ckpt, cfg, model_spec(args).options)
    try:
        model.setup_cache(max_seq_len)
        yield model
    finally:
        model.close()


def add_request_args(parser: argparse.ArgumentParser, samples: bool = True, seed: bool = True) -> None:
    """What each prediction asks for beside the model: `--samples` (with `samples`) and `--seed` (with
    `seed`)."""
    if samples:
        parser.add_argument("--samples", type=int, default=1, help="trajectory samples sharing one prefill")
    if seed:
        parser.add_argument("--seed", type=int, help="sampling seed (reproducible samples)")


def guidance_arg(text: str) -> float | str:
    """argparse type of `--nav-guidance`: a weight, or `checkpoint`."""
    try:
        return parse_guidance(text, "--nav-guidance")
    except ValueError as e:
        hint = "; without a weight, follow --nav-guidance with another option or end the command with it"
        raise argparse.ArgumentTypeError(f"{e}{hint}") from None


def load_vla(args: argparse.Namespace) -> AlpamayoVLA:
    """The model that `add_model_args` asks for; ValueError before any load for a --samples (where the
    command has one) that the backend or the temperature cannot give."""
    spec = model_spec(args)
    spec.check_samples(getattr(args, "samples", 1))
    return AlpamayoVLA.from_spec(spec)


def run_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The settings fields of a run over many units (EvalSettings, ClosedLoopSettings): the model (its
    checkpoint and base model resolved), the run directory, where it runs (in-process or Ray, workers, CPUs
    per worker, retries) and the progress bar."""
    return dict(
        model=model_spec(args, resolve=True),
        out=args.out,
        ray=args.ray,
        workers=args.workers,
        cpus_per_worker=args.cpus_per_worker,
        max_retries=args.max_retries,
        progress=not args.no_progress,
    )
