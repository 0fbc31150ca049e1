"""Which implementation runs the model: the torch reference (CPU/CUDA) or ttnn (one Blackhole p150).

Both backends satisfy one typed contract (`alpamayo.contract`): the text backbone (`TextBackbone`), the
vision tower (`VisionTower`) and the action expert's trajectory decoder (`TrajectoryDecoder`). On ttnn all
three run on the one device the text model opens; everything else stays on the host and is shared. The ttnn
backend is imported only when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.expert import ExpertConfig, expert_config_of
from alpamayo.config.flow import DEFAULT_FLOW, FlowSettings
from alpamayo.config.loader import checkpoint_family, load_shape_config
from alpamayo.config.model import ModelConfig
from alpamayo.contract import TextBackbone, TrajectoryDecoder, VisionTower
from alpamayo.devices import parse_dtype, resolve_device
from alpamayo.drafts import MODEL_FREE_BLOCK, Draft, check_draft_spec, load_draft
from alpamayo.drafts.dflash import read_config
from alpamayo.expert.decoding import ExpertDecoder
from alpamayo.expert.weights import has_expert_weights
from alpamayo.prediction import FUTURE_STEPS
from alpamayo.quant.cache import PackedWeightCache
from alpamayo.quant.recipe import NO_QUANT, QuantRecipe

if TYPE_CHECKING:
    from alpamayo.plan.precision import Precision
    from alpamayo.tt.text import TTTextModel

BACKENDS = ("torch", "ttnn")


class TorchLoadArgs(TypedDict):
    """The keyword arguments every torch loader (text, vision, expert) takes from `BackendOptions`."""

    dtype: torch.dtype
    device: torch.device
    quant: QuantRecipe
    quant_cache: PackedWeightCache | None


@dataclass(frozen=True)
class BackendOptions:
    """backend: "torch" or "ttnn"; dtype/device: the torch backend's; recipe: the ttnn precision recipe
    (`accuracy`, `performance`, a YAML file or a loaded `Precision`); tt_cache: directory of the ttnn packed-weight cache;
    moe_config: the ttnn MoE block config YAML (default: `alpamayo.config.builtin.block_config_for`); quant: the
    torch backend's weight-only quantisation (`alpamayo.quant.QuantRecipe`; ttnn chooses with `recipe`);
    quant_cache: directory of its packed-weight cache (`alpamayo.quant.cache`; None: quantise every load);
    tt_mode: the ttnn backend's mode (`alpamayo.tt.device.tt_mode`: "device", or "golden" for every device
    program through ttnn's golden functions on the host, no card; None: `ALPAMAYO_TT_MODE`, else "device")."""

    backend: str = "torch"
    dtype: torch.dtype | str = torch.float32
    device: str | torch.device = "cpu"
    recipe: str | Precision = "performance"
    tt_cache: str | Path | None = None
    moe_config: str | Path | None = None
    quant: QuantRecipe = NO_QUANT
    quant_cache: str | Path | None = None
    tt_mode: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if self.tt_mode is not None:
            from alpamayo.tt.device import tt_mode  # mode names only: no ttnn import

            tt_mode(self.tt_mode)
        if self.backend == "ttnn" and self.quant.enabled:
            raise ValueError(
                f"--quant {self.quant.mode} is the torch backend's; with --backend ttnn choose the precision "
                "with --recipe (accuracy, performance or a recipe YAML: bfp8 / bfp4 weights)"
            )

    def torch_load_args(self) -> TorchLoadArgs:
        """dtype, resolved device, quantisation and its packed-weight cache in `quant_cache` (None without one
        or without `quant`), as the torch loaders' keyword arguments."""
        cache = (
            None
            if self.quant_cache is None or not self.quant.enabled
            else PackedWeightCache(self.quant_cache)
        )
        return TorchLoadArgs(
            dtype=self.torch_dtype,
            device=resolve_device(self.device),
            quant=self.quant,
            quant_cache=cache,
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)

    @property
    def precision(self) -> str:
        """What the outputs record as the run's precision: the ttnn recipe, or the torch dtype's name."""
        if self.backend == "ttnn":
            return self.recipe if isinstance(self.recipe, str) else self.recipe.name
        dtype = str(self.torch_dtype).removeprefix("torch.")
        return f"{dtype}+{self.quant.name}" if self.quant.enabled else dtype


