"""One recipe's figures against the unrounded model's `Reference` (`RecipeReport`), for the two kinds of recipe
`alpamayo precision` compares.

A ttnn recipe (`evaluate_recipe`): the checkpoint's weights are rounded exactly as the device stores them
(`QuantizedCheckpoint`: bf16, and bfp8 / bfp4 through the bit-exact emulation `alpamayo.plan.block_float`), K/V
as the device's cache holds them (`kv_store`), and the torch reference runs with them in float32; its memory is
the DRAM plan on one p150 (`alpamayo.plan.dram.plan_memory`). With `golden`, its device programs' own figures
too (`alpamayo.precision.golden`).

A torch backend weight-only recipe (`evaluate_quant`; `alpamayo.quant`: int8, int4 with its group size) gets the
same figures from the torch backend's own quantised linears (`--quant`, PyTorch's weight-only kernels, float32
activations) on the unrounded checkpoint; its memory is the torch backend's bfloat16 GPU plan at
`eval_samples` rows (`alpamayo.plan.gpu_memory.plan_gpu_memory`, as `alpamayo plan --backend torch` prints it).

Activations stay float32, so the figures isolate the weights' rounding, which is what a recipe chooses. The
models are loaded one at a time: float32 weights of one model fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from alpamayo.backends import TORCH_CPU, BackendOptions
from alpamayo.checkpoint import Checkpoint
from alpamayo.config.expert import expert_config_of
from alpamayo.config.model import ModelConfig
from alpamayo.numerics import pcc
from alpamayo.plan.dram import MemoryPlan
from alpamayo.plan.gpu_memory import GpuPlan, WeightCount, weight_counts
from alpamayo.plan.precision import TENSOR_GROUPS, Precision
from alpamayo.precision.drives import (
    EVAL_SEED,
    drive_figures,
    drive_run,
    drive_vla,
    eval_min_ade,
    min_ade_figures,
)
from alpamayo.precision.expert import ExpertRun, expert_figures, expert_run
from alpamayo.precision.golden import golden_figures
from alpamayo.precision.reference import Reference, continuation_logits, top1_agreement, vision_pcc
from alpamayo.precision.settings import Progress, Settings
from alpamayo.quant import QuantRecipe
from alpamayo.text import TextModel
from alpamayo.tt.quantized import QuantizedCheckpoint, round_to
from vision.encoder import VisionEncoder


@dataclass
class RecipeReport:
    """One recipe's figures against the `Reference`: a row of the report's table, a record of its JSON."""

    recipe: dict[str, Any]  # Precision.to_dict(); a torch recipe: name, backend "torch", dtypes by group
    layer_pcc: list[float]
    logits_pcc: float
    top1_agreement: float
    vision_pcc: float | None  # worst of the embeds and DeepStack levels
    drive: dict[str, float] | None  # token_agreement, ade_drift_m, ade_reference_m, ade_recipe_m, ticks
    dram: dict[str, Any]  # weights_gb, kv_cache_gb, total_gb, fits, fits_on; ttnn: capacity_gb, by group
    expert: dict[str, Any] | None = None  # velocity_pcc per step, velocity_pcc_min, ade_drift_m, v0_mps
    min_ade: dict[str, float] | None = None  # min_ade_m, reference_m, difference_m (eval-style, `drives`)
    # the golden mode's figures: logits_pcc, top1_agreement, vision_pcc, expert_ade_drift_m, drive (as above)
    golden: dict[str, Any] | None = None


def kv_store(precision: Precision) -> Callable[[torch.Tensor], torch.Tensor]:
    """K/V as the device's cache holds them in the recipe's kv_cache dtype (bfp8 blocks run along head_dim).

    The torch reference's prefill attends to its cache, so the teacher-forced forward sees rounded K/V at every
    position, as the device's decode steps do."""
    dtype = precision.dtype("kv_cache")
    return lambda t: round_to(t, dtype).to(t.dtype)


