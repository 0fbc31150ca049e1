"""What a precision recipe costs, measured on the CPU with the torch reference (`alpamayo precision`).

For each recipe the checkpoint's weights are rounded exactly as the device stores them (`QuantizedCheckpoint`:
bf16, and bfp8 / bfp4 through the bit-exact emulation `alpamayo.plan.block_float`) and the torch reference runs
with them in float32 beside the unrounded model:

  * per-layer PCC: each decoder layer of the rounded model on the unrounded model's input to that layer (the
    layer's own error, not accumulated), over the prompt and continuation rows;
  * final-logit PCC over the continuation positions, and teacher-forced top-1 agreement: the rounded model's
    argmax against the unrounded model's own greedy continuation, fed back token by token (one causal forward
    of prompt + continuation is exactly that);
  * vision tower PCC (image embeddings and every DeepStack level) on one 320x576 frame of random pixels,
    when the model has a vision tower;
  * with a recorded drive: the first ticks predicted in lock step by both models (greedy, 4 frames per
    camera): trajectory token agreement, the ADE between the two 6.4 s trajectories (the drift the recipe
    adds) and each model's ADE to the recorded future;
  * with an action expert in the checkpoint, its per-step velocity PCC and waypoint drift
    (`alpamayo.precision.expert`);
  * the DRAM footprint of the recipe on one p150 (`alpamayo.plan.dram.plan_memory`);
  * with a recorded drive, the minADE difference as `alpamayo eval` computes it for the drive's clip (its
    first tick, `eval_samples` samples at eval's protocol sampling (temperature 0.6, top-p 0.98), the clip's
    seed `clip_seed(id, 0)`, the checkpoint's trajectory decoder): min over samples of the ADE to the
    recorded future at 6.4 s, of the recipe less that of the unrounded model (sampled, so one clip's difference includes sampling noise
    wherever the two models' reasoning tokens part).

The torch backend's weight-only recipes (`alpamayo.quant`: int8, int4 with its group size) get the same
figures from the torch backend's own quantised linears (`--quant`, PyTorch's weight-only kernels, float32
activations) on the unrounded checkpoint, and their memory is the torch backend's bfloat16 GPU plan at
`eval_samples` rows (`alpamayo.plan.gpu_memory.plan_gpu_memory`, as `alpamayo plan --backend torch` prints it).

No ttnn and no card are needed. Activations stay float32, so the figures isolate the weights' rounding, which
is what a recipe chooses; the device's bf16 activations and math fidelity add the error the device tests
measure (tests/test_tt_*_device.py). The models are loaded one at a time: float32 weights of one model fit.

With `golden` (`--golden`, needs ttnn but no card) each ttnn recipe also gets the figures of its device
programs run in the ttnn golden mode (`alpamayo.tt.golden`: ttnn's golden functions on the host, bf16 and
block-float activations and K/V as the device holds them): final-logit PCC and teacher-forced top-1 (the prompt
and the continuation in one device prefill, `prefill_block`, which scores the continuation's rows), vision
tower PCC, the action expert's waypoint drift (its device sampling over the device's cache of those rows
from the same noise) and, with a drive, the trajectory token agreement, ADE drift and ADE of the `--backend ttnn --tt-mode
golden` runtime. Where these part from the emulated figures beside them, the device program computes
something other than the recipe's rounding alone: that is a finding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alpamayo.backends import TORCH_CPU, BackendOptions
from alpamayo.checkpoint import Checkpoint
from alpamayo.config.expert import expert_config_of
from alpamayo.config.loader import load_model_config, model_tokenizer
from alpamayo.config.model import ModelConfig
from alpamayo.demo_checkpoint import CORPUS
from alpamayo.errors import BackendUnavailable
from alpamayo.eval.clips import clip_seed, drive_clip
from alpamayo.families.registry import REFERENCE_SAMPLING
from alpamayo.generation import greedy_continue
from alpamayo.model_spec import ModelSpec
from alpamayo.numerics import pcc
from alpamayo.plan.dram import MemoryPlan, plan_memory
from alpamayo.plan.gpu_memory import GpuPlan, WeightCount, plan_gpu_memory, weight_counts
from alpamayo.plan.precision import TENSOR_GROUPS, Precision, load_precision
from alpamayo.plan.programs.grid import model_name
from alpamayo.precision.expert import ExpertRun, expert_figures, expert_noise, expert_run, waypoint_drift
from alpamayo.quant import QuantRecipe
from alpamayo.text import TextModel
from alpamayo.text.inputs import rope_delta, text_position_ids
from alpamayo.tt.quantized import QuantizedCheckpoint, round_to
from planner.metrics import ade
from vision.encoder import VisionEncoder

FRAME_GRID = (1, 20, 36)  # one 320 x 576 frame in 16-pixel patches: Alpamayo's model resolution


@dataclass(frozen=True)
class Settings:
    """prompt_tokens: corpus tokens before the continuation; tokens: greedy continuation length; ticks,
    max_reasoning_tokens: drive predictions; max_seq_len: KV cache positions of the memory plans; eval_samples:
    samples of the eval-style minADE (alpamayo eval's default K) and rows of the torch GPU plan."""

    prompt_tokens: int = 64
    tokens: int = 32
    ticks: int = 3
    max_reasoning_tokens: int = 16
    max_seq_len: int = 4096
    eval_samples: int = 6

    def validate(self) -> None:
        names = ("prompt_tokens", "tokens", "ticks", "max_reasoning_tokens", "max_seq_len", "eval_samples")
        for name in names:
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


@dataclass
class DriveRun:
    """One model's lock-step predictions: per tick the 128 trajectory token ids, waypoints [64, 3] (t0 ego
    frame, metres) and the recorded future waypoints (None where the recording ends first)."""

    tokens: list[list[int]]
    xyz: list[np.ndarray]
    future: list[np.ndarray | None]


@dataclass
class Reference:
    """What the unrounded model produced: the rows to evaluate and every figure's reference."""

    ids: torch.Tensor  # [P + n - 1] prompt then continuation (the last continuation token is not fed)
    continuation: list[int]  # [n] greedy tokens
    layer_io: list[tuple[torch.Tensor, torch.Tensor]]  # per decoder layer: (input, output) [P + n - 1, H]
    logits: torch.Tensor  # [n, V] at the positions predicting the continuation
    vision: list[torch.Tensor] | None  # image embeds, then each DeepStack level
    drive: DriveRun | None
    expert: ExpertRun | None = None
    min_ade: float | None = None  # eval-style minADE @ 6.4 s on the drive's first tick, metres


@dataclass
class RecipeReport:
    recipe: dict[str, Any]  # Precision.to_dict(); a torch recipe: name, backend "torch", dtypes by group
    layer_pcc: list[float]
    logits_pcc: float
    top1_agreement: float
    vision_pcc: float | None  # worst of the embeds and DeepStack levels
    drive: dict[str, float] | None  # token_agreement, ade_drift_m, ade_reference_m, ade_recipe_m, ticks
    dram: dict[str, Any]  # weights_gb, kv_cache_gb, total_gb, fits, fits_on; ttnn: capacity_gb, by group
    expert: dict[str, Any] | None = None  # velocity_pcc per step, velocity_pcc_min, ade_drift_m, v0_mps
    min_ade: dict[str, float] | None = None  # min_ade_m, reference_m, difference_m (eval-style, see above)
    # the golden mode's figures: logits_pcc, top1_agreement, vision_pcc, expert_ade_drift_m, drive (as above)
    golden: dict[str, Any] | None = None


@torch.inference_mode()
def layer_io(
    model: TextModel, hidden: torch.Tensor, position_ids: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) [L, H] of every decoder layer of a fresh prompt: embeddings `hidden` [L, H] at
    `position_ids` [3, L]. Fills the model's cache (set up for L positions at least) as a prefill would."""
    cos, sin = model.rope.cos_sin(position_ids, model.dtype)
    model.reset()
    out, x = [], hidden.to(model.dtype)[None]
    for layer in model.layers:
        y = layer(x, cos, sin, model.cache, 0)
        out.append((x[0].clone(), y[0].clone()))
        x = y
    model.cache_len, model.rope_delta = hidden.shape[0], rope_delta(position_ids)
    return out


def kv_store(precision: Precision) -> Callable[[torch.Tensor], torch.Tensor]:
    """K/V as the device's cache holds them in the recipe's kv_cache dtype (bfp8 blocks run along head_dim).

    The torch reference's prefill attends to its cache, so the teacher-forced forward sees rounded K/V at every
    position, as the device's decode steps do."""
    dtype = precision.dtype("kv_cache")
    return lambda t: round_to(t, dtype).to(t.dtype)


def _continuation_logits(model: TextModel, ids: torch.Tensor, n: int) -> torch.Tensor:
    """float32 logits [n, V] of the last n positions of one causal forward of `ids`."""
    model.setup_cache(ids.numel())
    with torch.inference_mode():
        return model.logits(model.prefill_hidden(ids)[-n:])


def _vision(encoder: VisionEncoder) -> list[torch.Tensor]:
    v = encoder.cfg
    grid = torch.tensor([FRAME_GRID])
    pixels = torch.rand(int(grid.prod()), v.patch_dim, generator=torch.Generator().manual_seed(0)) * 2 - 1
    embeds, deepstack = encoder.encode(pixels, grid)
    return [embeds, *deepstack]


Progress = Callable[[str], None]


def _drive_run(vla: Any, ticks: Sequence[Any], label: str, progress: Progress) -> DriveRun:
    """The drive's ticks through `vla`; `progress` hears of each answered tick (a drive tick of a real model
    on the CPU takes tens of seconds)."""
    run = DriveRun([], [], [])
    for i, tick in enumerate(ticks):
        start = time.perf_counter()
        frames = {c: [f.rgb() for f in fs] for c, fs in tick.frames.items()}
        (sample,) = vla.predict(frames, tick.ego_history, frame_times_ns=tick.frame_times_ns).samples
        progress(f"{label}: drive tick {i + 1}/{len(ticks)} in {time.perf_counter() - start:.1f} s")
        run.tokens.append(list(sample.token_ids))
        run.xyz.append(sample.xyz)
        run.future.append(None if tick.future is None else tick.future[0])
    return run


def _vla(
    directory: Path,
    weights: QuantizedCheckpoint | None,
    cfg: ModelConfig,
    settings: Settings,
    store: Callable[[torch.Tensor], torch.Tensor] | None = None,
    options: BackendOptions = TORCH_CPU,
) -> Any:
    """The torch AlpamayoVLA (float32, CPU; `options` may quantise it) on the directory's weights, or on
    `weights` with K/V `store`; it decodes the trajectory tokens."""
    from alpamayo.runtime import AlpamayoVLA, planner_config
    from alpamayo.vlm import VisionLanguageModel
    from planner.pipeline import Planner

    vlm = VisionLanguageModel.from_checkpoint(directory, options, weights=weights, cfg=cfg)
    vlm.text.kv_store = store
    planner = Planner.from_config(planner_config(vlm.config), model_tokenizer(vlm.config))
    return AlpamayoVLA(vlm, planner, max_reasoning_tokens=settings.max_reasoning_tokens)


EVAL_SEED = 0  # alpamayo eval's default --seed
EVAL_HORIZON_S = 6.4


def eval_min_ade(
    directory: Path,
    cfg: ModelConfig,
    settings: Settings,
    tick: Any,
    seed: int,
    label: str,
    progress: Progress,
    weights: QuantizedCheckpoint | None = None,
    store: Callable[[torch.Tensor], torch.Tensor] | None = None,
    options: BackendOptions = TORCH_CPU,
) -> float | None:
    """minADE @ 6.4 s of `tick` as `alpamayo eval` scores a clip (`alpamayo.replay.accuracy.tick_errors` over
    `settings.eval_samples` samples from `seed` at eval's protocol sampling `REFERENCE_SAMPLING`, the
    checkpoint's trajectory decoder);
    None where the recording ends before the tick's future does."""
    from alpamayo.replay.accuracy import error_key, tick_errors
    from alpamayo.runtime import AlpamayoVLA

    if tick.future is None:
        return None
    spec = ModelSpec(checkpoint=directory, max_reasoning_tokens=settings.max_reasoning_tokens)
    vla = AlpamayoVLA.from_spec(spec, options=options, weights=weights, cfg=cfg)
    vla.vlm.text.kv_store = store
    start = time.perf_counter()
    frames = {c: [f.rgb() for f in fs] for c, fs in tick.frames.items()}
    prediction = vla.predict(
        frames,
        tick.ego_history,
        num_samples=settings.eval_samples,
        seed=seed,
        frame_times_ns=tick.frame_times_ns,
        sampling=REFERENCE_SAMPLING,
    )
    progress(f"{label}: eval tick, {settings.eval_samples} samples in {time.perf_counter() - start:.1f} s")
    errors = tick_errors(np.stack([s.xyz for s in prediction.samples]), tick.future[0])
    return None if errors is None else errors[error_key("min_ade", EVAL_HORIZON_S)]


def _min_ade_figures(ref: Reference, got: float | None) -> dict[str, float] | None:
    if ref.min_ade is None or got is None:
        return None
    return {"min_ade_m": got, "reference_m": ref.min_ade, "difference_m": got - ref.min_ade}


def drive_ticks(
    path: str | Path,
    count: int,
    warn: Callable[[str], None],
    layout: str | Path | None = None,
    pai_dir: str | Path | None = None,
    cameras: Sequence[int] | None = None,
) -> list[Any]:
    """The first `count` ticks of a recorded drive of any kind (`bridges.drives.open_drive`, with the YAML
    topic `layout` of an MCAP drive; the source stays open while its frames are decoded, and closes when
    collected)."""
    from alpamayo.replay.ticks import TickAssembler
    from bridges.drives import open_drive
    from bridges.drives.recording import RecordingLayout

    mapping = None if layout is None else RecordingLayout.load(layout)
    source = open_drive(path, mapping, pai_dir=pai_dir, cameras=cameras, warn=warn)
    ticks = list(islice(TickAssembler(source, warn=warn), count))
    if not ticks:
        raise ValueError(f"{path}: no tick has 4 frames per camera and 1.5 s of ego history")
    return ticks


def evaluation_ids(cfg: ModelConfig, prompt_tokens: int) -> torch.Tensor:
    """The first `prompt_tokens` tokens of the built-in driving corpus in the tokenizer of the model `cfg`."""
    ids = model_tokenizer(cfg)(CORPUS.read_text(), add_special_tokens=False)["input_ids"]
    if len(ids) < prompt_tokens:
        raise ValueError(f"prompt-tokens {prompt_tokens}: the corpus has only {len(ids)} tokens")
    return torch.tensor(ids[:prompt_tokens])


def reference(
    directory: Path,
    cfg: ModelConfig,
    settings: Settings,
    ticks: Sequence[Any],
    progress: Progress,
    eval_seed: int = EVAL_SEED,
) -> Reference:
    """Everything the unrounded float32 model (`cfg`, as `load_model_config` read it) contributes to the comparison;
    `progress` hears of each stage."""
    progress("float32 reference: teacher-forced logits and per-layer inputs")
    model = TextModel.from_checkpoint(directory, cfg)
    prompt = evaluation_ids(cfg, settings.prompt_tokens)
    model.setup_cache(prompt.numel() + settings.tokens)
    continuation = greedy_continue(model, model.prefill(prompt), settings.tokens)
    ids = torch.cat([prompt, torch.tensor(continuation[:-1], dtype=torch.long)])
    model.setup_cache(ids.numel())
    io = layer_io(model, model.embed(ids), text_position_ids(ids.numel()))
    logits = _continuation_logits(model, ids, settings.tokens)
    expert = expert_run(Checkpoint(directory, cfg.weight_prefix), cfg, model, ids.numel())
    del model
    vision = _vision(VisionEncoder.from_checkpoint(directory, cfg)) if cfg.vision is not None else None
    drive = min_ade = None
    if ticks:
        drive = _drive_run(_vla(directory, None, cfg, settings), ticks, "float32 reference", progress)
        min_ade = eval_min_ade(directory, cfg, settings, ticks[0], eval_seed, "float32 reference", progress)
    return Reference(
        ids, continuation, io, logits, vision, drive, None if expert is None else expert[0], min_ade
    )


def _drive_figures(ref: DriveRun, run: DriveRun) -> dict[str, float]:
    with_future = [i for i, f in enumerate(ref.future) if f is not None]
    tokens = [
        np.mean([a == b for a, b in zip(x, y, strict=True)])
        for x, y in zip(ref.tokens, run.tokens, strict=True)
    ]
    figures = {
        "ticks": len(ref.tokens),
        "token_agreement": float(np.mean(tokens)),
        "ade_drift_m": float(np.mean([ade(b, a) for a, b in zip(ref.xyz, run.xyz, strict=True)])),
    }
    if with_future:
        figures["ade_reference_m"] = float(np.mean([ade(ref.xyz[i], ref.future[i]) for i in with_future]))
        figures["ade_recipe_m"] = float(np.mean([ade(run.xyz[i], ref.future[i]) for i in with_future]))
    return figures


def golden_figures(
    directory: Path,
    precision: Precision,
    ref: Reference,
    settings: Settings,
    ticks: Sequence[Any],
    base_model: str | None = None,
    progress: Progress = lambda message: None,
) -> dict[str, Any]:
    """The recipe's figures as its device programs compute them in the ttnn golden mode (module docstring)."""
    from alpamayo.runtime import AlpamayoVLA
    from alpamayo.tt.device import close_device, open_device
    from alpamayo.tt.expert import TTActionExpert
    from alpamayo.tt.text import TTTextModel
    from alpamayo.tt.vision import TTVisionEncoder

    label = f"recipe {precision.name} (golden mode)"
    progress(f"{label}: teacher-forced logits on the device programs")
    cfg = load_model_config(directory, base_model)
    device = open_device(0, mode="golden")
    try:
        with TTTextModel.from_checkpoint(directory, cfg, precision=precision, device=device) as text:
            expert = None
            if ref.expert is not None:  # before the cache: it reserves the expert's rows
                source = Checkpoint(directory, cfg.weight_prefix)
                expert = TTActionExpert.from_checkpoint(source, text, expert_config_of(cfg))
            text.setup_cache(ref.ids.numel())
            prompt = ref.ids.numel() - settings.tokens + 1
            logits = text.prefill_block(ref.ids[:prompt], drafted=ref.ids[prompt:])
            drift = None
            if expert is not None and ref.expert is not None:  # over the prompt rows, as `expert_run`
                actions = expert.sample(expert_noise(), ref.ids.numel(), text.rope_delta)
                drift = waypoint_drift(actions, ref.expert)
                expert.close()
            vision = None
            if ref.vision is not None:
                encoder = TTVisionEncoder.from_checkpoint(directory, cfg, precision=precision, device=device)
                vision = min(pcc(a, b) for a, b in zip(ref.vision, _vision(encoder), strict=True))
                encoder.close()
    finally:
        close_device(device)
    figures: dict[str, Any] = {
        "logits_pcc": pcc(ref.logits, logits),
        "top1_agreement": float((logits.argmax(-1) == torch.tensor(ref.continuation)).float().mean()),
        "vision_pcc": vision,
        "expert_ade_drift_m": drift,
        "drive": None,
    }
    if ref.drive is not None:
        spec = ModelSpec(
            checkpoint=directory,
            base_model=base_model,
            decoder="tokens",
            max_reasoning_tokens=settings.max_reasoning_tokens,
        )
        vla = AlpamayoVLA.from_spec(spec, options=BackendOptions("ttnn", recipe=precision, tt_mode="golden"))
        try:
            figures["drive"] = _drive_figures(ref.drive, _drive_run(vla, ticks, label, progress))
        finally:
            vla.close()
    return figures


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
    """The figures of one recipe against `ref` (see module docstring); `memory` is its DRAM plan; `base_model`
    as `load_model_config` takes it (R1 / 1.5); `progress` hears of each stage; `eval_seed` the drive clip's
    sampling seed; `golden`: also the golden mode's figures (`golden_figures`)."""
    progress(f"recipe {precision.name}: rounded weights, per-layer and logit PCC")
    weights = QuantizedCheckpoint(directory, precision, base_model=base_model)
    cfg = weights.config
    model = TextModel.from_checkpoint(weights, cfg)
    model.kv_store = kv_store(precision)
    layer_pcc, logits_pcc, top1 = _text_figures(model, ref, settings)
    expert = None
    if ref.expert is not None:
        run, pccs = expert_run(weights, cfg, model, ref.ids.numel(), ref.expert)
        expert = expert_figures(ref.expert, run, pccs)
    del model
    vision = None
    if ref.vision is not None:
        got = _vision(VisionEncoder.from_checkpoint(weights, cfg))
        vision = min(pcc(a, b) for a, b in zip(ref.vision, got, strict=True))
    drive = min_ade = None
    if ref.drive is not None:
        label, store = f"recipe {precision.name}", kv_store(precision)
        vla = _vla(directory, weights, cfg, settings, store)
        drive = _drive_figures(ref.drive, _drive_run(vla, ticks, label, progress))
        got = eval_min_ade(directory, cfg, settings, ticks[0], eval_seed, label, progress, weights, store)
        min_ade = _min_ade_figures(ref, got)
    dram = {
        "weights_gb": memory.weight_bytes / 1e9,
        "kv_cache_gb": memory.kv_cache / 1e9,
        "total_gb": memory.total / 1e9,
        "capacity_gb": memory.capacity / 1e9,
        "fits": memory.fits,
        "fits_on": "p150" if memory.fits else "NO",
        "weights_by_group_gb": {g: b / 1e9 for g, b in memory.weights.items()},
    }
    recipe = {**precision.to_dict(), "backend": "ttnn"}
    gold = (
        golden_figures(directory, precision, ref, settings, ticks, base_model, progress) if golden else None
    )
    return RecipeReport(recipe, layer_pcc, logits_pcc, top1, vision, drive, dram, expert, min_ade, gold)


def _text_figures(model: TextModel, ref: Reference, settings: Settings) -> tuple[list[float], float, float]:
    """(per-layer PCC, continuation logit PCC, teacher-forced top-1 agreement) of `model` against `ref`."""
    layer_pcc = []
    model.setup_cache(ref.ids.numel())
    cos, sin = model.rope.cos_sin_1d(torch.arange(ref.ids.numel()), model.dtype)
    with torch.inference_mode():
        for layer, (x, y) in zip(model.layers, ref.layer_io, strict=True):
            layer_pcc.append(pcc(y, layer(x[None], cos, sin, model.cache, 0)[0]))
    logits = _continuation_logits(model, ref.ids, settings.tokens)
    top1 = float((logits.argmax(-1) == torch.tensor(ref.continuation)).float().mean())
    return layer_pcc, pcc(ref.logits, logits), top1


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
    layer_pcc, logits_pcc, top1 = _text_figures(model, ref, settings)
    expert = None
    if ref.expert is not None:
        source = Checkpoint(directory, cfg.weight_prefix)
        run, pccs = expert_run(source, cfg, model, ref.ids.numel(), ref.expert, quant)
        expert = expert_figures(ref.expert, run, pccs)
    del model
    vision = None
    if ref.vision is not None:
        got = _vision(VisionEncoder.from_checkpoint(directory, cfg, quant=quant))
        vision = min(pcc(a, b) for a, b in zip(ref.vision, got, strict=True))
    drive = min_ade = None
    if ref.drive is not None:
        vla = _vla(directory, None, cfg, settings, options=options)
        drive = _drive_figures(ref.drive, _drive_run(vla, ticks, label, progress))
        got = eval_min_ade(directory, cfg, settings, ticks[0], eval_seed, label, progress, options=options)
        min_ade = _min_ade_figures(ref, got)
    smallest = memory.smallest_gpu_gb
    dram = {
        "weights_gb": memory.weight_bytes / 1e9,
        "kv_cache_gb": memory.kv_cache / 1e9,
        "total_gb": memory.total / 1e9,
        "fits": smallest is not None,
        "fits_on": "NO" if smallest is None else f"{smallest} GB GPU",
    }
    counts = weight_counts(cfg, expert_config_of(cfg), quant, torch.float32, "cpu")
    recipe = {"name": quant.name, "backend": "torch", "dtypes": quant_dtypes(quant, counts)}
    return RecipeReport(recipe, layer_pcc, logits_pcc, top1, vision, drive, dram, expert, min_ade)


@dataclass
class PrecisionReport:
    checkpoint: str
    model: str
    settings: Settings
    drive: str | None
    recipes: list[RecipeReport]

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "model": self.model,
            "settings": asdict(self.settings),
            "drive": self.drive,
            "recipes": [asdict(r) for r in self.recipes],
        }

    def table(self) -> str:
        s = self.settings
        head = (
            f"precision plan: {self.model}, prompt {s.prompt_tokens} + {s.tokens} greedy tokens, "
            f"memory at max_seq_len {s.max_seq_len}"
        )
        if self.drive is not None:
            head += f", drive {Path(self.drive).name} ({self.recipes[0].drive['ticks']} ticks)"
        cols = ["recipe", "backend", "layer PCC min", "logits PCC", "top-1", "vision PCC"]
        cols += ["traj tokens", "ADE drift m", "ADE m"] if self.drive is not None else []
        expert = self.recipes[0].expert is not None
        cols += ["expert v PCC min", "expert ADE drift m"] if expert else []
        min_ade = any(r.min_ade is not None for r in self.recipes)
        cols += [f"minADE m (K={s.eval_samples})", "minADE diff m"] if min_ade else []
        cols += ["memory GB", "fits on"]
        rows = []
        for r in self.recipes:
            row = [
                r.recipe["name"],
                r.recipe["backend"],
                f"{min(r.layer_pcc):.6f}",
                f"{r.logits_pcc:.6f}",
                f"{100 * r.top1_agreement:.1f}%",
                "-" if r.vision_pcc is None else f"{r.vision_pcc:.6f}",
            ]
            if r.drive is not None:
                d = r.drive
                row += [f"{100 * d['token_agreement']:.1f}%", f"{d['ade_drift_m']:.3f}"]
                row += [
                    f"{d['ade_recipe_m']:.3f} ({d['ade_reference_m']:.3f})" if "ade_recipe_m" in d else "-"
                ]
            if r.expert is not None:
                row += [f"{r.expert['velocity_pcc_min']:.6f}", f"{r.expert['ade_drift_m']:.3f}"]
            if min_ade:
                m = r.min_ade
                row += (
                    ["-", "-"]
                    if m is None
                    else [
                        f"{m['min_ade_m']:.3f} ({m['reference_m']:.3f})",
                        f"{m['difference_m']:+.3f}",
                    ]
                )
            row += [f"{r.dram['total_gb']:.3f}", r.dram["fits_on"]]
            rows.append(row)
            if r.golden is not None:
                rows.append(_golden_row(r, cols))
        lines = [head, *_columns([cols, *rows])]
        lines.append("per-layer PCC (each layer on the unrounded model's input to it):")
        layers = [["layer", *(r.recipe["name"] for r in self.recipes)]]
        layers += [
            [str(i), *(f"{r.layer_pcc[i]:.6f}" for r in self.recipes)]
            for i in range(len(self.recipes[0].layer_pcc))
        ]
        lines += ["  " + line for line in _columns(layers)]
        if expert:
            lines.append(
                f"action expert velocity PCC per Euler step (at the float32 expert's x_k; waypoint drift "
                f"rolled out at {self.recipes[0].expert['v0_mps']:.0f} m/s):"
            )
            steps = [["step", *(r.recipe["name"] for r in self.recipes)]]
            steps += [
                [str(k), *(f"{r.expert['velocity_pcc'][k]:.6f}" for r in self.recipes)]
                for k in range(len(self.recipes[0].expert["velocity_pcc"]))
            ]
            lines += ["  " + line for line in _columns(steps)]
        dtypes = [["group", *(r.recipe["name"] for r in self.recipes)]]
        dtypes += [
            [g, *(r.recipe["dtypes"][g] for r in self.recipes)] for g in self.recipes[0].recipe["dtypes"]
        ]
        lines.append("dtypes:")
        lines += ["  " + line for line in _columns(dtypes)]
        if self.drive is not None:
            lines.append(
                "ADE m: the recipe's ADE to the recorded future (the unrounded model's in parentheses)"
            )
        if min_ade:
            lines.append(
                f"minADE m: as alpamayo eval scores the drive's clip (first tick, K={s.eval_samples} samples at "
                "temperature 0.6, top-p 0.98, the clip's seed, the checkpoint's trajectory decoder): min over samples "
                "of the ADE at 6.4 s (the unrounded model's in parentheses); minADE diff m: recipe less unrounded"
            )
        if any(r.golden is not None for r in self.recipes):
            lines.append(
                "ttnn golden: the recipe's device programs run in the ttnn golden mode (ttnn's golden functions "
                "on the host, bf16 / block-float activations and K/V as on the device; alpamayo.tt.golden): "
                "logits and top-1 teacher-forced in one device prefill, the drive through --tt-mode golden."
            )
        lines += [
            "reference: the unrounded checkpoint in float32 on the CPU (torch reference).",
            "ttnn: emulated, weights rounded bit-exactly as the p150 stores them (alpamayo.plan.block_float), "
            "K/V to the recipe's kv_cache dtype, run by the torch reference in float32 (no card); memory: "
            "the p150 DRAM plan (alpamayo plan), fits on: the p150.",
            "torch: run, the torch backend's --quant linears (PyTorch's weight-only kernels "
            "_weight_int8pack_mm / _weight_int4pack_mm_for_cpu) with float32 activations on the CPU; memory: "
            f"the bfloat16 GPU plan at K={s.eval_samples} (alpamayo plan --backend torch), fits on: the "
            "smallest common GPU.",
        ]
        return "\n".join(lines)