TORCH_CPU = BackendOptions()  # the default everywhere: the torch reference, float32, on the CPU


def check_num_samples(
    backend: str,
    num_samples: int,
    temperature: float | None,
    checkpoint: str | Path | None = None,
    base_model: str | Path | None = None,
) -> None:
    """ValueError, worded for the command line, for K > 1 trajectory samples that cannot be drawn: with greedy
    decoding (temperature 0; None: the default of `checkpoint`'s model family, read from its config.json)
    they would all be one sample, and ttnn decodes at most 16 (the device expert's samples per step; the K
    rows of its decode program are one tile of 32), and one row on a model with MoE layers (read from the
    checkpoint's shape config, with `base_model` for R1 / 1.5). Callers check before loading: otherwise the
    refusal comes after the weights are loaded (and, on ttnn, uploaded)."""
    if num_samples <= 1:
        return
    from alpamayo.plan.programs.expert import MAX_EXPERT_SAMPLES  # plans only: no ttnn import
    from alpamayo.plan.programs.text import check_decode_rows

    if backend == "ttnn" and num_samples > MAX_EXPERT_SAMPLES:
        raise ValueError(
            f"--samples {num_samples} with --backend ttnn: the device action expert runs 1.."
            f"{MAX_EXPERT_SAMPLES} samples per step; allowed: 1..{MAX_EXPERT_SAMPLES}"
        )
    if temperature is None and checkpoint is not None:
        temperature = checkpoint_family(checkpoint).sampling.temperature  # config.json only
    if temperature == 0:
        raise ValueError(
            f"--samples {num_samples} with greedy decoding (--temperature 0) would repeat one sample; "
            "pass --temperature > 0 (Alpamayo samples at 0.6)"
        )
    if backend == "ttnn" and checkpoint is not None:
        text = load_shape_config(checkpoint, base_model).text  # config files only: no weights, no device
        try:
            check_decode_rows(num_samples, bool(text.sparse_layers))
        except ValueError as e:
            raise ValueError(f"--samples {num_samples} with --backend ttnn: {e}") from None


def load_text_model(source: Checkpoint, cfg: ModelConfig, options: BackendOptions) -> TextBackbone:
    """The text backbone of `options.backend`, weights from `source` (validated against `cfg`). On ttnn the
    device it opens also gets the trace region of the checkpoint's action expert, if it has one."""
    if options.backend == "ttnn":
        from alpamayo.plan.precision import load_precision
        from alpamayo.plan.programs.expert import plan_expert
        from alpamayo.tt.text import TTTextModel

        expert = expert_config_of(cfg)
        extra = 0
        if expert is not None and has_expert_weights(source, expert):
            extra = plan_expert(cfg, expert, load_precision(options.recipe), 1).trace_region_bytes
        return TTTextModel.from_checkpoint(
            source,
            cfg,
            precision=options.recipe,
            cache_dir=options.tt_cache,
            moe=options.moe_config,
            extra_trace_bytes=extra,
            mode=options.tt_mode,
        )
    from alpamayo.text import TextModel

    return TextModel.from_checkpoint(source, cfg, **options.torch_load_args())


def load_vision_encoder(
    source: Checkpoint, cfg: ModelConfig, options: BackendOptions, text: TextBackbone
) -> VisionTower:
    """The vision tower of `options.backend`; on ttnn it shares the device of the loaded `text` backbone."""
    if options.backend == "ttnn":
        from alpamayo.tt.vision import TTVisionEncoder

        return TTVisionEncoder.from_checkpoint(
            source, cfg, precision=options.recipe, device=_tt_text(text).device, cache_dir=options.tt_cache
        )
    from vision.encoder import VisionEncoder

    return VisionEncoder.from_checkpoint(source, cfg, **options.torch_load_args())