def text_figures(model: TextModel, ref: Reference, settings: Settings) -> tuple[list[float], float, float]:
    """(per-layer PCC, continuation logit PCC, teacher-forced top-1 agreement) of `model` against `ref`."""
    layer_pcc = []
    model.setup_cache(ref.ids.numel())
    cos, sin = model.rope.cos_sin_1d(torch.arange(ref.ids.numel()), model.dtype)
    with torch.inference_mode():
        for layer, (x, y) in zip(model.layers, ref.layer_io, strict=True):
            layer_pcc.append(pcc(y, layer(x[None], cos, sin, model.cache, 0)[0]))
    logits = continuation_logits(model, ref.ids, settings.tokens)
    return layer_pcc, pcc(ref.logits, logits), top1_agreement(logits, ref.continuation)


def _expected_expert(
    run: tuple[ExpertRun, list[float]] | None, directory: Path
) -> tuple[ExpertRun, list[float]]:
    """A recipe's `expert_run` where the reference has one: the checkpoint is the same, so it has the expert."""
    if run is None:
        raise ValueError(f"{directory}: the reference ran an action expert the recipe's checkpoint lacks")
    return run


def _drive_figures(
    directory: Path,
    cfg: ModelConfig,
    ref: Reference,
    settings: Settings,
    ticks: Sequence[Any],
    label: str,
    progress: Progress,
    eval_seed: int,
    weights: QuantizedCheckpoint | None = None,
    store: Callable[[torch.Tensor], torch.Tensor] | None = None,
    options: BackendOptions = TORCH_CPU,
) -> tuple[dict[str, float] | None, dict[str, float] | None]:
    """The recipe's (`weights` with K/V `store`, or `options`) drive figures and eval-style minADE figures
    against `ref`'s; (None, None) without a drive."""
    if ref.drive is None:
        return None, None
    vla = drive_vla(directory, weights, cfg, settings, store, options)
    drive = drive_figures(ref.drive, drive_run(vla, ticks, label, progress))
    got = eval_min_ade(
        directory, cfg, settings, ticks[0], eval_seed, label, progress, weights, store, options
    )
    return drive, min_ade_figures(ref.min_ade, got)


def _dram_figures(memory: MemoryPlan) -> dict[str, Any]:
    """The report's memory figures of a ttnn recipe's p150 DRAM plan (GB)."""
    return {
        "weights_gb": memory.weight_bytes / 1e9,
        "kv_cache_gb": memory.kv_cache / 1e9,
        "total_gb": memory.total / 1e9,
        "capacity_gb": memory.capacity / 1e9,
        "fits": memory.fits,
        "fits_on": "p150" if memory.fits else "NO",
        "weights_by_group_gb": {g: b / 1e9 for g, b in memory.weights.items()},
    }


def evaluate_recipe(
    directory: Path,
    precision: Precision,
    memory: MemoryPlan,
    ref: Reference,
    settings: Settings,
    ticks: Sequence[Any],
    base_model: str | None = None,
    progress: Progress = lambda message: None,
    eval_seed: int = EVAL_SEED,
    golden: bool = False,
) -> RecipeReport:
    """The figures of one ttnn recipe against `ref` (module docstring); `memory` is its DRAM plan; `base_model`
    as `load_model_config` takes it (R1 / 1.5); `progress` hears of each stage; `eval_seed` the drive clip's
    sampling seed; `golden`: also the golden mode's figures (`golden_figures`)."""
    progress(f"recipe {precision.name}: rounded weights, per-layer and logit PCC")
    weights = QuantizedCheckpoint(directory, precision, base_model=base_model)
    cfg = weights.config
    model = TextModel.from_checkpoint(weights, cfg)
    model.kv_store = kv_store(precision)
    layer_pcc, logits_pcc, top1 = text_figures(model, ref, settings)
    expert = None
    if ref.expert is not None:
        run = expert_run(weights, cfg, model, ref.ids.numel(), ref.expert)
        expert = expert_figures(ref.expert, *_expected_expert(run, directory))
    del model
    vision = (
        None if ref.vision is None else vision_pcc(ref.vision, VisionEncoder.from_checkpoint(weights, cfg))
    )
    label, store = f"recipe {precision.name}", kv_store(precision)
    drive, min_ade = _drive_figures(
        directory, cfg, ref, settings, ticks, label, progress, eval_seed, weights, store
    )
    recipe = {**precision.to_dict(), "backend": "ttnn"}
    gold = (
        golden_figures(directory, precision, ref, settings, ticks, base_model, progress) if golden else None
    )
    dram = _dram_figures(memory)
    return RecipeReport(recipe, layer_pcc, logits_pcc, top1, vision, drive, dram, expert, min_ade, gold)