def _golden_row(r: RecipeReport, cols: list[str]) -> list[str]:
    """The table row of a recipe's golden-mode figures, "-" in the columns the golden mode does not fill."""
    g = r.golden or {}
    cells = {
        "recipe": r.recipe["name"],
        "backend": "ttnn golden",
        "logits PCC": f"{g['logits_pcc']:.6f}",
        "top-1": f"{100 * g['top1_agreement']:.1f}%",
        "vision PCC": "-" if g["vision_pcc"] is None else f"{g['vision_pcc']:.6f}",
    }
    if g.get("expert_ade_drift_m") is not None:
        cells["expert ADE drift m"] = f"{g['expert_ade_drift_m']:.3f}"
    if (d := g.get("drive")) is not None:
        cells["traj tokens"] = f"{100 * d['token_agreement']:.1f}%"
        cells["ADE drift m"] = f"{d['ade_drift_m']:.3f}"
        if "ade_recipe_m" in d:
            cells["ADE m"] = f"{d['ade_recipe_m']:.3f} ({d['ade_reference_m']:.3f})"
    return [cells.get(c, "-") for c in cols]


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def precision_report(
    directory: str | Path,
    recipes: Sequence[str | Precision],
    settings: Settings = Settings(),
    drive: str | Path | None = None,
    warn: Callable[[str], None] = print,
    layout: str | Path | None = None,
    pai_dir: str | Path | None = None,
    cameras: Sequence[int] | None = None,
    base_model: str | Path | None = None,
    progress: Progress = lambda message: None,
    quants: Sequence[str | QuantRecipe] = (),
    golden: bool = False,
) -> PrecisionReport:
    """Compare `recipes` on the checkpoint in `directory` (and on `drive`, a recorded drive: MCAP path, with a
    YAML topic `layout` where its topics are not the default ones, or `pai:CLIP[@T0_US]` with `pai_dir`); R1 / 1.5 read their base model from `base_model` where given (see
    `alpamayo.config.loader.load_model_config`). `quants`: the torch backend's weight-only recipes to
    compare too (`QuantRecipe.parse` names: int8, int4, int4-g32, ...). `golden`: the ttnn recipes' golden-mode
    figures too (`golden_figures`; needs ttnn, refused before any model runs without it)."""
    settings.validate()
    directory = Path(directory)
    precisions = [load_precision(r) for r in recipes]
    quant_recipes = [q if isinstance(q, QuantRecipe) else QuantRecipe.parse(q) for q in quants]
    if not precisions and not quant_recipes:
        raise ValueError("no recipe to compare: give --recipe and/or --quant")
    for q in quant_recipes:
        if not q.enabled:
            raise ValueError("--quant none is the reference itself; give int8, int4 or int4-gGROUP")
    if golden and precisions:
        from alpamayo.tt.device import device_unavailable_reason

        if (reason := device_unavailable_reason(mode="golden")) is not None:
            raise BackendUnavailable(f"--golden: {reason}")
    cfg = load_model_config(directory, base_model)
    # planned first: a model the device layouts cannot hold (PlanError) is refused before any model runs
    plans = [plan_memory(cfg, p, settings.max_seq_len) for p in precisions]
    expert_cfg = expert_config_of(cfg)
    gpu_plans = [
        plan_gpu_memory(
            cfg,
            expert_cfg,
            q,
            torch.bfloat16,
            settings.max_seq_len,
            settings.eval_samples,
            settings.prompt_tokens,
            0,
            False,
        )
        for q in quant_recipes
    ]
    ticks = drive_ticks(drive, settings.ticks, warn, layout, pai_dir, cameras) if drive is not None else []
    seed = clip_seed(drive_clip(drive).clip_id, EVAL_SEED) if drive is not None else EVAL_SEED
    ref = reference(directory, cfg, settings, ticks, progress, seed)
    reports = [
        evaluate_recipe(directory, p, plan, ref, settings, ticks, cfg.base_model, progress, seed, golden)
        for p, plan in zip(precisions, plans, strict=True)
    ]
    reports += [
        evaluate_quant(directory, cfg, q, plan, ref, settings, ticks, progress, seed)
        for q, plan in zip(quant_recipes, gpu_plans, strict=True)
    ]
    return PrecisionReport(
        str(directory), model_name(cfg), settings, None if drive is None else str(drive), reports
    )