def load_expert_decoder(
    source: Checkpoint,
    cfg: ModelConfig,
    options: BackendOptions,
    text: TextBackbone,
    settings: FlowSettings = DEFAULT_FLOW,
    n_tokens: int = FUTURE_STEPS,
) -> TrajectoryDecoder:
    """The flow-matching trajectory decoder of `options.backend` over the loaded `text` backbone: the torch
    `ExpertDecoder`, or on ttnn a `TTExpertDecoder` whose expert shares the text model's device and cache
    (same `context(text, prompt_len, plans)` / `sample(ctx, seed, noise, unguided, tracer)` contract).
    `n_tokens`: the torch expert's action tokens per sample (the action space's waypoints; ttnn decodes 64).
    ValueError when the checkpoint has no expert."""
    expert = expert_config_of(cfg)
    if expert is None or not has_expert_weights(source, expert):
        raise ValueError(f"{source.directory}: the checkpoint has no action expert; use the tokens decoder")
    if options.backend == "ttnn":
        from alpamayo.tt.expert import TTActionExpert, TTExpertDecoder

        return TTExpertDecoder(
            TTActionExpert.from_checkpoint(source, _tt_text(text), expert, options.tt_cache), settings
        )
    from alpamayo.expert.decoding import ExpertDecoder
    from alpamayo.expert.weights import load_expert

    model = load_expert(source, expert, cfg.text, n_tokens=n_tokens, **options.torch_load_args())
    return ExpertDecoder(model, settings)


def check_expert_settings(expert: ExpertConfig, settings: FlowSettings, options: BackendOptions) -> None:
    """ValueError, before any weight is read, for flow settings that this checkpoint's expert
    (`ExpertDecoder.check_settings`) or the backend's decoder cannot run (ttnn: no navigation guidance)."""
    ExpertDecoder.check_settings(expert, settings)
    if options.backend == "ttnn":
        from alpamayo.tt.expert import TTExpertDecoder  # plans only: no ttnn import

        TTExpertDecoder.check_settings(settings)


def check_draft(draft: str, cfg: ModelConfig, options: BackendOptions) -> None:
    """ValueError, before any weight is read, for a draft (`alpamayo.drafts`: none, lookup, previous,
    dflash:DIR) that cannot run beside `cfg`'s text backbone on `options.backend`: a DFlash draft's config
    against the target's (on ttnn also the device's limits), and on ttnn its verify blocks as rows of the
    decode program, which the device MoE cannot route."""
    check_draft_spec(draft)
    block = MODEL_FREE_BLOCK
    if draft.startswith("dflash:"):
        where = draft[len("dflash:") :]
        draft_cfg = read_config(where)
        draft_cfg.check_target(cfg.text, where)
        block = draft_cfg.block_size
        if options.backend == "ttnn":
            from alpamayo.tt.draft import check_device_draft

            check_device_draft(draft_cfg, cfg.text, where)
    if options.backend == "ttnn" and draft != "none":
        from alpamayo.plan.programs.text import check_decode_rows  # plans only: no ttnn import

        try:
            check_decode_rows(block, bool(cfg.text.sparse_layers))
        except ValueError as e:
            raise ValueError(f"--draft {draft} with --backend ttnn: its verify blocks are {e}") from None


def load_draft_model(draft: str, options: BackendOptions, text: TextBackbone) -> Draft | None:
    """The draft `draft` names for the loaded `text` backbone (None for `none`): on ttnn a DFlash draft's
    layers go to the text model's device (`TTDFlashDraft`), every other draft runs on the host."""
    if draft.startswith("dflash:") and options.backend == "ttnn":
        from alpamayo.tt.draft import TTDFlashDraft

        return TTDFlashDraft.load(draft[len("dflash:") :], _tt_text(text))
    return load_draft(draft, text)


def _tt_text(text: TextBackbone) -> TTTextModel:
    """`text` as the ttnn backbone whose device the other ttnn models share; TypeError for a torch one."""
    from alpamayo.tt.text import TTTextModel

    if not isinstance(text, TTTextModel):
        raise TypeError(
            f"the ttnn models run on the device of a ttnn text backbone, got {type(text).__name__}"
        )
    return text