# the dtypes table's groups that are linears of each part `weight_counts` keys
PART_GROUPS = {
    "text": ("qkv", "o", "mlp_gate_up", "mlp_down", "experts"),
    "vision": ("vision",),
    "expert": ("expert",),
}


def quant_dtypes(quant: QuantRecipe, counts: dict[str, WeightCount]) -> dict[str, str]:
    """What a torch recipe holds per tensor group of the dtypes table (the reference's float32 elsewhere);
    `counts`: its `weight_counts` on the CPU in float32, as the command packs it, whose int4 layers at int8
    (`alpamayo.quant.kernels.layer_mode`) each part's groups name: "int4-g128 (12/25 int8)"."""
    base = quant.name.removesuffix("+head")
    dtypes = {**dict.fromkeys(TENSOR_GROUPS, base), "lm_head": base if quant.head else "float32"}
    for part, count in counts.items():
        if count.fallback:
            for group in PART_GROUPS[part]:
                dtypes[group] = f"{base} ({len(count.fallback)}/{count.linears} int8)"
    return {**dtypes, "kv_cache": "float32"}


def _gpu_figures(memory: GpuPlan) -> dict[str, Any]:
    """The report's memory figures of a torch recipe's GPU plan (GB, and the smallest common GPU it fits)."""
    smallest = memory.smallest_gpu_gb
    return {
        "weights_gb": memory.weight_bytes / 1e9,
        "kv_cache_gb": memory.kv_cache / 1e9,
        "total_gb": memory.total / 1e9,
        "fits": smallest is not None,
        "fits_on": "NO" if smallest is None else f"{smallest} GB GPU",
    }


def evaluate_quant(
    directory: Path,
    cfg: ModelConfig,
    quant: QuantRecipe,
    memory: GpuPlan,
    ref: Reference,
    settings: Settings,
    ticks: Sequence[Any],
    progress: Progress = lambda message: None,
    eval_seed: int = EVAL_SEED,
) -> RecipeReport:
    """The figures of the torch backend's weight-only recipe `quant` (its quantised linears at load, float32
    activations on the CPU) against `ref`; `memory` is its GPU plan."""
    label, options = f"recipe {quant.name} (torch)", BackendOptions(quant=quant)
    progress(f"{label}: quantised linears, per-layer and logit PCC")
    model = TextModel.from_checkpoint(directory, cfg, quant=quant)
    layer_pcc, logits_pcc, top1 = text_figures(model, ref, settings)
    expert = None
    if ref.expert is not None:
        source = Checkpoint(directory, cfg.weight_prefix)
        run = expert_run(source, cfg, model, ref.ids.numel(), ref.expert, quant)
        expert = expert_figures(ref.expert, *_expected_expert(run, directory))
    del model
    vision = None
    if ref.vision is not None:
        vision = vision_pcc(ref.vision, VisionEncoder.from_checkpoint(directory, cfg, quant=quant))
    drive, min_ade = _drive_figures(
        directory, cfg, ref, settings, ticks, label, progress, eval_seed, options=options
    )
    counts = weight_counts(cfg, expert_config_of(cfg), quant, torch.float32, "cpu")
    recipe = {"name": quant.name, "backend": "torch", "dtypes": quant_dtypes(quant, counts)}
    return RecipeReport(
        recipe, layer_pcc, logits_pcc, top1, vision, drive, _gpu_figures(memory), expert, min_ade
    )
