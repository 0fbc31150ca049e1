"""Arguments shared by several sub-commands."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alpamayo.backends import BACKENDS, BackendOptions, check_num_samples, load_text_model
from alpamayo.checkpoint import Checkpoint
from alpamayo.config.flow import CHECKPOINT_GUIDANCE, FlowSettings, parse_guidance
from alpamayo.config.loader import check_checkpoint
from alpamayo.config.model import ModelConfig
from alpamayo.devices import DTYPES
from alpamayo.expert.decoding import DECODERS
from alpamayo.quant import DEFAULT_GROUP_SIZE, GROUP_SIZES, QUANT_MODES, QuantRecipe
from alpamayo.reproducibility.mode import compute_on_one_thread
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


def add_model_args(parser: argparse.ArgumentParser, checkpoint_required: bool = True) -> None:
    """The model's options; checkpoint_required False: a command that may run without a model checks it."""
    parser.add_argument(
        "--checkpoint",
        required=checkpoint_required,
        help="checkpoint directory: Hugging Face Qwen3-VL, Alpamayo R1 / 1.5 / 2 Super, or the demo layout",
    )
    parser.add_argument("--base-model", default=None, help=BASE_MODEL_HELP)
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="torch",
        help="torch (CPU/CUDA reference) or ttnn (one Tenstorrent Blackhole p150)",
    )
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default="float32", help="torch backend: weights and activations"
    )
    parser.add_argument("--device", default="cpu", help="torch backend: cpu or cuda[:N]")
    parser.add_argument("--recipe", default="performance", help=RECIPE_HELP)
    parser.add_argument(
        "--tt-cache",
        default=None,
        help="ttnn backend: directory for the packed weight cache (.tensorbin files)",
    )
    parser.add_argument("--moe-config", default=None, help=MOE_CONFIG_HELP)
    parser.add_argument(
        "--tt-mode",
        choices=TT_MODES,
        default=None,
        help="ttnn backend: device (a Blackhole card, ttsim or the dry run) or golden (every device program "
        "through ttnn's golden functions on the host, no card; alpamayo.tt.golden); default "
        "$ALPAMAYO_TT_MODE, else device",
    )
    add_quant_args(parser)
    parser.add_argument(
        "--reproducible",
        action="store_true",
        help="compute on one torch and one BLAS thread, so outputs are the same bytes on any thread count, "
        "in-process or on any Ray worker layout (costs the parallel speed-up on CPU; docs/eval.md)",
    )


def add_quant_args(parser: argparse.ArgumentParser) -> None:
    """`--quant`, `--quant-group`, `--quant-head`: the torch backend's weight-only recipe."""
    parser.add_argument(
        "--quant",
        choices=QUANT_MODES,
        default="none",
        help="torch backend: weight-only quantisation of the linears at load (int8 per output channel, int4 "
        "group-wise); with --backend ttnn use --recipe",
    )
    parser.add_argument(
        "--quant-group",
        type=int,
        choices=GROUP_SIZES,
        default=DEFAULT_GROUP_SIZE,
        help=f"--quant int4: input columns per scale and zero (default {DEFAULT_GROUP_SIZE})",
    )
    parser.add_argument(
        "--quant-head", action="store_true", help="--quant: quantise the LM head too (default: model dtype)"
    )
    parser.add_argument(
        "--quant-cache",
        default=None,
        help="--quant: directory for the packed-weight cache, so the next load skips quantising",
    )


def check_quant_backend(args: argparse.Namespace) -> None:
    """ValueError for `add_quant_args`' --quant with --backend ttnn (use --recipe), raised before a command
    reads any input, so every command refuses it alike; a no-op for commands without both flags."""
    if isinstance(getattr(args, "quant", None), str) and hasattr(args, "backend"):
        BackendOptions(args.backend, quant=QuantRecipe(args.quant, args.quant_group, args.quant_head))


def backend_options(args: argparse.Namespace) -> BackendOptions:
    """BackendOptions from `add_model_args`' flags; ValueError for --quant with --backend ttnn."""
    quant = QuantRecipe(args.quant, args.quant_group, args.quant_head)
    return BackendOptions(
        args.backend,
        args.dtype,
        args.device,
        args.recipe,
        args.tt_cache,
        args.moe_config,
        quant,
        args.quant_cache,
        args.tt_mode,
    )


@contextmanager
def text_model(args: argparse.Namespace, cfg: ModelConfig, max_seq_len: int) -> Iterator[Any]:
    """The text backbone of `--backend` with its cache set up for `max_seq_len`; closed on exit (ttnn)."""
    ckpt = Checkpoint(args.checkpoint, cfg.weight_prefix)
    check_checkpoint(ckpt, cfg)
    model = load_text_model(ckpt, cfg, backend_options(args))
    try:
        model.setup_cache(max_seq_len)
        yield model
    finally:
        model.close()


