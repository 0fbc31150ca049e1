"""The unrounded model's side of `alpamayo precision`: the evaluation rows (`evaluation_ids`: the built-in
driving corpus then the model's greedy continuation), every decoder layer's input and output on them
(`layer_io`), the continuation's logits, the vision tower's outputs on one frame of random pixels, and with a
drive its lock-step run and eval-style minADE; `reference` collects them into a `Reference`, the figure every
recipe is compared with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.loader import model_tokenizer
from alpamayo.config.model import ModelConfig
from alpamayo.demo_checkpoint import CORPUS
from alpamayo.generation import greedy_continue
from alpamayo.numerics import pcc
from alpamayo.precision.drives import EVAL_SEED, DriveRun, drive_run, drive_vla, eval_min_ade
from alpamayo.precision.expert import ExpertRun, expert_run
from alpamayo.precision.settings import Progress, Settings
from alpamayo.text import TextModel
from alpamayo.text.inputs import rope_delta, text_position_ids
from vision.encoder import VisionEncoder

FRAME_GRID = (1, 20, 36)  # one 320 x 576 frame in 16-pixel patches: Alpamayo's model resolution


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


def continuation_logits(model: TextModel, ids: torch.Tensor, n: int) -> torch.Tensor:
    """float32 logits [n, V] of the last n positions of one causal forward of `ids`."""
    model.setup_cache(ids.numel())
    with torch.inference_mode():
        return model.logits(model.prefill_hidden(ids)[-n:])


def top1_agreement(logits: torch.Tensor, continuation: list[int]) -> float:
    """The share of rows of `logits` [n, V] whose argmax is the greedy `continuation` token [n] (teacher-forced
    top-1 agreement)."""
    return float((logits.argmax(-1) == torch.tensor(continuation)).float().mean())


def vision_outputs(encoder: Any) -> list[torch.Tensor]:
    """The image embeddings then each DeepStack level of `encoder` (torch or device) on one `FRAME_GRID` frame
    of uniform random pixels in [-1, 1) (seed 0)."""
    v = encoder.cfg
    grid = torch.tensor([FRAME_GRID])
    pixels = torch.rand(int(grid.prod()), v.patch_dim, generator=torch.Generator().manual_seed(0)) * 2 - 1
    embeds, deepstack = encoder.encode(pixels, grid)
    return [embeds, *deepstack]


def vision_pcc(reference: list[torch.Tensor], encoder: Any) -> float:
    """The worst PCC of `encoder`'s `vision_outputs` against the `reference` ones."""
    return min(pcc(a, b) for a, b in zip(reference, vision_outputs(encoder), strict=True))


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
    logits = continuation_logits(model, ids, settings.tokens)
    expert = expert_run(Checkpoint(directory, cfg.weight_prefix), cfg, model, ids.numel())
    del model
    vision = vision_outputs(VisionEncoder.from_checkpoint(directory, cfg)) if cfg.vision is not None else None
    drive = min_ade = None
    if ticks:
        drive = drive_run(drive_vla(directory, None, cfg, settings), ticks, "float32 reference", progress)
        min_ade = eval_min_ade(directory, cfg, settings, ticks[0], eval_seed, "float32 reference", progress)
    return Reference(
        ids, continuation, io, logits, vision, drive, None if expert is None else expert[0], min_ade
    )