def add_sampling_args(parser: argparse.ArgumentParser, samples: bool = True, seed: bool = True) -> None:
    """How tokens are sampled: `--temperature`, `--top-p`, `--top-k` (each defaulting to the model family's:
    alpamayo.families), with `seed` `--seed`; with `samples` also `--samples` and `--max-reasoning-tokens`."""
    if samples:
        parser.add_argument("--samples", type=int, default=1, help="trajectory samples sharing one prefill")
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 = greedy; default: the model family's (Alpamayo R1 / 1.5 / 2 Super: 0.6; other layouts: 0)",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="nucleus mass; default: the family's (Alpamayo: 0.98, else 1)",
    )
    parser.add_argument(
        "--top-k", type=int, default=None, help="keep the k most probable tokens (default: all)"
    )
    if seed:
        parser.add_argument("--seed", type=int, help="sampling seed (reproducible samples)")
    if samples:
        parser.add_argument("--max-reasoning-tokens", type=int, default=256)
        add_decoder_args(parser)


def add_decoder_args(parser: argparse.ArgumentParser) -> None:
    """The trajectory decoder (`--decoder`) and the action expert's `--flow-steps`, `--flow-temperature`,
    `--nav-guidance` (alpamayo.expert)."""
    parser.add_argument(
        "--decoder",
        choices=DECODERS,
        default=None,
        help="trajectory decoder: the flow-matching action expert (default when the checkpoint has expert "
        "weights, as NVIDIA's releases decode) or the 128 discrete trajectory tokens",
    )
    parser.add_argument(
        "--draft",
        default="none",
        help="speculative draft of the reasoning (same output, fewer weight reads): none, lookup (prompt "
        "lookup), previous (the stream's previous reasoning) or dflash:DIR (a z-lab DFlash draft)",
    )
    parser.add_argument(
        "--flow-steps", type=int, default=None, help="expert: Euler steps (default: the config's, 10)"
    )
    parser.add_argument(
        "--flow-temperature", type=float, default=1.0, help="expert: initial-noise scale (default 1)"
    )
    parser.add_argument(
        "--nav-guidance",
        type=guidance_arg,
        nargs="?",
        const=CHECKPOINT_GUIDANCE,
        default=None,
        metavar="W",
        help="expert: navigation classifier-free guidance, v = (1-W) v_unguided + W v_guided (1 = pure guided, "
        "two expert forwards per step); without W the checkpoint's diffusion_cfg.inference_guidance_weight, "
        "as NVIDIA's Alpamayo 2 Super example runs it; needs a route: --route (replay, profile and eval also "
        "take --route auto and --route-file)",
    )


def guidance_arg(text: str) -> float | str:
    """argparse type of `--nav-guidance`: a weight, or `checkpoint`."""
    try:
        return parse_guidance(text, "--nav-guidance")
    except ValueError as e:
        hint = "; without a weight, follow --nav-guidance with another option or end the command with it"
        raise argparse.ArgumentTypeError(f"{e}{hint}") from None


def flow_settings(args: argparse.Namespace) -> FlowSettings:
    """The action expert's settings from `add_decoder_args`' flags (ValueError naming a bad one)."""
    return FlowSettings(args.flow_steps, args.flow_temperature, args.nav_guidance)


def load_vla(args: argparse.Namespace) -> AlpamayoVLA:
    """The model that `add_model_args` and `add_sampling_args` (with samples) ask for, the sampling overrides
    applied; ValueError before any load for a --samples that the backend or the temperature cannot give."""
    check_num_samples(args.backend, args.samples, args.temperature, args.checkpoint, args.base_model)
    if args.reproducible:
        compute_on_one_thread()
    vla = AlpamayoVLA.from_checkpoint(
        args.checkpoint,
        backend_options(args),
        max_reasoning_tokens=args.max_reasoning_tokens,
        base_model=args.base_model,
        decoder=args.decoder,
        flow=flow_settings(args),
        draft=args.draft,
    )
    vla.sampling = vla.sampling.override(args.temperature, args.top_p, args.top_k)
    return vla


def run_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The settings fields of a run over many units (EvalSettings, ClosedLoopSettings): the checkpoint and
    base model (resolved), the run directory, where it runs (in-process or Ray, workers, CPUs per worker,
    retries) and the progress bar."""
    return dict(
        checkpoint=None if args.checkpoint is None else Path(args.checkpoint).resolve(),
        out=args.out,
        base_model=None if args.base_model is None else Path(args.base_model).resolve(),
        ray=args.ray,
        workers=args.workers,
        cpus_per_worker=args.cpus_per_worker,
        max_retries=args.max_retries,
        progress=not args.no_progress,
    )


def model_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The settings fields (ReplaySettings, EvalSettings) that `add_model_args` (less --checkpoint and
    --base-model), `add_sampling_args` and `add_decoder_args` set, by field name."""
    return dict(
        num_samples=args.samples,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        max_reasoning_tokens=args.max_reasoning_tokens,
        decoder=args.decoder,
        flow=flow_settings(args),
        draft=args.draft,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        recipe=args.recipe,
        tt_cache=args.tt_cache,
        tt_mode=args.tt_mode,
        moe_config=args.moe_config,
        quant=QuantRecipe(args.quant, args.quant_group, args.quant_head),
        quant_cache=args.quant_cache,
        reproducible=args.reproducible,
    )
